"""String-valued modes.

:class:`Mode` is the base of every enum whose members stand for a mode named by a string: the operand formats and
scale rules (:mod:`fsattn_diffusers.formats`), the exponential, proxy, numerics target and key order
(:mod:`fsattn_diffusers.recipe`), the grid softmax's training options (:mod:`fsattn_diffusers.training`). A member
*is* its string (a ``str`` subclass), so JSON records, CLI arguments, dictionary keys and code that compares against
the strings (the kernels' plan) see the plain value.
"""

from __future__ import annotations

import enum


class Mode(str, enum.Enum):
    """A mode named by a string. A member compares, hashes, formats, prints and serializes as its value, so
    ``Recipe(numerics="mi355x").numerics == "mi355x"`` and ``{"mi355x": 1}[Numerics.MI355X] == 1``."""

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def values(cls) -> tuple:
        """The members' strings, in definition order (for ``choices=`` and error messages)."""
        return tuple(m.value for m in cls)

    @classmethod
    def parse(cls, value, what: str) -> "Mode":
        """``value`` (a member or its string) as a member of this mode.

        Raises
        ------
        ValueError
            One line: ``{what}={value!r} is not supported; accepted: <the members' strings>``.
        """
        try:
            return cls(value)
        except (ValueError, TypeError):
            raise ValueError(f"{what}={value!r} is not supported; accepted: {', '.join(cls.values())}") from None


__all__ = ["Mode"]
