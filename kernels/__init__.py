"""Triton and Gluon kernels by hardware target; installed as ``fsattn_diffusers.kernels`` (see ``pyproject.toml``).

* ``sm90/``: the Hopper kernels (wgmma), their pre-passes, plan and host code;
* beside it, Triton pieces any CUDA target shares: ``common`` (bit-construction and rounding helpers, the masked
  row load), ``token_mean`` (the smoothing mean), ``nonfinite_flags``, ``rope`` (Wan's rotary embedding).

Run from a checkout's root, ``import kernels`` finds this folder before site-packages. Imported under that
top-level name, the folder hands the import on to whatever else provides ``kernels`` (Hugging Face's package,
which transformers imports), or fails as if it were absent; its own modules are never importable as ``kernels.X``.
"""
if __name__ == "kernels":  # this folder, found through the working directory: never ours to provide
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
