"""Ready runners with the paper's settings for users with the weights.

* ``python -m fsattn_diffusers.pipelines.wan22_t2v_a14b --prompt "..."`` — Wan2.2-T2V-A14B, paper Section 5
  settings (81 frames 1280x720, 20 steps, guidance 4 / 3, UniPC with flow shift 12), hybrid policy.
* ``python -m fsattn_diffusers.pipelines.wan21_t2v --prompt "..."`` — Wan2.1-T2V-1.3B.
* ``python -m fsattn_diffusers.pipelines.hunyuan_video --prompt "..."`` — HunyuanVideo defaults.
* ``torchrun --nproc_per_node N -m fsattn_diffusers.pipelines.xdit_video --model Wan2.2-T2V --ulysses_degree N
  --policy hybrid ...`` — Wan2.2 / HunyuanVideo through xDiT (Ulysses / ring) with fsattn as the kernel.

:mod:`.settings` holds the settings (``RunSettings``) that ``fsattn generate --model`` also uses.

Run from a checkout's root, ``import pipelines`` finds this folder first; imported under that top-level name, it hands
the import on to whatever else provides ``pipelines``, or fails as if it were absent (as ``kernels/`` does).
"""
if __name__ == "pipelines":  # this folder, found through the working directory: never ours to provide
    import importlib as _importlib
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _saved = _sys.path[:]
    _sys.path[:] = [p for p in _saved if _os.path.abspath(p or _os.curdir) != _root]
    _self = _sys.modules.pop(__name__)
    try:
        _importlib.import_module(__name__)  # leaves the other package in sys.modules, which the import returns
    except ModuleNotFoundError as _err:
        if _err.name != __name__:
            raise
        raise ModuleNotFoundError(f"No module named {__name__!r} (this repository's {__name__}/ folder installs as "
                                  f"fsattn_diffusers.{__name__})", name=__name__) from None
    finally:
        _sys.path[:] = _saved
        if __name__ not in _sys.modules:
            _sys.modules[__name__] = _self
