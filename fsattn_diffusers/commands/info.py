"""``fsattn info``: versions, devices and which backends are usable here (and why not)."""

from __future__ import annotations

import importlib
import platform

import torch

NAME = "info"
HELP = "print versions, devices and the attention backends usable here"


def add_arguments(p) -> None:
    p.add_argument("--device", default=None, help="device to check backends for (default: cuda if present, else cpu)")


def _version(mod: str, must_import: bool) -> str:
    """Installed version; ``must_import`` also imports it (xfuser, for one, refuses a CPU-only torch)."""
    from importlib import metadata

    try:
        version = metadata.version({"aiter": "amd-aiter"}.get(mod, mod))
    except metadata.PackageNotFoundError:
        version = None  # AITER built from source may carry no distribution metadata
    if must_import:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError:
            return "not installed" if version is None else f"{version}, not importable"
        except Exception as exc:  # noqa: BLE001 - report whatever stops the import
            return f"{version or 'installed'}, not usable ({type(exc).__name__})"
        return version or "installed"
    return version or "not installed"


def run(args) -> int:
    from .. import __version__
    from ..backends import availability

    print(f"fsattn-diffusers {__version__}  python {platform.python_version()}  torch {torch.__version__}")
    for mod, must_import in (("triton", True), ("diffusers", False), ("transformers", False), ("xfuser", True),
                             ("aiter", True), ("torchao", False)):
        print(f"  {mod:<13}{_version(mod, must_import)}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            print(f"  cuda:{i}       {torch.cuda.get_device_name(i)} (sm_{cap[0]}{cap[1]})")
    else:
        print("  cuda         no CUDA device")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    print(f"backends for {device}:")
    for name, why in availability(device).items():
        print(f"  {name:<10}{'usable' if why is None else 'not usable: ' + why}")
    return 0
