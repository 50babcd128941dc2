"""String-valued modes: :class:`Mode`, the base of every enum whose members stand for a mode named by a string
(formats, scale rules, numerics targets, key orders)."""

from __future__ import annotations

import enum


class Mode(str, enum.Enum):
    """A mode named by a string. A member is that string: it compares, hashes, formats and prints as its value, so
    ``Recipe(numerics="sm90").numerics == "sm90"`` and code written against the strings keeps working."""

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


__all__ = ["Mode"]
