"""Per-target numerics of one Algorithm 1 step; the tiled loop that uses them is in :mod:`.emulator`.

``MI355XNumerics`` is the paper's kernels (NUMERICS.md); ``SM90Numerics`` is what our Hopper kernels compute for MX
Q/K and ``SM90Int8Numerics`` for INT8 Q/K (``sm90_numerics.py`` documents each difference). All answer the same
questions: the operands, the scores of a key tile, the frozen reference seeded from the first key tile visited, the
gate cap, Stage-A, Stage-B with the row-sum term, and the tile sizes. :func:`key_tile_order` is the order in which a query tile visits the key tiles
(``Recipe.key_order``), for the emulator and the kernels alike.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Tuple

import torch

from .exponent import stage_a as exponent_stage_a
from .numerics_accumulation import FP8_MMA_ACC_MANT_BITS
from .formats import PFormat, QKFormat, VFormat, fake_quantize_mx, int8_rows, round_to_bf16
from .operands import LOG2E, prepare_qk, prepare_v, prequantize_qk, stage_b
from .recipe import KEY_ORDERS, Exponential, KeyOrder, Proxy, Recipe


def first_key_tile(q_tile: int, n_q_tiles: int, n_k_tiles: int) -> int:
    """The key tile that query tile ``q_tile`` of ``n_q_tiles`` visits first in the ``diagonal`` order:
    ``floor(q_tile * n_k_tiles / n_q_tiles)``, of the ``n_k_tiles`` tiles that hold valid keys (``kv_lens``)."""
    return (q_tile * n_k_tiles) // max(1, n_q_tiles)


def key_tile_order(order: str, q_tile: int, n_q_tiles: int, n_k_tiles: int) -> List[int]:
    """The key tiles query tile ``q_tile`` (of ``n_q_tiles``) visits, in order: ``natural`` 0, 1, ..., ``n_k_tiles``
    - 1 (the paper); ``diagonal`` from :func:`first_key_tile` on, wrapping around. Query tiles are the kernel's
    (``SM90Numerics.tile_m`` = 128 rows on Hopper), key tiles ``tile_n`` keys; tiles past the valid keys are not
    visited. ``diagonal``, S_q = S_k = 4 tiles: query tile 2 visits 2, 3, 0, 1."""
    if order not in KEY_ORDERS:
        raise ValueError(f"key order {order!r} is not supported; accepted: {', '.join(KEY_ORDERS)}")
    if order == KeyOrder.NATURAL or n_k_tiles == 0:
        return list(range(n_k_tiles))
    j0 = first_key_tile(q_tile, n_q_tiles, n_k_tiles)
    return [(j0 + j) % n_k_tiles for j in range(n_k_tiles)]


class ScoreParts(NamedTuple):
    """What a kernel's Stage-A reads in place of a key tile's scores X (the INT8 kernel: sm90_numerics difference 14).

    s : Tensor (G, R, n) float32, the exact integer dot products.
    a : Tensor (G, R, n) float32, ``float32(s_q s_k)``: X = float32(s a).
    rows : Tensor (G, R) bool or None: the rows whose Stage-A reads these (None: all; the others read X).
    term, term_rows : Q smoothing's key terms (G, 1, n) float32 in doublings and the rows (G, R) bool that add them to
        Stage-A's argument (the INT8 kernel with the exact exponential, sm90_numerics difference 12), or None.
    m_gate : Tensor (G, R) float32 or None: the reference at the tile's gate (before a rollback moved it).
    """

    s: torch.Tensor
    a: torch.Tensor
    rows: Optional[torch.Tensor] = None
    term: Optional[torch.Tensor] = None
    term_rows: Optional[torch.Tensor] = None
    m_gate: Optional[torch.Tensor] = None


class MI355XNumerics:
    """The paper's semantics: operands of Table 3, frozen max = row max of the first key tile visited (tile 0 in
    the paper's order), cap ``2^cap``."""

    def __init__(self, recipe: Recipe):
        self.recipe = recipe
        self.tile_m, self.tile_n = recipe.tile_m, recipe.tile_n
        self.cap_log2 = recipe.rollback_cap_log2
        #: log2 of the constant factor P carries (subtracted from the LSE).
        self.p_scale_log2 = 0
        #: Key tiles per fp32 promotion of O (``Recipe.o_promotion_tiles``): 1 sums O in fp32; the FP8-PV ``sm90``
        #: numerics take the recipe's value (``numerics_accumulation``).
        self.o_promotion_tiles = 1
        #: Mantissa bits of the FP8 wgmma's accumulation where it is modelled (``o_promotion_tiles`` other than 1).
        self.acc_mant_bits = FP8_MMA_ACC_MANT_BITS

    @property
    def models_pv_accumulation(self) -> bool:
        """Whether the PV GEMM's tensor-core accumulation is modelled (:func:`.numerics_accumulation.fp8_chained_mma`
        across ``o_promotion_tiles`` key tiles) instead of an fp32 sum per key tile."""
        return self.o_promotion_tiles != 1

    def operands(self, q, k, v, scale: float, valid: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None):
        """(Q, K, V) float32 (B, H, S, D) values the GEMMs multiply, the factor applied to scores, Q smoothing's
        per-key term as added to the scores ((B, H, S_k) doublings, or None) and the query rows that add it
        ((B, H, S_q) bool, or None: all).

        ``valid``: (B, S_k) bool or None; ``bias``: the exact per-key term (``smoothing.key_bias``) or None."""
        qo, post = prepare_qk(q, self.recipe, scale * LOG2E)
        if self.recipe.qk_format == QKFormat.INT8 and valid is not None:  # padded keys must not move a key tile's scale
            k = torch.where(valid[:, None, :, None], k, torch.zeros_like(k))
        ko, _ = prepare_qk(k, self.recipe, 1.0, rows_per_scale=self.recipe.tile_n)
        vo = prepare_v(v, self.recipe, None if valid is None else valid[:, None, :, None])
        return qo, ko, vo, post, bias, None

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``X = q k^T`` (G, R, n) float32 for operands ``q`` (G, R, D) and one key tile ``k`` (G, n, D)."""
        return torch.matmul(q, k.transpose(1, 2))

    def tile_scores(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, Optional[ScoreParts]]:
        """``(X, parts)``: :meth:`scores` and what Stage-A reads in place of X (:class:`ScoreParts`; None: X)."""
        return self.scores(q, k), None

    def with_key_term(self, x: torch.Tensor, parts: Optional[ScoreParts], term: torch.Tensor,
                      kept: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[ScoreParts]]:
        """The scores with Q smoothing's key term ``term`` (G, 1, n) added on the rows ``kept`` (G, R) (None: all),
        and what Stage-A reads: ``parts`` on the rows without the term (None where every row has it)."""
        x = x + (term if kept is None else torch.where(kept[..., None], term, torch.zeros_like(term)))
        return x, None if parts is None or kept is None else parts._replace(rows=~kept)

    def row_peaks(self, x: torch.Tensor, m: torch.Tensor, parts: Optional[ScoreParts] = None) -> torch.Tensor:
        """The tile's row peaks (G, R) in doublings that the gate and the frozen reference read: ``max(x)``."""
        return x.amax(dim=-1)

    def seed(self, tile_max: torch.Tensor) -> torch.Tensor:
        """The frozen reference from the first key tile visited (Algorithm 1, line 2), raised by
        ``Recipe.frozen_max_offset_log2``. ``tile_max`` (..., rows) float32, doublings."""
        return tile_max + self.recipe.frozen_max_offset_log2

    def stage_a(self, x: torch.Tensor, m: torch.Tensor, parts: Optional[ScoreParts] = None) -> torch.Tensor:
        """Stage-A's weights (G, R, n) from the scores ``x`` and the reference ``m`` (G, R); ``parts``: those of
        :meth:`tile_scores` (unused here)."""
        return exponent_stage_a(x - m[..., None], self.recipe.exponential, self.recipe.proxy)

    def stage_b(self, p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(P operand of the PV GEMM, this tile's row-sum contribution)."""
        p_hat = stage_b(p, self.recipe)
        return p_hat, (p_hat if self.recipe.rowsum_gemm else p).sum(dim=-1)


class SM90Numerics(MI355XNumerics):
    """The Hopper kernel: E4M3-carried MX operands, reference on a 1/128 grid, cap ``min(cap, 4)``,
    P scaled by a fixed ``2^sigma`` per row (see ``sm90_numerics.py``)."""

    def __init__(self, recipe: Recipe):
        from . import sm90_numerics as sm90

        schraudolph = recipe.exponential == Exponential.SCHRAUDOLPH and recipe.proxy == Proxy.U16
        h15 = recipe.exponential == Exponential.ROWMAX_H15 and recipe.p_format == PFormat.FP8_ROW and recipe.rollback
        if not (recipe.frozen_max and (schraudolph or h15) and recipe.p_format in sm90.P_SIGMA
                and recipe.qk_format.mx_element is not None):
            raise ValueError(f"numerics='sm90' covers the Hopper kernel's recipes only (MX Q/K, frozen max, P fp8_row "
                             f"or mxfp6, Schraudolph U16 or gated Rowmax-H15 with fp8_row P), got {recipe}; accepted: "
                             f"mxfp8, mxfp6, mxfp4, mxfp8+exponential=rowmax_h15")
        self._h15 = h15
        super().__init__(recipe)
        self._sm90 = sm90
        self.tile_m = self.tile_n = sm90.TILE
        self.cap_log2 = min(recipe.rollback_cap_log2, sm90.P_HEADROOM_LOG2)
        self.p_scale_log2 = sm90.P_SIGMA[recipe.p_format]
        self.o_promotion_tiles = recipe.o_promotion_tiles

    def operands(self, q, k, v, scale: float, valid: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None):
        """As the base class; the per-key term in the kernel's E4M3 terms (sm90_numerics difference 9)."""
        if bias is None:
            qc, kc, vc = self._sm90.operands(q, k, v, self.recipe, scale, valid)
            return qc, kc, vc, 1.0, None, None
        qc, kc, vc, (bias_eff, kept) = self._sm90.operands(q, k, v, self.recipe, scale, valid, bias)
        return qc, kc, vc, 1.0, bias_eff, kept

    def seed(self, tile_max: torch.Tensor) -> torch.Tensor:
        """As the base class, on the kernel's 1/128 grid: ``ceil(128 tile_max) / 128 + offset`` (exact)."""
        return torch.ceil(tile_max * 128.0) / 128.0 + self.recipe.frozen_max_offset_log2

    def stage_a(self, x: torch.Tensor, m: torch.Tensor, parts: Optional[ScoreParts] = None) -> torch.Tensor:
        if self._h15:
            return self._sm90.stage_a_h15(x, m, self.p_scale_log2)
        return self._sm90._stage_a(x, m, self.p_scale_log2, not self.recipe.rollback,
                                   f16=self.recipe.p_format == PFormat.FP8_ROW)

    def stage_b(self, p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The PV operand and the key tile's row sum of the quantized P (sm90_numerics differences 4, 5)."""
        fmt = self.recipe.p_format
        if fmt == PFormat.MXFP6:  # the kernels take MXFP6 P's own rule only (kernels.sm90.plan refuses another)
            p = fake_quantize_mx(p, fmt.element, axis=-1, rule=fmt.default_scale_rule, block=fmt.keys_per_scale(0))
            return self._sm90.e4m3(p), p.sum(dim=-1)
        p8 = self._sm90.e4m3(p)
        return p8, p8.sum(dim=-1)


#: The exponentials of the Hopper INT8 kernel (sm90_numerics differences 11, 13).
INT8_EXPONENTIALS = (Exponential.SCHRAUDOLPH, Exponential.EXACT)
#: The (P, V) formats of the Hopper INT8 kernel: the accurate tier (BF16 P and V, difference 10) and the speed tier
#: (E4M3 P under the fixed per-row 2^sigma, E4M3 V with a scale per channel or per tensor; difference 13).
INT8_PV_FORMATS = ((PFormat.BF16, VFormat.BF16), (PFormat.FP8_ROW, VFormat.FP8_CHANNEL),
                   (PFormat.FP8_ROW, VFormat.FP8_TENSOR))


class SM90Int8Numerics(MI355XNumerics):
    """The Hopper INT8 Q/K kernel (``kernels/sm90/fused_attention_gluon_int8.py``, sm90_numerics difference 10): exact
    integer scores times ``float32(s_q s_k)``, the reference on the 1/128 grid. BF16 P: Stage-A's BF16 pattern itself
    (``eps' = 7/128``), BF16 V, the gate at the recipe's cap (BF16 P has the range). FP8 P (difference 13): Stage-A's
    FP16 proxy of ``P 2^4`` (or ``2^(x - m + 4)``) rounded to E4M3, the gate at ``min(cap, 4)``, E4M3 V; O summed in
    fp32 every ``Recipe.o_promotion_tiles`` key tiles."""

    def __init__(self, recipe: Recipe):
        from . import sm90_numerics as sm90

        if not (recipe.frozen_max and recipe.exponential in INT8_EXPONENTIALS and recipe.proxy == Proxy.U16
                and (recipe.p_format, recipe.v_format) in INT8_PV_FORMATS):
            raise ValueError(f"numerics='sm90' with int8 Q/K covers the Hopper INT8 kernel's recipes only (frozen max, "
                             f"exponential {', '.join(INT8_EXPONENTIALS)} with the U16 proxy, P/V "
                             f"{', '.join(f'{p}/{v}' for p, v in INT8_PV_FORMATS)}), got {recipe}; accepted: "
                             f"int8-bf16, int8-fp8 and their exponential= variants")
        super().__init__(recipe)
        self._sm90 = sm90
        self.tile_m = self.tile_n = sm90.TILE
        self._fp8_p = recipe.p_format == PFormat.FP8_ROW
        if self._fp8_p:
            self.p_scale_log2 = sm90.P_SIGMA[PFormat.FP8_ROW]
            self.cap_log2 = min(recipe.rollback_cap_log2, sm90.P_HEADROOM_LOG2)
            self.o_promotion_tiles = recipe.o_promotion_tiles

    def operands(self, q, k, v, scale: float, valid: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None):
        """INT8 codes with each row's scale appended as a last column: Q (B, H, S_q, D + 1), K (B, H, S_k, D + 1)
        (one scale per key tile; keys past ``valid`` zero before it is taken); V in the recipe's format. Q smoothing's
        key term ``bias`` passes through: the loop adds it to the fp32 scores (difference 12)."""
        vmask = None if valid is None else valid[:, None, :, None]
        if vmask is not None:
            k = torch.where(vmask, k, torch.zeros_like(k))
        qc, qs = int8_rows(prequantize_qk(q, self.recipe, scale * LOG2E), 1)
        kc, ks = int8_rows(prequantize_qk(k, self.recipe, 1.0), self.tile_n)
        return (torch.cat([qc, qs], dim=-1), torch.cat([kc, ks], dim=-1), prepare_v(v, self.recipe, vmask), 1.0,
                bias, None)

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``float32(S * float32(s_q s_k))`` with ``S`` the integer dot products (exact in float32: below 2^22)."""
        return self.tile_scores(q, k)[0]

    def tile_scores(self, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, Optional[ScoreParts]]:
        """:meth:`scores` and its parts ``S``, ``float32(s_q s_k)``: the kernel's Stage-A reads the biased integer
        scores there (difference 14). FP8 P under Schraudolph (difference 13's FP16 proxy, no kernel) reads the
        scores (None)."""
        s = torch.matmul(q[..., :-1], k[..., :-1].transpose(1, 2))
        a = q[..., -1:] * k[..., -1][:, None, :]
        biased = not self._fp8_p or self.recipe.exponential == Exponential.EXACT
        return s * a, ScoreParts(s, a) if biased else None

    seed = SM90Numerics.seed  # the reference on the kernel's 1/128 grid (sm90_numerics difference 2)

    def with_key_term(self, x, parts, term, kept):
        """Difference 12: on the rows with the term the scores ``float32(S a + b_j)`` (the kernel's FMA, one rounding),
        which the first tile's reference reads; with the exact exponential Stage-A's argument takes the term
        (``parts.term``), else Stage-A runs on those scores."""
        if parts is None:  # FP8 P under Schraudolph: no kernel (tile_scores)
            return super().with_key_term(x, parts, term, kept)
        rows = torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device) if kept is None else kept
        y = self._sm90.scores_with_key_term(parts.s, parts.a, term)
        x = torch.where(rows[..., None], y, x)
        if self.recipe.exponential == Exponential.EXACT:
            return x, parts._replace(rows=None, term=term, term_rows=rows)
        return x, parts._replace(rows=~rows)

    def row_peaks(self, x, m, parts=None):
        """Difference 12: the rows that add the key term to Stage-A's argument ``z`` read ``float32(max(z) + (m -
        sigma))`` once the reference is set (later tiles), else ``max(x)``."""
        peaks = x.amax(dim=-1)
        if parts is None or parts.term is None:
            return peaks
        z = self._sm90.stage_a_argument_key_term(parts.s, parts.a, parts.term, m, self.p_scale_log2)
        z = torch.where(torch.isfinite(x), z, torch.full_like(z, float("-inf")))  # masked keys
        from_z = (z.amax(dim=-1).double() + (m.double() - self.p_scale_log2)).float()
        return torch.where(parts.term_rows & torch.isfinite(m), from_z, peaks)

    def stage_a(self, x: torch.Tensor, m: torch.Tensor, parts: Optional[ScoreParts] = None) -> torch.Tensor:
        """Schraudolph's BF16 pattern (difference 10; FP8 P: the FP16 proxy of ``P 2^sigma``, difference 13) or
        ``2^(x - m)`` (``exact``, difference 11; BF16 P rounds it, FP8 P keeps fp32 times ``2^sigma``). With ``parts``
        on the biased scores (difference 14) for ``parts.rows`` (all rows if None), from ``x`` elsewhere; with
        ``parts.term`` (difference 12) ``2^z`` on ``parts.term_rows``, times ``2^(m_gate - m)`` where a rollback moved
        the reference."""
        if parts is None:
            return self._stage_a_scores(x, m)
        exact = self.recipe.exponential == Exponential.EXACT  # FP8 P: with the exact exponential only (tile_scores)
        p = self._sm90.stage_a_biased(parts.s, parts.a, m, self.p_scale_log2, exact, not self.recipe.rollback)
        if parts.term is not None:  # difference 12: 2^z at the gate's reference, times 2^-step after a rollback
            m_gate = m if parts.m_gate is None else parts.m_gate
            z = self._sm90.stage_a_argument_key_term(parts.s, parts.a, parts.term, m_gate, self.p_scale_log2)
            pt = torch.nan_to_num(torch.exp2(z), nan=0.0) * torch.exp2(m_gate - m)[..., None]
            p = torch.where(parts.term_rows[..., None], pt, p)
        if exact and not self._fp8_p:
            p = round_to_bf16(p)
        return p if parts.rows is None else torch.where(parts.rows[..., None], p, self._stage_a_scores(x, m))

    def _stage_a_scores(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """Stage-A from the scores in doublings (the rows that add Q smoothing's key term, difference 12)."""
        sigma = self.p_scale_log2
        if self.recipe.exponential == Exponential.EXACT:
            y = (x.double() - m.double()[..., None]).float()
            if self._fp8_p:  # times the exact power of two 2^sigma; E4M3 saturates what the gate lets through
                return torch.nan_to_num(torch.exp2(y), nan=0.0) * float(2 ** sigma)
            return torch.nan_to_num(round_to_bf16(torch.exp2(y)), nan=0.0)
        return self._sm90._stage_a(x, m, sigma, not self.recipe.rollback, f16=self._fp8_p)

    def stage_b(self, p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """BF16 P: no Stage-B, the row sum adds Stage-A's values. FP8 P: ``E4M3(P 2^sigma)`` (RNE), and the row sum
        adds those E4M3 values (difference 13)."""
        if self._fp8_p:
            p = self._sm90.e4m3(p)
        return p, p.sum(dim=-1)


def numerics_for(recipe: Recipe) -> MI355XNumerics:
    """The numerics object of ``recipe.numerics`` (and, for ``sm90``, of the recipe's Q/K format)."""
    if recipe.numerics != "sm90":
        return MI355XNumerics(recipe)
    return SM90Int8Numerics(recipe) if recipe.qk_format == QKFormat.INT8 else SM90Numerics(recipe)


