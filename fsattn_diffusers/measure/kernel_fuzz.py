"""Seeded random cases for the attention kernels, and the checks each case must pass.

Used by tests/test_kernel_fuzz_gpu.py (the Triton kernel on a CUDA GPU against its Hopper reference,
:func:`kernel_reference`) and by tests/test_kernel_fuzz_harness.py (the same harness on the CPU, the reference against
itself and against deliberately broken kernels). Nothing here imports Triton.

Tolerance rule (:func:`fsattn_diffusers.testing.within_kernel_rule`, derived there): with
``err(x) = ||x - exact||_F / ||exact||_F`` against float64 softmax attention on the same inputs,
``|err(kernel) - err(reference)| <= 5e-4 + 0.02 err(reference)`` (the Hopper reference), and the kernel within
``testing.KERNEL_REF_MAX`` relative of the reference; LSE within ln(1.125) + 0.01 of the reference's where a row
has a valid key (Rowmax-H15, a step function of the score: 5e-2 and ln(1.5) + 0.01, see LSE_REF_MAX_H15) and -inf
exactly where it has none. Further checks: no NaN anywhere in the output (the
buffers are NaN-poisoned before the call, and exact attention of finite inputs is finite), inputs
(including the memory around strided views) unmodified, two calls bitwise identical.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..backends import reference_attention
from ..recipe import get_recipe
from ..sm90_numerics import TILE
from ..testing import (KERNEL_ERR_ATOL, KERNEL_ERR_REL, KERNEL_REF_MAX, exact_attention, relative_error,
                       within_kernel_rule)
from . import KERNEL_BACKEND

REL_REF_MAX = KERNEL_REF_MAX
#: LSE against the Hopper reference: kernel and reference sum the score GEMM in different orders, so Stage-A's rounding
#: of a score can land on the neighbouring E4M3 value of P (one step, 2^-3 relative). In a row dominated by one key that
#: moves l by up to 12.5%: ln(1.125) = 0.118 nats, plus 0.01 for the rest of the row (H200 fuzz: up to 0.117 in sharp
#: rows of every variant, with outputs within 1.3e-2 of the reference).
LSE_REF_MAX = math.log(1.125) + 1e-2
#: Rowmax-H15 (``exponential="rowmax_h15"``): its weight is a step function of the score, ``n = rne(2 (X - m))`` giving
#: (1, 1.5, 2) 2^j, so a score that the summation order moves across a rounding boundary changes its weight by up to
#: 1.5x (the row maximum's 1/128 grid cancels in ``m + log2 l``): ln(1.5) + 0.01 nats for a row dominated by one key.
#: A row maximum one 1/128 step apart re-rounds every n of the row, so the outputs also sit further apart: the Hopper
#: reference against itself with its scores perturbed by 2e-4 relative moves by up to 4e-3 (out) and 0.15 (LSE); the
#: H200 fuzz saw up to 3.1e-2 and 0.40, with the kernel's error against exact attention at or below the reference's.
LSE_REF_MAX_H15 = math.log(1.5) + 1e-2
REL_REF_MAX_H15 = 5e-2
S_MAX = 20_000
#: Default cap on B * H * S_q * S_k of one case (bounds the run time and the float64 reference).
MAX_WORK = 1 << 27
# Lengths that sit on the tile boundaries (128-key tiles, 128-row query tiles) or at the ends.
EDGE_LENGTHS = (1, 2, 31, 32, 33, 127, 128, 129, 255, 257, 1000, 4095, 4097, S_MAX)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Case:
    """One fuzz case. ``kv_lens`` None: every key valid; ``pad_garbage``: NaN/inf written past kv_lens."""

    index: int
    seed: int
    recipe: str
    variant: str
    b: int
    h: int
    s_q: int
    s_k: int
    d: int
    dtype: str
    layout: str
    strided: bool
    kv_lens: Optional[Tuple[int, ...]]
    pad_garbage: bool

    @property
    def work(self) -> int:
        return self.b * self.h * self.s_q * self.s_k

    def label(self) -> str:
        kv = "full" if self.kv_lens is None else ",".join(map(str, self.kv_lens))
        return (f"#{self.index} {self.recipe}/{self.variant} B{self.b} H{self.h} Sq{self.s_q} Sk{self.s_k} D{self.d} "
                f"{self.dtype} {self.layout}{' strided' if self.strided else ''} kv_lens={kv}"
                f"{' pad-garbage' if self.pad_garbage else ''}")


def _length(rng: random.Random) -> int:
    if rng.random() < 0.2:
        return rng.choice(EDGE_LENGTHS)
    return min(S_MAX, max(1, int(round(math.exp(rng.uniform(0.0, math.log(S_MAX)))))))


def tile_count(b: int, h: int, s_q: int, s_k: int) -> int:
    """Tile pairs the kernels visit: ``B * H * ceil(S_q / TILE) * ceil(S_k / TILE)`` (:data:`TILE` query rows per
    program and keys per tile). Triton's interpreter takes 1-5 s of CPU per tile pair, whatever the tile holds."""
    return b * h * -(-s_q // TILE) * -(-s_k // TILE)


def generate_cases(n: int, recipes: Sequence[str], variants: Sequence[str], seed: int = 0,
                   max_work: int = MAX_WORK, max_tiles: Optional[int] = None) -> List[Case]:
    """``n`` cases; (recipe, variant) pairs round-robin, everything else drawn from ``seed``.

    Sizes: S_q, S_k log-uniform in [1, 20000] (a fifth from :data:`EDGE_LENGTHS`), B in 1-4, H in 1-48,
    then H, B and the longer sequence halved until B * H * S_q * S_k <= ``max_work`` and, with ``max_tiles``,
    :func:`tile_count` <= ``max_tiles`` (the interpreter's cost). Each case's (recipe, variant) pair is the same
    under any cap; its later draws (kv_lens, dtype, layout) may differ.
    """
    rng = random.Random(seed)
    pairs = [(r, v) for r in recipes for v in variants]
    cases = []
    for i in range(n):
        recipe, variant = pairs[i % len(pairs)]
        b, h, s_q, s_k = rng.randint(1, 4), rng.randint(1, 48), _length(rng), _length(rng)
        while b * h * s_q * s_k > max_work or (max_tiles is not None and tile_count(b, h, s_q, s_k) > max_tiles):
            if h > 1:
                h = max(1, h // 2)
            elif b > 1:
                b -= 1
            elif s_q >= s_k:
                s_q = max(1, s_q // 2 + (s_q % 2))
            else:
                s_k = max(1, s_k // 2 + (s_k % 2))
        kv_lens = None
        if rng.random() < 0.6:
            kv_lens = tuple(rng.choice([0, s_k, rng.randint(1, s_k), rng.randint(1, s_k)]) for _ in range(b))
        pad_garbage = kv_lens is not None and any(n_ < s_k for n_ in kv_lens) and rng.random() < 0.5
        cases.append(Case(i, rng.randrange(1 << 31), recipe, variant, b, h, s_q, s_k, rng.choice((64, 128)),
                          rng.choice(tuple(DTYPES)), rng.choice(("bshd", "bhsd")), rng.random() < 0.5,
                          kv_lens, pad_garbage))
    return cases


#: Offset added to every channel of Q on the even heads of a case whose recipe switches Q smoothing per slice
#: (``smooth_q`` with ``smooth_q_min_ratio`` > 0), so that both of the kernel's launches run: those heads take the key
#: term, the others (normal queries, ratio ~ S^-1/2) do not.
SWITCH_Q_OFFSET = 3.0


def make_inputs(case: Case, device) -> Tuple[Tuple[torch.Tensor, ...], Tuple[torch.Tensor, ...]]:
    """``((q, k, v) as (B, H, S, D) views, (their base buffers))`` for ``case``.

    ``layout="bshd"``: views of (B, S, H, D) memory. ``strided``: views that skip every other head and
    8 columns of a wider head dim (non-contiguous, unit stride in D). Recipes with Q smoothing's per-slice switch get
    :data:`SWITCH_Q_OFFSET` on Q's even heads (no extra random draw: the other tensors are those of any recipe).
    """
    recipe = get_recipe(case.recipe)
    switch = recipe.smooth_q and recipe.smooth_q_min_ratio > 0.0
    g = torch.Generator().manual_seed(case.seed)
    dtype = DTYPES[case.dtype]
    views, bases = [], []
    for name, s in (("q", case.s_q), ("k", case.s_k), ("v", case.s_k)):
        h_alloc, d_alloc = (2 * case.h, case.d + 8) if case.strided else (case.h, case.d)
        shape = (case.b, s, h_alloc, d_alloc) if case.layout == "bshd" else (case.b, h_alloc, s, d_alloc)
        base = torch.randn(shape, generator=g)
        if name == "q":
            base *= 1.0 + 3.0 * torch.rand((), generator=g)  # sharper rows now and then (rollbacks)
        heads = slice(0, 2 * case.h, 2) if case.strided else slice(None)
        view = base[:, :, heads, :case.d] if case.layout == "bshd" else base[:, heads, :, :case.d]
        if case.layout == "bshd":
            view = view.transpose(1, 2)
        if name == "q" and switch:
            view[:, 0::2] += SWITCH_Q_OFFSET
        if name != "q" and case.pad_garbage:
            for bi, n in enumerate(case.kv_lens):
                view[bi, :, n:] = float("nan") if name == "k" else float("inf")
        base = base.to(dtype).to(device)
        view = base[:, :, heads, :case.d].transpose(1, 2) if case.layout == "bshd" else base[:, heads, :, :case.d]
        views.append(view)
        bases.append(base)
    return tuple(views), tuple(bases)


def poisoned_outputs(case: Case, q: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """NaN-filled ``out`` (B, H, S_q, D) in the input layout and dtype, and ``lse`` (B, H, S_q) float32."""
    if case.layout == "bshd":
        out = torch.full((case.b, case.s_q, case.h, case.d), float("nan"), dtype=q.dtype, device=q.device).transpose(1, 2)
    else:
        out = torch.full((case.b, case.h, case.s_q, case.d), float("nan"), dtype=q.dtype, device=q.device)
    return out, torch.full((case.b, case.h, case.s_q), float("nan"), dtype=torch.float32, device=q.device)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


#: ``kernel(q, k, v, recipe_name, kv_lens_int32_or_None, variant, scale, out, lse)``: writes ``out``/``lse``.
KernelFn = Callable[..., None]
#: ``reference(q, k, v, recipe_name, scale, kv_lens) -> (out, lse)``.
ReferenceFn = Callable[..., Tuple[torch.Tensor, torch.Tensor]]


def kernel_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, recipe_name: str, scale: float,
                     kv_lens: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """The fuzz's reference: what the kernels of :data:`~fsattn_diffusers.measure.KERNEL_BACKEND` compute for
    ``recipe_name`` (:func:`fsattn_diffusers.backends.reference_attention`).

    Parameters
    ----------
    q, k, v : Tensor (B, H, S, D) (strided views of (B, S, H, D) storage included); read, never modified.
    recipe_name : str
        A preset name, with changes (``"mxfp8+exponential=rowmax_h15"``) allowed.
    scale : float
    kv_lens : int tensor (B,) or None

    Returns
    -------
    out : Tensor (B, H, S_q, D); lse : Tensor (B, H, S_q), natural log.
    """
    out, lse, _ = reference_attention(KERNEL_BACKEND, q, k, v, get_recipe(recipe_name), scale=scale, kv_lens=kv_lens)
    return out, lse


def reference_bounds(recipe_name: str) -> Tuple[float, float]:
    """``(kernel vs reference relative bound, LSE bound in nats)`` for a recipe name (see the constants above)."""
    if get_recipe(recipe_name).exponential == "rowmax_h15":
        return REL_REF_MAX_H15, LSE_REF_MAX_H15
    return REL_REF_MAX, LSE_REF_MAX


def run_case(case: Case, kernel: KernelFn, device, reference: ReferenceFn = kernel_reference) -> Dict:
    """Run one case and check it against ``reference`` (default :func:`kernel_reference`).

    Returns a dict with the measurements and ``failures`` (list of str)."""
    t0 = time.perf_counter()
    (q, k, v), bases = make_inputs(case, device)
    before = [_bits(t).clone() for t in bases]
    kv = None if case.kv_lens is None else torch.tensor(case.kv_lens, dtype=torch.int32, device=device)
    scale = 1.0 / math.sqrt(case.d)
    outs = []
    for _ in range(2):
        out, lse = poisoned_outputs(case, q)
        kernel(q, k, v, case.recipe, kv, case.variant, scale, out, lse)
        outs.append((out, lse))
    (out, lse), (out2, lse2) = outs
    ref_o, ref_lse = reference(q, k, v, case.recipe, scale, kv)
    ex_o, ex_lse = exact_attention(q, k, v, scale, kv)
    failures = []
    nan_out = int((~torch.isfinite(out)).sum())
    if nan_out:
        failures.append(f"{nan_out} NaN/inf (unwritten or computed) output elements; exact attention is finite")
    e_k, e_r, e_kr = relative_error(out, ex_o), relative_error(ref_o, ex_o), relative_error(out, ref_o)
    if not within_kernel_rule(e_k, e_r):
        failures.append(f"tolerance rule: |err {e_k:.5f} - ref {e_r:.5f}| > {KERNEL_ERR_ATOL} + {KERNEL_ERR_REL} * ref")
    rel_max, lse_max = reference_bounds(case.recipe)
    if not e_kr < rel_max:
        failures.append(f"kernel vs reference {e_kr:.3e} >= {rel_max}")
    has_key = torch.isfinite(ex_lse)
    if not torch.equal(torch.isfinite(lse), has_key):
        failures.append(f"LSE finite on {int(torch.isfinite(lse).sum())} rows, rows with a valid key "
                        f"{int(has_key.sum())}")
    lse_diff = float((lse - ref_lse)[has_key].abs().max()) if bool(has_key.any()) else 0.0
    if not lse_diff < lse_max:
        failures.append(f"LSE vs reference {lse_diff:.3e} >= {lse_max:.4f}")
    if not (torch.equal(_bits(out), _bits(out2)) and torch.equal(_bits(lse), _bits(lse2))):
        failures.append("two calls differ (not deterministic)")
    changed = [n for n, t, b0 in zip("qkv", bases, before) if not torch.equal(_bits(t), b0)]
    if changed:
        failures.append(f"inputs modified: {', '.join(changed)}")
    return {"case": asdict(case), "label": case.label(), "err_kernel": e_k, "err_ref": e_r, "kernel_vs_ref": e_kr,
            "lse_diff": lse_diff, "nan_out": nan_out, "margin": abs(e_k - e_r) / (KERNEL_ERR_ATOL + KERNEL_ERR_REL * e_r),
            "seconds": time.perf_counter() - t0, "failures": failures}


def case_line(result: Dict) -> str:
    status = "FAIL " + "; ".join(result["failures"]) if result["failures"] else "ok"
    return (f"{result['label']}: err {result['err_kernel']:.5f} ref {result['err_ref']:.5f} "
            f"kernel-vs-ref {result['kernel_vs_ref']:.2e} lse-diff {result['lse_diff']:.2e} "
            f"margin {result['margin']:.3f} {result['seconds']:.2f}s {status}")


def summary_lines(results: Sequence[Dict]) -> List[str]:
    """Per recipe: cases, failures and the worst case (largest share of the tolerance used)."""
    lines = []
    for recipe in sorted({r["case"]["recipe"] for r in results}):
        rs = [r for r in results if r["case"]["recipe"] == recipe]
        worst = max(rs, key=lambda r: (bool(r["failures"]), r["margin"]))
        worst_ref = max(rs, key=lambda r: r["kernel_vs_ref"])
        lines.append(f"{recipe}: {len(rs)} cases, {sum(bool(r['failures']) for r in rs)} failed; worst margin "
                     f"{worst['margin']:.3f} ({worst['label']}); worst kernel-vs-ref {worst_ref['kernel_vs_ref']:.2e} "
                     f"({worst_ref['label']})")
    return lines
