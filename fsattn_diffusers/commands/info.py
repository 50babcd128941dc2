"""``fsattn info``: versions, devices and which backends are usable here (and why not)."""

from __future__ import annotations

import importlib
import importlib.util
import platform
import re

import torch

NAME = "info"
HELP = "print versions, devices and the attention backends usable here"


def add_arguments(p) -> None:
    p.add_argument("--device", default=None, help="device to check backends for (default: cuda if present, else cpu)")


def _version(mod: str, must_import: bool) -> str:
    """Installed version; ``must_import`` also imports it (xfuser, for one, refuses a CPU-only torch) and
    says when an installed package fails to import."""
    from importlib import metadata

    from ..notices import import_report

    try:
        version = metadata.version({"aiter": "amd-aiter"}.get(mod, mod))
    except metadata.PackageNotFoundError:
        version = None  # AITER built from source may carry no distribution metadata
    if not must_import:
        return version or "not installed"
    if version is None and importlib.util.find_spec(mod) is None:
        return "not installed"
    error, _ = import_report(mod)
    if error is not None:
        return f"{version + ': ' if version else ''}installed but fails to import ({_one_line(error)})"
    return version or "installed"


#: What this package takes from torchao: its float8 API, for ``fsattn e2e --gemms fp8`` only. Its optional C++
#: extensions (``_C_mxfp8``, ...) play no part, so whether they load is not reported.
TORCHAO_USED = ("torchao.quantization", ("Float8DynamicActivationFloat8WeightConfig", "PerRow", "quantize_"))


def _torchao() -> str:
    """torchao as far as it affects this package: whether the float8 API ``fsattn e2e --gemms fp8`` uses imports."""
    import sys

    from ..notices import import_report

    version = _version("torchao", False)
    if version == "not installed":
        return "not installed (only fsattn e2e --gemms fp8 uses it)"
    module, names = TORCHAO_USED
    error, _ = import_report(module)
    if error is not None:
        return f"{version}: its float8 API fails to import ({_one_line(error)}); fsattn e2e --gemms fp8 needs it"
    missing = [n for n in names if not hasattr(sys.modules[module], n)]
    if missing:
        return f"{version}: {module} has no {', '.join(missing)}; fsattn e2e --gemms fp8 needs them"
    return f"{version} (float8 API for fsattn e2e --gemms fp8: imports)"


def _short(text: str, limit: int = 140) -> str:
    """``text`` on one line with directories dropped from paths, cut to ``limit`` characters."""
    text = re.sub(r"(?<![\w.])/(?:[^\s/:]+/)+", "", " ".join(text.split()))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _one_line(exc: BaseException) -> str:
    return _short(f"{type(exc).__name__}: {exc}")


def run(args) -> int:
    from .. import __version__
    from ..backends import auto_order, availability
    from ..cli import usable_device

    device = usable_device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"fsattn-diffusers {__version__}  python {platform.python_version()}  torch {torch.__version__}")
    for mod, must_import in (("triton", True), ("diffusers", False), ("transformers", False), ("xfuser", True),
                             ("aiter", True)):
        print(f"  {mod:<13}{_version(mod, must_import)}")
    print(f"  {'torchao':<13}{_torchao()}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            print(f"  cuda:{i}       {torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]})")
    else:
        print("  cuda         no CUDA device")
    print(f"backends for {device}:")
    usable = availability(device)
    for name, why in usable.items():
        print(f"  {name:<10}{'usable' if why is None else 'not usable: ' + why}")
    order = auto_order()
    first = next((name for name in order if usable[name] is None), None)
    print(f"  auto      tries {', '.join(order)}: {first or 'none'} here")
    return 0
