"""fsattn-diffusers: Fused-Softmax quantized attention for video diffusion.

Public API: :func:`attention`, :class:`Recipe`, :data:`PRESETS`, :func:`get_recipe`; the diffusers
integration (:func:`apply`, :func:`remove`) is imported lazily so that ``import fsattn_diffusers``
needs neither diffusers nor transformers.
"""

from .notices import filter_known_noise

filter_known_noise()  # other packages' import-time notes that say nothing about the user's work (notices.py)

from .api import attention  # noqa: E402
from .recipe import PRESETS, Recipe, get_recipe  # noqa: E402

__version__ = "0.1.0"
__all__ = ["attention", "Recipe", "PRESETS", "get_recipe", "apply", "remove", "__version__"]


def __getattr__(name):
    if name in ("apply", "remove"):
        from . import integration

        return getattr(integration, name)
    raise AttributeError(f"module 'fsattn_diffusers' has no attribute {name!r}")
