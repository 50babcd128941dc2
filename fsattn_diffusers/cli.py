"""``fsattn`` command line: one module per subcommand under :mod:`fsattn_diffusers.commands`.

Each command module exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.
User errors are raised as :class:`UsageError` and printed as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile

COMMANDS = ("generate", "accuracy", "info", "bench", "e2e", "sweep", "capture", "sensitivity")


class UsageError(Exception):
    """A bad argument or input: printed as one line, exit code 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fsattn", description="Fused-Softmax quantized attention for video diffusion")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"fsattn_diffusers.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"fsattn_diffusers.commands.{name}":
                raise
            continue
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def usable_device(text: str):
    """``torch.device(text)`` after allocating on it; :class:`UsageError` (one line) when it is not usable here."""
    import torch

    try:
        device = torch.device(text)
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--device {text!r} is not usable here ({reason}); accepted: cpu"
                         f"{', cuda' if torch.cuda.is_available() else ''} or another device this torch has") from None
    return device


def check_prompt(text: str, flag: str = "--prompt") -> str:
    """The prompt without surrounding whitespace; :class:`UsageError` (one line) when nothing is left."""
    if text is None or not str(text).strip():
        raise UsageError(f"{flag} {text!r} has no text; accepted: a text describing the video")
    return str(text).strip()


def check_output_path(path: str, flag: str, *, folder: bool) -> None:
    """:class:`UsageError` (one line) unless ``path`` can be written, checked before any model work.

    Parameters
    ----------
    path : str
        A file to write (``folder=False``; missing folders on the way are created) or a folder to create or
        write into (``folder=True``).
    flag : str
        The argument's name in the message (``"--out"``).
    folder : bool
        Whether ``path`` is a folder.

    Refused: an empty path; a folder where a file goes or a file where a folder goes; a path under a file; a
    path whose deepest existing folder takes no new file (tried by creating and removing a probe file there).
    """
    if not path or not str(path).strip():
        raise UsageError(f"{flag} is empty; accepted: a {'folder' if folder else 'file'} path")
    full = os.path.abspath(path)
    if folder and os.path.exists(full) and not os.path.isdir(full):
        raise UsageError(f"{flag} {path} exists and is not a folder; accepted: a folder (created when missing)")
    if not folder and os.path.isdir(full):
        raise UsageError(f"{flag} {path} is a folder; accepted: a file path")
    if not folder and os.path.exists(full) and not os.access(full, os.W_OK):
        raise UsageError(f"{flag} {path} exists and is not writable")
    existing = full if folder else os.path.dirname(full)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{flag} {path} lies under {existing}, which is a file; accepted: a path in a folder")
    try:
        handle, probe = tempfile.mkstemp(prefix=".fsattn-write-check-", dir=existing)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {existing} ({exc.strerror or exc}); accepted: a path in "
                         f"a writable folder") from None
    os.close(handle)
    os.remove(probe)


def main(argv=None) -> int:
    from .notices import one_line_warnings, quiet_third_party

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        # fsattn warnings print as one line; torchao's import-time notes (via diffusers) stay out of the output
        with one_line_warnings(f"fsattn {args.command}"), quiet_third_party():
            return int(args._run(args) or 0)
    except UsageError as exc:
        print(f"fsattn {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # our validation errors are one-line ValueErrors
        print(f"fsattn {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # run through the package module so UsageError is one class
    from fsattn_diffusers.cli import main as _main

    sys.exit(_main())
