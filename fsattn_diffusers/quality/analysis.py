"""Per-call analysis of one attention call on sampled query rows (shared by capture and replay).

For each recipe it records the rollback rate at the gate (``attention(..., return_stats=True)`` on the
sampled rows with all keys), the error of the recipe against BF16 attention with the conventional
softmax (paper Table 4's reference) and the error of the conventional softmax on the *same quantized
operands* (``Recipe.replace(exponential="exact", frozen_max=False, rowsum_gemm=False)``), so the part
of the error due to the fused softmax is the difference of the two (paper Section 5.3.1, Appendix A).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence

import torch

from ..testing import error_and_cosine
from ..api import attention, supported_head_dim
from ..recipe import BF16_EMULATED, PRESETS, Recipe, get_recipe

#: Query rows analysed per call by default (one query tile of the paper's kernels).
DEFAULT_ROWS = 256
#: Recipes analysed by default: the paper's three kernels.
DEFAULT_RECIPES = ("mxfp8", "mxfp6", "mxfp4")
#: Per-recipe fields of a call row (column ``<recipe>_<field>``).
RECIPE_FIELDS = ("rollback_rate", "rollbacks", "tiles", "err_pct", "cos", "conv_err_pct", "conv_cos")
PERCENT = 100.0


def conventional(recipe: Recipe) -> Recipe:
    """``recipe``'s operands with the conventional softmax (exact exp, running max, fp row sum)."""
    return recipe.replace(name=f"{recipe.name}:conventional", exponential="exact", frozen_max=False,
                          rowsum_gemm=False)


#: BF16 attention with the conventional softmax: the reference of every error (as in Table 4).
REFERENCE_RECIPE = conventional(PRESETS[BF16_EMULATED])


def resolve_recipes(names: Sequence) -> List[Recipe]:
    """Recipes from preset names or Recipe objects (one-line ValueError for an unknown name)."""
    recipes = [get_recipe(n) for n in names]
    if not recipes:
        raise ValueError(f"no recipes to analyse; accepted: {', '.join(DEFAULT_RECIPES)} (comma-separated)")
    return recipes


def sample_rows(n_rows: int, count: int, seed: int) -> torch.Tensor:
    """Sorted indices of ``min(count, n_rows)`` distinct rows, fixed by ``seed``."""
    if count >= n_rows:
        return torch.arange(n_rows)
    pick = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed))[:count]
    return pick.sort().values


def analyse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, recipes: Sequence[Recipe], *,
            scale: Optional[float], kv_lens: Optional[torch.Tensor], backend: str = "emulator") -> Dict:
    """Rollback rate and errors of each recipe on one (1, H, rows, D) / (1, H, S_k, D) call.

    Returns
    -------
    dict
        ``<recipe>_<field>`` for every recipe and :data:`RECIPE_FIELDS` field; a recipe that cannot take
        this head dim gets NaN values and ``<recipe>_note``.
    """
    kwargs = dict(layout="bhsd", scale=scale, kv_lens=kv_lens, backend=backend)
    ref = attention(q, k, v, REFERENCE_RECIPE, **kwargs)
    row: Dict = {}
    for recipe in recipes:
        name = recipe.name
        why = supported_head_dim(recipe, q.shape[-1])
        if why is not None:
            row.update({f"{name}_{f}": math.nan for f in RECIPE_FIELDS})
            row[f"{name}_note"] = why
            continue
        out, stats = attention(q, k, v, recipe, return_stats=True, **kwargs)
        conv = attention(q, k, v, conventional(recipe), **kwargs)
        err, cos = error_and_cosine(out, ref)
        conv_err, conv_cos = error_and_cosine(conv, ref)
        row.update({f"{name}_rollback_rate": float(stats["rollback_rate"]),
                    f"{name}_rollbacks": int(stats["rollbacks"]), f"{name}_tiles": int(stats["tiles"]),
                    f"{name}_err_pct": err * PERCENT, f"{name}_cos": cos,
                    f"{name}_conv_err_pct": conv_err * PERCENT, f"{name}_conv_cos": conv_cos})
    return row


def badness(row: Dict, recipe_names: Sequence[str]):
    """Sort key of a call, worst first when sorted descending: (max rollback rate, max error %)."""
    def top(field):
        vals = [row.get(f"{n}_{field}") for n in recipe_names]
        vals = [x for x in vals if isinstance(x, (int, float)) and not math.isnan(x)]
        return max(vals) if vals else -1.0
    return top("rollback_rate"), top("err_pct")
