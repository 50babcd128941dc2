"""SageAttention as a baseline: which one is importable here, and its call on (B, H, S, D) tensors.

Not a backend of :func:`fsattn_diffusers.attention` (nothing is registered): ``fsattn bench`` and the structured
suite call ``sageattention.sageattn`` directly, and the ``sage`` policy selects diffusers' own ``"sage"`` attention
backend (``set_attention_backend``), the way a diffusers user does.

Two packages answer ``import sageattention``:

* SageAttention 2 built from source (thu-ml/SageAttention; ``shared/baselines/sageattention/build_sm90.sh`` builds
  d1a57a5 for sm90): ``sageattn`` dispatches on sm90 to ``sageattn_qk_int8_pv_fp8_cuda_sm90`` (INT8 Q/K, FP8 P/V),
  whose CUDA kernels are the extension ``sageattention._qattn_sm90``.
* SageAttention 1.0.6 from PyPI (Triton kernels, INT8 Q/K, FP16 P/V): ``sageattn`` only.

:func:`sage_identity` says which one was imported from the module itself (its file, its sm90 entry and kernel
module, the distribution metadata found beside it), not from ``importlib.metadata`` alone: a PyPI 1.0.6 left in
site-packages beside a source build on ``PYTHONPATH`` makes ``importlib.metadata.version`` report 1.0.6 while the
imported module is SageAttention 2 (and diffusers, which checks that metadata, then refuses its ``sage`` backend).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib import metadata
from typing import Dict, Optional

SAGE_MODULE = "sageattention"
#: SageAttention 2's Hopper entry (INT8 Q/K, FP8 P/V) and the extension module holding its kernels (SageAttention's
#: own names).
HOPPER_ENTRY = "sageattn_qk_int8_pv_fp8_cuda_sm90"
HOPPER_KERNELS = "sageattention._qattn_sm90"
#: The script of ``shared/baselines/sageattention/`` that builds SageAttention 2 for Hopper (``bash SCRIPT DEST``);
#: the device scripts run it from that folder carried as ``.sage/`` (scripts/device_env.sh).
BUILD_SCRIPT = "build_sm90.sh"
INSTALL_HINT = ("pip install sageattention (1.0.6, Triton) or build SageAttention 2 from source for Hopper "
                f"(thu-ml/SageAttention at d1a57a5: shared/baselines/sageattention/{BUILD_SCRIPT} DEST, then "
                "PYTHONPATH=DEST); either needs an NVIDIA GPU")
#: diffusers' ``sage`` backend checks the installed distribution's version against this (diffusers 0.42).
DIFFUSERS_MIN_VERSION = "2.1.1"


def sage_module():
    """The imported ``sageattention`` module (raises the import's own exception when absent).

    Read from ``sys.modules`` once imported (a dict lookup, which ``torch.compile`` traces)."""
    module = sys.modules.get(SAGE_MODULE)
    return module if module is not None else importlib.import_module(SAGE_MODULE)


def sage_missing() -> Optional[str]:
    """One line saying why ``sageattention`` is not importable here, with how to install it; ``None`` when it is."""
    try:
        sage_module()
    except Exception as exc:  # ImportError, or an OSError / RuntimeError from a CUDA extension on a CPU-only machine
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"sageattention is not importable ({type(exc).__name__}: {first}); {INSTALL_HINT}"
    return None


def _dist_beside(package_dir: str) -> Optional[metadata.Distribution]:
    """The ``sageattention`` distribution whose metadata lies in the folder that holds the imported package."""
    parent = os.path.dirname(package_dir)
    for dist in metadata.distributions(path=[parent]):
        if (dist.metadata.get("Name") or "").lower().replace("_", "-") == SAGE_MODULE:
            return dist
    return None


def _metadata_version():
    """``(version, folder)`` of the first ``sageattention`` distribution on ``sys.path`` (what diffusers checks)."""
    for dist in metadata.distributions():
        if (dist.metadata.get("Name") or "").lower().replace("_", "-") == SAGE_MODULE:
            where = getattr(dist, "_path", None)
            return dist.version, (str(where.parent) if where is not None else None)
    return None, None


def _has_hopper_kernels(module) -> bool:
    if HOPPER_KERNELS in sys.modules:
        return True
    try:
        return importlib.util.find_spec(HOPPER_KERNELS) is not None
    except (ImportError, ValueError):
        return False


def sage_identity(module=None) -> Optional[Dict]:
    """Which SageAttention is imported here, from the module itself; ``None`` when none is importable.

    Parameters
    ----------
    module : module, optional
        The ``sageattention`` module (default: :func:`sage_module`).

    Returns
    -------
    dict
        ``path`` (the module's ``__file__``), ``kind`` (``"SageAttention 2"`` when the sm90 entry exists, else
        ``"SageAttention 1"``), ``sm90_entry`` and ``sm90_kernels`` (whether :data:`HOPPER_ENTRY` and
        :data:`HOPPER_KERNELS` exist), ``version`` (the module's ``__version__``, else the distribution
        metadata in the folder holding the imported package, else None), ``metadata_version`` /
        ``metadata_path`` (what ``importlib.metadata`` reports: the first distribution on ``sys.path``),
        ``metadata_mismatch`` (that report names another version than the module's, or there is none beside the
        module) and ``label`` (one line for reports).
    """
    if module is None:
        try:
            module = sage_module()
        except Exception:  # noqa: BLE001 - absent: no identity
            return None
    path = os.path.abspath(getattr(module, "__file__", None) or "")
    package_dir = os.path.dirname(path)
    version = getattr(module, "__version__", None)
    if version is None:
        dist = _dist_beside(package_dir)
        version = dist.version if dist is not None else None
    meta_version, meta_path = _metadata_version()
    sm90_entry = callable(getattr(module, HOPPER_ENTRY, None))
    sm90_kernels = _has_hopper_kernels(module)
    kind = "SageAttention 2" if sm90_entry else "SageAttention 1"
    if sm90_entry:
        detail = (f"sm90 kernel {HOPPER_ENTRY}: INT8 Q/K, FP8 P/V" if sm90_kernels else
                  f"built without the sm90 kernels ({HOPPER_KERNELS} absent): sageattn fails on sm90")
    else:
        detail = "Triton kernels: INT8 Q/K, FP16 P/V"
    mismatch = meta_version is not None and meta_version != version
    label = f"{kind} {version or '(version unknown: no distribution metadata beside the module)'}, {detail}; " \
            f"imported from {package_dir}"
    if mismatch:
        label += (f"; importlib.metadata reports sageattention {meta_version} (from {meta_path}), not the imported "
                  "module")
    return {"path": path, "kind": kind, "version": version, "sm90_entry": sm90_entry, "sm90_kernels": sm90_kernels,
            "metadata_version": meta_version, "metadata_path": meta_path, "metadata_mismatch": mismatch,
            "label": label}


def require_sage(what: str) -> Dict:
    """The identity of the importable SageAttention; a one-line ValueError naming ``what`` needs it otherwise."""
    why = sage_missing()
    if why is not None:
        raise ValueError(f"{what} needs SageAttention: {why}")
    return sage_identity()


def sage_call(q, k, v, scale: Optional[float] = None):
    """``sageattn`` on (B, H, S, D) ``q, k, v`` (``tensor_layout="HND"``, non-causal), output (B, H, S_q, D).

    Both packages take ``tensor_layout``, ``is_causal`` and ``sm_scale`` (1.0.6 has no ``return_lse``)."""
    out = sage_module().sageattn(q, k, v, tensor_layout="HND", is_causal=False, sm_scale=scale)
    return out[0] if isinstance(out, (tuple, list)) else out


def diffusers_refusal(identity: Optional[Dict] = None) -> Optional[str]:
    """Why diffusers' ``sage`` backend refuses here (one line), or ``None`` when it accepts.

    diffusers decides when ``diffusers.models.attention_dispatch`` is first imported, from ``importlib.metadata``'s
    version (>= :data:`DIFFUSERS_MIN_VERSION`) and an import of the SageAttention 2 entries."""
    from diffusers.models import attention_dispatch as ad

    try:
        ad._check_attention_backend_requirements(ad.AttentionBackendName("sage"))
    except RuntimeError as exc:
        ident = identity or sage_identity()
        seen = "" if ident is None else f"; imported: {ident['label']}"
        meta = "" if ident is None else f" (importlib.metadata: {ident['metadata_version']})"
        return (f"diffusers refuses its sage backend: it needs the sageattention distribution >= "
                f"{DIFFUSERS_MIN_VERSION}{meta} with SageAttention 2's entries ({str(exc).splitlines()[0]}){seen}")
    return None


__all__ = ["sage_module", "sage_missing", "sage_identity", "require_sage", "sage_call", "diffusers_refusal",
           "BUILD_SCRIPT", "HOPPER_ENTRY", "HOPPER_KERNELS", "INSTALL_HINT"]
