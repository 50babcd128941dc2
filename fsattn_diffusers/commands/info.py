"""``fsattn info``: versions, devices and which backends are usable here (and why not)."""

from __future__ import annotations

import importlib
import platform

import torch

NAME = "info"
HELP = "print versions, devices and the attention backends usable here"


def add_arguments(p) -> None:
    p.add_argument("--device", default=None, help="device to check backends for (default: cuda if present, else cpu)")


def _version(mod: str) -> str:
    try:
        return getattr(importlib.import_module(mod), "__version__", "installed")
    except Exception as exc:  # noqa: BLE001 - report whatever stops the import
        return f"not usable ({type(exc).__name__})"


def run(args) -> int:
    from .. import __version__
    from ..backends import availability

    print(f"fsattn-diffusers {__version__}  python {platform.python_version()}  torch {torch.__version__}")
    for mod in ("triton", "diffusers", "transformers", "xfuser", "aiter", "torchao"):
        print(f"  {mod:<13}{_version(mod)}")
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
