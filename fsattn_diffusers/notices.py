"""What fsattn prints besides results: its own warnings, and other packages' import-time noise.

* :class:`FSAttnWarning` (a ``RuntimeWarning``) is the category of every fsattn warning; :func:`warn`
  attributes it to the first frame outside fsattn and the libraries that call it (torch, diffusers, ...),
  so Python's warning line names the user's code, never an fsattn source line. :func:`warn_once` is the one
  once-per-process form (per key) that every module uses.
* :func:`one_line_warnings` (used by the command-line tools) prints fsattn warnings as one line
  ``"<prog>: warning: <message>"`` above a running progress bar.
* :func:`quiet_third_party` keeps the warnings of a few named third-party loggers (collected, not
  printed) whose import-time messages are not about the user's command (torchao's C++ extensions that do not load on a CPU-only or
  other-version torch, torch's pytree deprecation notes about torchao's enums, diffusers' note that
  torchao's tensor classes could not be imported); :func:`import_report` says what they reported.
* :func:`filter_known_noise` (installed by ``import fsattn_diffusers``, so API scripts and the ``measure``
  modules get it too) drops, for the whole process, only the WARNING records of :data:`KNOWN_NOISE`: those
  import-time notes, and diffusers' context-parallel note that Wan's 1-D timestep is not split (it is not
  meant to be). Other records of those loggers, and every other logger, are untouched.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import re
import sys
import warnings
from typing import Dict, Iterator, List, Optional, Tuple

#: Module-name roots whose frames are never "the caller" of an fsattn warning.
_LIBRARY_ROOTS = frozenset({"fsattn_diffusers", "torch", "diffusers", "transformers", "accelerate", "xfuser",
                            "tqdm", "contextlib", "functools", "runpy", "importlib", "threading"})
#: Loggers whose WARNING records at import time are noise for our commands (not ours, not the user's).
THIRD_PARTY_LOGGERS = ("torchao", "torch.utils._pytree", "diffusers.quantizers.torchao.torchao_quantizer")


#: (logger, message pattern) of the WARNING records that :func:`filter_known_noise` drops.
KNOWN_NOISE = (
    ("torchao", r"Failed to load \S+\.(so|pyd|dll)\b"),  # C++ extensions built for another torch / CUDA
    ("torch.utils._pytree", r"is an Enum subclass and is now natively supported by torch\.compile"),
    ("diffusers.quantizers.torchao.torchao_quantizer", r"Unable to import `torchao` Tensor objects"),
    ("diffusers.hooks.context_parallel",
     r"Expected input tensor to have 2 dimensions, but got 1 dimensions, split will not be applied"),
)


class _KnownNoise(logging.Filter):
    """Drops the WARNING records of one logger whose message matches one of ``patterns``."""

    def __init__(self, patterns):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record):
        if _COLLECTING[0] or record.levelno != logging.WARNING:
            return True
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


_COLLECTING = [0]  # > 0 while quiet_third_party collects: then the records go to its report instead


def filter_known_noise() -> None:
    """Install the :data:`KNOWN_NOISE` filters on their loggers (once per process; later calls do nothing)."""
    by_logger: Dict[str, List[str]] = {}
    for name, pattern in KNOWN_NOISE:
        by_logger.setdefault(name, []).append(pattern)
    for name, patterns in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _KnownNoise) for f in logger.filters):
            logger.addFilter(_KnownNoise(patterns))


class FSAttnWarning(RuntimeWarning):
    """A warning from fsattn (a fallback backend, a schedule that leaves a recipe unused, ...)."""


def caller_stacklevel() -> int:
    """``stacklevel`` for the ``warnings.warn`` call of the function that calls this one.

    Counts frames outward from that function until one belongs to a module outside
    :data:`_LIBRARY_ROOTS` (the user's script or notebook cell); the outermost frame when all are inside.
    """
    frame = sys._getframe(2)  # the caller of that function (stacklevel 2)
    level, outermost = 2, 2  # level 1 is the frame of the function that calls warnings.warn
    while frame is not None:
        if not _inside(frame):
            return level
        outermost = level
        frame, level = frame.f_back, level + 1
    return outermost


def _inside(frame) -> bool:
    name = str(frame.f_globals.get("__name__", ""))
    if name == "__main__":  # ``python -m fsattn_diffusers...`` runs our module as __main__
        name = str(getattr(frame.f_globals.get("__spec__"), "name", "") or "")
    return name.split(".")[0] in _LIBRARY_ROOTS


def warn(message: str, category: type = FSAttnWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the user's frame (see :func:`caller_stacklevel`)."""
    warnings.warn(message, category, stacklevel=caller_stacklevel())


#: Keys of the :func:`warn_once` warnings already emitted in this process (tests clear entries to see one again).
_WARNED: set = set()


def warn_once(key: str, message: str) -> None:
    """Emit ``message`` once per process for ``key``, as an :class:`FSAttnWarning` attributed to the user's code
    (:func:`warn`); not while ``torch.compile`` traces (a warning would break the graph; the eager calls of the
    same run emit it)."""
    if key in _WARNED:
        return
    import torch

    if not torch.compiler.is_compiling():
        _WARNED.add(key)
        warnings.warn(message, FSAttnWarning, stacklevel=caller_stacklevel())


@contextlib.contextmanager
def one_line_warnings(prog: str) -> Iterator[None]:
    """Inside, an :class:`FSAttnWarning` prints as ``"<prog>: warning: <message>"`` (one line on stderr,
    written through tqdm so a progress bar is not split); other warnings print as usual."""
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, FSAttnWarning):
            text = " ".join(str(message).split())
            text = text[len("fsattn: "):] if text.startswith("fsattn: ") else text
            try:
                from tqdm import tqdm

                tqdm.write(f"{prog}: warning: {text}", file=sys.stderr)
            except ImportError:
                print(f"{prog}: warning: {text}", file=sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def quiet_third_party(collect: Optional[List[Tuple[str, str]]] = None) -> Iterator[None]:
    """Inside, WARNING records of :data:`THIRD_PARTY_LOGGERS` are collected instead of printed; ERROR and
    above are passed on (printed as usual) on the way out.

    ``collect``, when given, receives ``(logger name, message)`` of every silenced record.
    """
    saved: Dict[str, Tuple[int, bool]] = {}
    handler = _Collect()
    for name in THIRD_PARTY_LOGGERS:
        logger = logging.getLogger(name)
        saved[name] = (logger.level, logger.propagate)
        logger.setLevel(logging.WARNING)
        logger.propagate = False  # records go to our collector only
        logger.addHandler(handler)
    _COLLECTING[0] += 1
    try:
        yield
    finally:
        _COLLECTING[0] -= 1
        for name, (level, propagate) in saved.items():
            logger = logging.getLogger(name)
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate
        if collect is not None:
            collect.extend((r.name, r.getMessage()) for r in handler.records if r.levelno < logging.ERROR)
        for record in handler.records:  # errors are the user's business: pass them on
            if record.levelno >= logging.ERROR:
                logging.getLogger(record.name).handle(record)


def import_report(module: str) -> Tuple[Optional[BaseException], List[str]]:
    """Import ``module`` quietly; return the exception that stopped it (or ``None``) and the
    one-line messages its import logged on :data:`THIRD_PARTY_LOGGERS`."""
    collected: List[Tuple[str, str]] = []
    error: Optional[BaseException] = None
    with quiet_third_party(collected):
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - the caller reports whatever stops the import
            error = exc
    return error, [" ".join(msg.split()) for _, msg in collected]
