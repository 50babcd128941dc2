"""A CPU stand-in for the ``sageattention`` package (tests only), written to a folder as a real package.

:func:`install` writes ``sageattention/`` (and, when asked, distribution metadata) under a folder, puts that folder
first on ``sys.path`` and imports it, so that ``sageattention.__file__``, ``importlib.metadata`` and the sm90 kernel
module behave as with the real packages:

* ``kind="2"``: SageAttention 2 as ``build_sm90.sh`` builds it: ``sageattn`` and ``sageattn_qk_int8_pv_fp8_cuda_sm90``
  (the one ``sageattn`` calls here; with ``return_lse`` also the natural-log LSE (B, H, S_q) in FP32, whatever the
  layout), the other entries diffusers imports (so that a fresh process's ``import diffusers`` accepts its ``sage``
  backend, as with the real build), the kernel module ``sageattention/_qattn_sm90.py``;
* ``kind="1"``: SageAttention 1.0.6 (PyPI, Triton): ``sageattn`` only, no ``return_lse``.

``sageattn`` computes exact attention in FP32 (output in the input dtype) and appends its arguments to the package's
``CALLS``.
"""

from __future__ import annotations

import importlib
import os
import sys

_BODY = '''
import torch

CALLS = []
KIND = {kind!r}


def _attend(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, with_lse=False, **kwargs):
    assert not is_causal and tensor_layout in ("HND", "NHD")
    CALLS.append(dict(q=q, k=k, v=v, tensor_layout=tensor_layout, sm_scale=sm_scale, **kwargs))
    if tensor_layout == "NHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scale = sm_scale if sm_scale is not None else q.shape[-1] ** -0.5
    s = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) * scale
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, dim=-1), v.float()).to(q.dtype)
    out = out.transpose(1, 2) if tensor_layout == "NHD" else out
    return (out, torch.logsumexp(s, dim=-1)) if with_lse else out
'''

_SAGE2 = '''
from . import _qattn_sm90  # noqa: F401  (the CUDA extension of the real build)


def sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None,
                                      return_lse=False, **kwargs):
    return _attend(q, k, v, tensor_layout, is_causal, sm_scale, with_lse=return_lse, entry="sm90", **kwargs)


def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, return_lse=False, **kwargs):
    return sageattn_qk_int8_pv_fp8_cuda_sm90(q, k, v, tensor_layout, is_causal, sm_scale, return_lse)


def _other_entry(*args, **kwargs):
    raise NotImplementedError("the stand-in runs sageattn / sageattn_qk_int8_pv_fp8_cuda_sm90 only")


sageattn_qk_int8_pv_fp8_cuda = sageattn_qk_int8_pv_fp16_cuda = sageattn_qk_int8_pv_fp16_triton = _other_entry
sageattn_varlen = _other_entry
'''

_SAGE1 = '''

def sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=None, smooth_k=True, **kwargs):
    return _attend(q, k, v, tensor_layout, is_causal, sm_scale, entry="triton")
'''


def write_package(root, kind: str = "2", dist_version=None) -> str:
    """Write the stand-in package under ``root`` (with ``sageattention-<dist_version>.dist-info`` when given)."""
    pkg = os.path.join(str(root), "sageattention")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as fh:
        fh.write(_BODY.format(kind=kind) + (_SAGE2 if kind == "2" else _SAGE1))
    if kind == "2":
        with open(os.path.join(pkg, "_qattn_sm90.py"), "w") as fh:
            fh.write("# stands in for the sm90 CUDA extension\n")
    if dist_version is not None:
        write_dist(root, dist_version)
    return pkg


def write_dist(root, version: str) -> None:
    """``sageattention-<version>.dist-info/METADATA`` under ``root`` (as build_sm90.sh and pip write it)."""
    info = os.path.join(str(root), f"sageattention-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: sageattention\nVersion: {version}\n")


def forget(monkeypatch) -> None:
    """Drop every imported ``sageattention`` module (restored by ``monkeypatch`` at the test's end)."""
    for name in [n for n in sys.modules if n == "sageattention" or n.startswith("sageattention.")]:
        monkeypatch.delitem(sys.modules, name)


def install(monkeypatch, root, kind: str = "2", dist_version="2.2.0+d1a57a5"):
    """Write the package under ``root``, put ``root`` first on ``sys.path`` and import it; returns the module."""
    write_package(root, kind, dist_version)
    forget(monkeypatch)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    module = importlib.import_module("sageattention")
    monkeypatch.setitem(sys.modules, "sageattention", module)
    return module


def hide(monkeypatch) -> None:
    """Make ``import sageattention`` fail (as on a machine without it)."""
    forget(monkeypatch)
    monkeypatch.setitem(sys.modules, "sageattention", None)


def refuse_in_diffusers(monkeypatch) -> None:
    """What diffusers decides when it is imported with a SageAttention older than it needs (1.0.6): its ``sage``
    backend refused. diffusers decides once, at its own import: a test that runs after another imported it beside the
    SageAttention 2 stand-in would otherwise see that decision."""
    from diffusers.models import attention_dispatch as ad

    monkeypatch.setattr(ad, "_CAN_USE_SAGE_ATTN", False)


def accept_in_diffusers(monkeypatch, module) -> None:
    """What diffusers decides when it is imported with SageAttention 2 installed: its ``sage`` backend usable, calling
    ``module.sageattn`` (diffusers imports the entries once, at its own import)."""
    from diffusers.models import attention_dispatch as ad

    monkeypatch.setattr(ad, "_CAN_USE_SAGE_ATTN", True)
    monkeypatch.setattr(ad, "sageattn", module.sageattn)
