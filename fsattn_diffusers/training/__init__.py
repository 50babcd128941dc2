"""Training-side attention approximations.

* :mod:`.grid_softmax` — a differentiable K-step grid softmax (``torch.autograd``) with the three
  training choices of the softmax-sensitivity study ("How Much Softmax Do You Need in LLMs?", section
  "What changes when you train"):
  feedback through the grid's ends kept or detached, grid ends from MinMax or a fixed window below
  the row maximum, and the rounding surrogate (LERP, or hard rounding with the LERP surrogate before
  or after normalization).
"""

from .grid_softmax import (
    Calibration,
    EndsFeedback,
    GridSoftmaxConfig,
    Rounding,
    grid_attention,
    grid_ends,
    grid_softmax,
    grid_softmax_with_ends,
)

__all__ = [
    "Calibration",
    "EndsFeedback",
    "GridSoftmaxConfig",
    "Rounding",
    "grid_attention",
    "grid_ends",
    "grid_softmax",
    "grid_softmax_with_ends",
]
