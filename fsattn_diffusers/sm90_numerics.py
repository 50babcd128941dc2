"""What the Hopper (sm_90) Triton kernel computes where it differs from the MI355X semantics (NUMERICS.md).

Hopper has FP8 E4M3 tensor cores and no MX instructions, so the kernel (``kernels/``) carries every
operand in E4M3 and keeps the softmax's scales as powers of two it can fold into one FMA. The
differences, each reproduced by the emulator in these numerics (for the kernels' backend:
:func:`fsattn_diffusers.backends.reference_attention` with ``"triton"``):

1. **Operand carry.** MX values (``elem * 2^s_b``) are held as ``E4M3(elem * 2^(s_b - R + t0)) * 2^(R - t0)``
   with ``R`` the largest block exponent of a group: a 128-row query tile (Q), a 128-key tile (K), a V
   channel over all keys (MX V). ``t0`` = 0 (E4M3), 5 (E2M3), 6 (E2M1). Exact whenever the group's
   block exponents are within the element format's headroom (always for E2M3/E2M1 within 11/14
   doublings; for MXFP8 blocks below ``R`` lose their smallest elements' low bits).
2. **Frozen reference on a grid.** ``m = ceil(128 rowmax(X_i0)) / 128`` (plus ``Recipe.frozen_max_offset_log2``, a
   multiple of 1/128) and Schraudolph's offset is
   ``eps' = 7/128`` (``D = 16249``), so the Stage-A constant is an exact fp32 integer; the rollback
   keeps ``m`` on the grid (``delta`` is an integer).
3. **Gate cap.** P carries one power-of-two scale per row that changes only with ``m``:
   ``P * 2^sigma`` (sigma = 4 for fp8_row, 3 for mxfp6 P), so the gate fires at
   ``min(cap, 4)`` doublings (plan.P_HEADROOM_LOG2) instead of 32; every P then fits E4M3. The same scale is
   why the ``mxfp8`` preset also lowers ``m`` (``Recipe.rollback_floor_log2``, in both numerics modes): below a
   reference held up by one outlier key every later P would sit in E4M3's subnormals.
4. **Stage-B.** fp8_row: ``E4M3(P * 2^4)`` (a per-row scale frozen with ``m`` instead of one per key
   tile). mxfp6: the MI355X MXFP6 value, carried as ``E4M3(P_mx * 2^3)`` (exact unless a block max is
   below 2^-7 of the reference).
5. **Row sum.** ``l`` sums the quantized P (the paper's ``rowsum_gemm=True``): fp8_row the E4M3 values (the
   kernel: ``P8 @ ones`` on the tensor cores, one key tile at a time, added to an fp32 sum in registers; FP8
   wgmma accumulation across 256+ tiles lost up to 40% of ``l`` on the H200), mxfp6 P the MXFP6 values.
6. **Statistics.** Query tiles are 128 rows (``tile_m = 128``).
7. **FP16 proxy (fp8_row P).** Stage-A builds the 16-bit proxy on FP16's bit layout (5 exponent bits,
   10 mantissa bits, grid 1/1024 of a doubling, ``eps' = 7/128``, :data:`D_BITS_F16`) instead of BF16's:
   Hopper converts ``f16x2 -> e4m3x2`` in one instruction and packs two patterns with one ``PRMT``, where
   the BF16 proxy needs a shift per element. Both are Schraudolph's piecewise-linear ``2^x`` (the same
   bias); the FP16 one rounds the mantissa to 10 bits instead of 7 before the E4M3 rounding. P * 2^sigma
   stays below 2^(sigma + 4) = 256 under the gate, inside FP16's range; patterns below 0 (P < 2^-15) are
   clamped to 0, as E4M3 would round them. mxfp6 P keeps the BF16 proxy (its block scales are read from
   BF16 exponent fields).

8. **Rowmax-H15 (``exponential="rowmax_h15"``, fp8_row P, gated).** The exponential of "How Much Softmax Do You Need in
   LLMs?", ``n = rne(2 (X - m))``, weight ``(1 + 0.5 (n mod 2)) 2^(n div 2)``, with ``m`` on difference 2's 1/128 grid.
   The kernel forms ``2X - 2m`` in one FMA and rounds it to the integer grid by adding 1.5 2^23 (the FMA's own fp32
   rounding can move ``n`` only when ``2X - 2m`` lies within 2^-23 relative of a half-integer). The weight times
   ``2^sigma`` is built from ``n``'s bits (exponent ``n div 2 + sigma``, mantissa bit ``n mod 2``); its E4M3 rounding is
   the PV operand and the row sum's term (exact down to 2^-8; below, E4M3's subnormal grid rounds). ``n`` is clamped at
   :data:`H15_MIN_N` (masked keys give 0 after the rounding).

9. **Q smoothing's key term on the tensor cores (``smooth_q``).** The per-key term ``b_j = alpha log2e (q_mean . k_j)``
   is not added to every score: it enters the score GEMM as a K = 32 wgmma on which ``Q K_j^T`` is chained,
   ``S_j = Qx_t Kx_j^T + Q K_j^T`` (:func:`key_term`; the term first, into a zero accumulator: the FP8 accumulation
   keeps ~13 bits below the largest exponent it adds, and chained onto the scores it cut a small term's 28 equal lead
   products alike). ``Kx_j`` holds ``x_j = b_j 2^(G - KE_j)`` as E4M3 terms (28 copies of
   ``E4M3(x_j / 28)`` and four E4M3 refinements of the remainder, relative error below ~2^-20 of the head's largest
   term), ``G`` one shift per (batch, head) that puts the largest ``|x_j|`` within the terms' capacity; ``Qx_t`` is
   ``2^(-QE_t - G)`` in every column, an exact E4M3 power of two for ``-QE_t - G`` in [-9, 8]. Two rules keep it so:
   Q's tile exponent is raised to at least ``-G - 8`` (``q_floor``: only when the term is ~2^21 times the GEMM's unit,
   near-identical queries; an all-zero Q tile takes the floor as its exponent), and a tile with ``-QE_t - G < -9``
   drops the term (there it is below 2^-9 of the capacity, against a full-scale Q tile's scores). The reference adds
   ``bias_eff_j = sum(Kx_j) 2^(KE_j - G)`` on the kept tiles.

10. **INT8 Q/K (``qk_format="int8"``, BF16 P and V; ``numerics.SM90Int8Numerics``).** The scores are the exact
   integer dot products ``S`` of the codes times ``float32(s_q s_k)`` (one fp32 rounding), the reference sits on the
   1/128 grid as in difference 2, Stage-A's BF16 pattern (``eps' = 7/128``) is P itself, and the gate keeps the
   recipe's cap: BF16 holds ``2^32``. BF16 products accumulate in fp32 on the tensor cores, so O and ``l`` are
   chained across key tiles in the wgmma accumulators.

11. **The INT8 tier's exact exponential (``exponential="exact"``).** ``P = BF16(2^(X - m))`` instead of Schraudolph's
   pattern: ``X - m`` one fp32 rounding, ``2^y`` the hardware's ``ex2.approx.f32`` (within 2 ulp of fp32, so P's
   round-to-nearest BF16 can differ from the reference's by one ulp near a tie); no ``eps'``.

12. **Q smoothing on the INT8 tier (``smooth_q``).** The pre-pass subtracts Q's mean (per-slice switch as for the MX
   tiers) and writes the key term ``b_j`` (fp32, ``smoothing.key_bias`` summed in the pre-pass's order); the kernel
   forms the first key tile's scores in doublings as ``fma(S, float32(s_q s_k), b_j)`` (one rounding) for the frozen
   reference; on every tile, with the exact exponential, Stage-A's argument is ``float32(float32(Xb a - C) + b_j)``
   (``Xb``, ``a``, ``C`` of difference 14: two roundings, both at the argument's magnitude), the gate reads
   ``float32(max_j z + (m - sigma))``, and a row that rolls back keeps its ``P 2^sigma`` times ``2^-step`` (the
   reference's integer step: exact) instead of a second Stage-A; under Schraudolph Stage-A runs on the scores in
   doublings. The reference computes the same (:func:`scores_with_key_term`, :func:`stage_a_argument_key_term`;
   ``SM90Int8Numerics.with_key_term`` / ``row_peaks``), ``2^z`` exact where the kernel's ``ex2.approx`` is within
   2 ulp (difference 11).

13. **The INT8 speed tier (``int8-fp8``: INT8 Q/K, ``p_format="fp8_row"``, ``v_format="fp8_channel"``).** Scores and
   reference as difference 10; P is carried as ``E4M3(P 2^sigma)`` with sigma = 4 and the gate at ``min(cap, 4)`` as in
   differences 3-4. Under Schraudolph, Stage-A is difference 7's FP16 proxy of ``P 2^4`` and the E4M3 cast rounds it
   (RNE); under ``exponential="exact"``, ``E4M3(2^(X - m) 2^4)`` from the fp32 power (``ex2.approx.f32``, within
   2 ulp). The row sum adds the E4M3 values (difference 5). V is E4M3 with one fp32 scale ``amax / 448`` per
   (batch, head, channel) over the valid keys, multiplied into V8 here; a kernel may apply it to O instead.

14. **The INT8 kernel's Stage-A on biased scores (``int8-bf16``, its exact exponential, ``int8-fp8``).** The
   kernel turns the int32 scores into fp32 by adding them to the bits of ``M = 1.5 * 2^23`` (:data:`I2F_MAGIC`, exact
   for ``|S| < 2^22``) and keeps ``Xb = M + S``: the bias goes into Stage-A's per-row constant of each key tile, one
   fp32 rounding, ``C = float32(a M + (m - sigma))`` (exact exponential; ``a = float32(s_q s_k)``) or
   ``C = float32(128 a M - c)`` (Schraudolph, ``c`` its constant on the 1/128 grid), and Stage-A is one FMA of
   ``Xb``: ``float32(Xb a - C)``, ``float32(Xb 128 a - C)``. So each (row, key tile) sees ``m`` moved by ``C``'s
   rounding, below ``ulp(a M) / 2`` (exact; Schraudolph: below 1/256 of a doubling), and the scores enter Stage-A as
   exact products (no fp32 rounding of ``S a`` first). The gate and the reference read ``float32(max(S) a)`` as in
   difference 10; rows that add Q smoothing's key term (difference 12) add it to Stage-A's argument (exact
   exponential) or form ``fma(S, a, b_j)`` and keep the unbiased Stage-A (Schraudolph). :func:`stage_a_biased`;
   with FP8 P (difference 13, exact exponential) its fp32 values of ``P 2^sigma`` before the E4M3 cast. With FP8 P
   the kernel writes Stage-A as one explicit FMA in every copy: written ``x * a - C``, the compiler rounds ``Xb a``
   first where two copies share it (the rollback re-run), a rounding at ``ulp(a M)``, which with E4M3 P moves a row's
   dominant weight across a rounding boundary (LSE up to ln(9/8) nats).
   With BF16 P the kernel keeps ``x * a - C`` (the explicit form runs 10-11% slower): in rolled-back tiles a BF16
   pattern may lie one step from the reference's where the two roundings differ.

**Accumulation.** O is summed in fp32 across key tiles, as here: the kernels take each tile's ``P8 V8`` into a zero
accumulator and add it to O in registers (FP8 wgmma keeps ~13 mantissa bits below the largest exponent it adds, so
chained onto O every later tile's products would be cut at O's magnitude: on sharp, patch-like rows 10.5% of the output
at S = 32768 against the reference's 0.8%). ``Recipe.o_promotion_tiles = n`` other than 1 models a kernel that adds
the accumulator to O only every ``n`` key tiles (None: never): the PV GEMM's products then pass through
:func:`fsattn_diffusers.numerics_accumulation.fp8_chained_mma`, per 32-key wgmma truncated toward zero below
``2^(E - 13)``, ``E`` the largest exponent among the accumulator and the instruction's products. The score GEMM's own
accumulation on the tensor cores (within a key tile, over the head dimension), the PV accumulation within one key tile
at ``n = 1`` and the fp32 summation order are not modeled; :func:`fsattn_diffusers.testing.within_kernel_rule` states
what that allows.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from .formats import E4M3, MX_ELEMENT, PFormat, VFormat, round_to_bf16, round_to_elem, shared_exponent
from .operands import LOG2E, prepare_v, prequantize_qk, scale_rule
from .recipe import Recipe

#: Rows of a query tile and keys of a key tile of the sm_90 kernel.
TILE = 128
#: Headroom t0 of each MX element format under E4M3 (kernels.sm90.plan.CARRY_T0).
CARRY_T0 = {"mxfp8": 0, "mxfp6": 5, "mxfp4": 6}
#: Gate cap and P scales (kernels.sm90.plan): the P formats the Hopper kernels take and the fixed per-row power of two
#: ``2^sigma`` each carries P at (difference 3).
P_HEADROOM_LOG2 = 4
P_SIGMA = {PFormat.FP8_ROW: 8 - P_HEADROOM_LOG2, PFormat.MXFP6: 7 - P_HEADROOM_LOG2}
#: 128 * (127 - 7/128): Schraudolph's bias on the 1/128 grid (paper eps = 0.05798).
D_BITS = 16249
#: 1024 * (15 - 7/128): the same bias on FP16's 1/1024 grid (difference 7).
D_BITS_F16 = 15304
#: Largest finite FP16 pattern (saturation of the FP16 proxy when no gate bounds P).
F16_MAX_BITS = 0x7BFF
#: 1.5 * 2^23: Stage-A's clamp constant, and the INT8 kernel's bias of the int32 scores (difference 14).
I2F_MAGIC = 12582912.0
#: Rowmax-H15 (difference 8): the clamp of ``n`` (2^-126, a normal fp32 weight).
H15_MIN_N = -252


#: Difference 9: columns of the key term's chained wgmma (its K), copies of the leading term, and the range of the
#: power of two ``Qx = 2^(-QE - G)`` (E4M3 holds 2^-9 .. 2^8 exactly); the shift ``G`` is clamped to +-KEY_TERM_G_MAX.
KEY_TERM_COLS = 32
KEY_TERM_LEAD = 28
QX_MIN_LOG2 = -9
QX_MAX_LOG2 = 8
KEY_TERM_G_MAX = 40
#: E4M3's largest finite value.
E4M3_MAX = 448.0
#: The terms' capacity KEY_TERM_LEAD * E4M3_MAX = KEY_TERM_CAP_MANT * 2^KEY_TERM_CAP_EXP, the mantissa in [1, 2).
KEY_TERM_CAP = KEY_TERM_LEAD * E4M3_MAX
KEY_TERM_CAP_EXP = int(KEY_TERM_CAP).bit_length() - 1
KEY_TERM_CAP_MANT = KEY_TERM_CAP / 2 ** KEY_TERM_CAP_EXP


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Nearest-even, saturating E4M3 value of ``x`` (float32)."""
    return round_to_elem(x, E4M3)


def carry_mx(y: torch.Tensor, fmt_name: str, rule: str, tile: Optional[int], floor: Optional[torch.Tensor] = None,
             return_exps: bool = False):
    """MX-quantize ``y`` (..., R, C) in blocks of 32 along the last axis and carry it in E4M3
    (difference 1). The reference exponent is the largest block exponent of a row (``tile=None``) or
    of ``tile`` consecutive rows. Returns float32 (..., R, C).

    With ``tile``: ``floor`` (the leading dims of ``y``, int), optional, is the smallest tile exponent (difference 9's
    ``q_floor``); ``return_exps`` also returns the tile exponents ``QE``/``KE`` as the kernel's pre-pass writes them
    (..., ceil(R / tile)) int32, an all-zero tile's being 0 (or ``floor``).
    """
    fmt = MX_ELEMENT[fmt_name]
    rows, cols = y.shape[-2], y.shape[-1]
    yb = y.reshape(*y.shape[:-1], cols // 32, 32)
    s = shared_exponent(yb.abs().amax(dim=-1, keepdim=True), fmt, rule)  # (..., R, C/32, 1)
    elems = round_to_elem(torch.ldexp(yb, -s), fmt)
    ref = s.amax(dim=(-2, -1))  # (..., R)
    t0 = CARRY_T0[fmt_name]
    exps = None
    if tile is not None:
        pad = (-rows) % tile
        ref = torch.nn.functional.pad(ref, (0, pad), value=-127)
        ref_t = ref.reshape(*ref.shape[:-1], -1, tile).amax(dim=-1)  # (..., tiles)
        zero = torch.zeros_like(ref_t) if floor is None else (floor[..., None] + t0).to(ref_t.dtype).expand_as(ref_t)
        ref_t = torch.where(ref_t <= -127, zero, ref_t if floor is None else torch.maximum(ref_t, zero))
        exps = (ref_t - t0).to(torch.int32)
        ref = ref_t.repeat_interleave(tile, dim=-1)[..., :rows]
    elif floor is not None:
        raise ValueError("carry_mx: floor needs tile (a tile exponent); accepted: tile=128 with floor")
    ref = ref[..., None, None]
    carried = e4m3(torch.ldexp(elems, s - ref + t0))
    out = torch.ldexp(carried, ref - t0).reshape(y.shape)
    return (out, exps) if return_exps else out


class KeyTerm(NamedTuple):
    """Q smoothing's key term as the kernel's chained wgmma carries it (difference 9).

    lead : (B, H, S_k) float32, the E4M3 value in the first KEY_TERM_LEAD columns of the B operand ``Kx``.
    refine : (B, H, S_k, KEY_TERM_COLS - KEY_TERM_LEAD) float32, E4M3 values of the other columns. Both 0 on invalid
        keys.
    g : (B, H) int32, the shift ``G``.
    q_floor : (B, H) int32, the smallest Q tile exponent, ``-G - QX_MAX_LOG2``.
    bias_eff : (B, H, S_k) float32, doublings: what the term adds to key j's scores on a kept query tile.
    """

    lead: torch.Tensor
    refine: torch.Tensor
    g: torch.Tensor
    q_floor: torch.Tensor
    bias_eff: torch.Tensor


def key_term(bias: torch.Tensor, ke: torch.Tensor, valid: Optional[torch.Tensor] = None) -> KeyTerm:
    """Split Q smoothing's per-key term into the chained wgmma's E4M3 operand (difference 9).

    bias : (B, H, S_k) float32, doublings (``smoothing.key_bias``); ke : (B, H, ceil(S_k / 128)) int32, K's tile
    exponents (K = K8 2^KE); valid : (B, S_k) bool, optional, the keys before ``kv_lens`` (others count as 0).
    The same float32 operations on every backend: emulator and kernel host code get the same terms on one device.
    """
    s_k = bias.shape[-1]
    if valid is not None:
        bias = torch.where(valid[:, None, :], bias, torch.zeros_like(bias))
    ke_k = ke.repeat_interleave(TILE, dim=-1)[..., :s_k]
    y = torch.ldexp(bias.to(torch.float32), -ke_k)  # b_j 2^-KE_j, exact
    amax = y.abs().amax(dim=-1) if s_k else torch.zeros(bias.shape[:-1], device=bias.device)
    g = key_term_shift(amax)
    x = torch.ldexp(y, g[..., None])
    lead = e4m3(x / KEY_TERM_LEAD)
    r = x - KEY_TERM_LEAD * lead  # exact (Sterbenz), and |r| <= 28 * 16
    total = KEY_TERM_LEAD * lead
    refine = []
    for _ in range(KEY_TERM_COLS - KEY_TERM_LEAD):
        t = e4m3(r)
        refine.append(t)
        r = r - t  # exact: t is r rounded to 4 significant bits
        total = total + t  # exact: every partial sum is x minus a remainder on x's fp32 grid
    bias_eff = torch.ldexp(total, ke_k - g[..., None])
    return KeyTerm(lead, torch.stack(refine, dim=-1), g, -g - QX_MAX_LOG2, bias_eff)


def key_term_shift(amax: torch.Tensor) -> torch.Tensor:
    """The shift G (int32, amax's shape): the largest integer with ``amax 2^G <= KEY_TERM_CAP``, from amax's float32
    bits (``amax = m 2^e``, m in [1, 2): G is ``e_cap - e``, one less where ``m`` exceeds the capacity's mantissa),
    clamped to +-KEY_TERM_G_MAX; KEY_TERM_G_MAX where amax is 0 (or NaN).
    kernels/sm90/key_term.py computes it the same way.
    """
    bits = amax.to(torch.float32).contiguous().view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 127
    m = ((bits & 0x007FFFFF) | 0x3F800000).view(torch.float32)
    g = torch.where(m <= KEY_TERM_CAP_MANT, KEY_TERM_CAP_EXP - e, KEY_TERM_CAP_EXP - 1 - e)
    g = torch.where(amax > 0, g.clamp(-KEY_TERM_G_MAX, KEY_TERM_G_MAX), torch.full_like(g, KEY_TERM_G_MAX))
    return g.to(torch.int32)


def key_term_kept(qe: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Which query tiles keep the key term (difference 9): ``-QE_t - G >= QX_MIN_LOG2``; qe (B, H, tiles), g (B, H)."""
    return (-qe - g[..., None]) >= QX_MIN_LOG2


def operands(q, k, v, recipe: Recipe, scale: float, valid: Optional[torch.Tensor], bias: Optional[torch.Tensor] = None):
    """(Q, K, V) float32 values the sm_90 kernel multiplies; (B, H, S, D) each.

    With ``bias`` (Q smoothing's per-key term, (B, H, S_k) doublings) also ``(bias_eff (B, H, S_k), kept (B, H, S_q)
    bool)``: the term as the kernel adds it and the query rows whose tile keeps it (difference 9)."""
    rule = scale_rule(recipe, "qk", recipe.qk_format)
    vmask = None if valid is None else valid[:, None, :, None]
    if vmask is not None:  # keys past kv_lens are zero before the carry: they must not raise a tile's exponent
        k = torch.where(vmask, k, torch.zeros_like(k))
    kc, ke = carry_mx(prequantize_qk(k, recipe, 1.0), recipe.qk_format, rule, TILE, return_exps=True)
    term = None if bias is None else key_term(bias, ke, valid)
    qc, qe = carry_mx(prequantize_qk(q, recipe, scale * LOG2E), recipe.qk_format, rule, TILE,
                      floor=None if term is None else term.q_floor, return_exps=True)
    if recipe.v_format == VFormat.FP8_TENSOR:
        vc = prepare_v(v, recipe, vmask)
    else:
        y = v.to(torch.float32)
        if vmask is not None:
            y = torch.where(vmask, y, torch.zeros_like(y))
        y = round_to_bf16(y)
        # MX blocks run along the keys: quantize the transpose, reference per channel over all keys.
        yt = y.transpose(-1, -2)  # (B, H, D, S)
        s_k = yt.shape[-1]
        pad = (-s_k) % 32
        ytp = torch.nn.functional.pad(yt, (0, pad))
        vct = carry_mx(ytp, recipe.v_format, scale_rule(recipe, "v", recipe.v_format), None)
        vc = vct[..., :s_k].transpose(-1, -2)
    if term is None:
        return qc, kc, vc
    kept = key_term_kept(qe, term.g).repeat_interleave(TILE, dim=-1)[..., :q.shape[2]]
    return qc, kc, vc, (term.bias_eff, kept)


def _stage_a(x: torch.Tensor, m: torch.Tensor, sigma: int, saturate: bool, f16: bool = False) -> torch.Tensor:
    """Difference 2: the BF16 pattern of P * 2^sigma, rne(128 (X - m) + D + 128 sigma) in float64, or with
    ``f16`` (difference 7) the FP16 pattern rne(1024 (X - m) + D16 + 1024 sigma). Returns float32 values."""
    grid, bias = (1024.0, D_BITS_F16) if f16 else (128.0, D_BITS)
    t = torch.round(x.double() * grid - m.double()[..., None] * grid + (bias + grid * sigma))
    return _proxy_values(t, saturate, f16)


def stage_a_biased(s: torch.Tensor, a: torch.Tensor, m: torch.Tensor, sigma: int, exact: bool,
                   saturate: bool) -> torch.Tensor:
    """Difference 14: the INT8 kernel's Stage-A on the biased scores ``Xb = 1.5 2^23 + s``.

    Parameters
    ----------
    s : Tensor (..., rows, keys) float32, the exact integer dot products (``|s| < 2^22``).
    a : Tensor (..., rows, keys) float32, ``float32(s_q s_k)`` (doublings per unit of ``s``).
    m : Tensor (..., rows) float32, the reference (on the 1/128 grid).
    sigma, saturate : as :func:`_stage_a` (BF16 patterns); ``exact``: the exponential ``2^y`` (fp32 values of
        ``P 2^sigma``, unrounded) instead of Schraudolph's proxy.

    The fp32 FMAs are computed in float64, where ``Xb a`` (24 x 24 bits) and the difference with the constant are
    exact, and rounded to float32 once, as the FMA rounds.
    """
    if exact:
        return torch.nan_to_num(torch.exp2(_exact_argument(s, a, m, sigma)), nan=0.0)
    xb = s.double() + I2F_MAGIC
    a64 = a.double()
    m64 = m.double()[..., None]
    grid = 128.0  # the BF16 pattern's steps per doubling
    c = (I2F_MAGIC + D_BITS + grid * sigma) - grid * m64  # the unbiased constant (exact: m is on the grid)
    const = (grid * a64 * I2F_MAGIC - c).float().double()
    return _proxy_values(torch.round(xb * (grid * a64) - const - I2F_MAGIC), saturate, False)


def scores_with_key_term(s: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Difference 12: the INT8 kernel's scores in doublings with Q smoothing's key term, ``float32(s a + b_j)`` (one
    FMA; in float64 ``s a`` (an integer below 2^22 times 24 bits) and the sum are exact). ``s``, ``a`` (..., rows,
    keys), ``b`` (..., 1, keys) float32."""
    return (s.double() * a.double() + b.double()).float()


def stage_a_argument_key_term(s: torch.Tensor, a: torch.Tensor, b: torch.Tensor, m: torch.Tensor,
                              sigma: int) -> torch.Tensor:
    """Difference 12 with the exact exponential: Stage-A's argument ``z = float32(float32(Xb a - C) + b_j)`` with
    ``Xb = 1.5 2^23 + s`` and ``C = float32(a 1.5 2^23 + (m - sigma))`` (difference 14's FMA, then the term), so that
    ``2^z`` is ``P 2^sigma``. ``s``, ``a`` (..., rows, keys), ``b`` (..., 1, keys), ``m`` (..., rows) float32."""
    return (_exact_argument(s, a, m, sigma).double() + b.double()).float()


def _exact_argument(s: torch.Tensor, a: torch.Tensor, m: torch.Tensor, sigma: int) -> torch.Tensor:
    """Difference 14 with the exact exponential: Stage-A's argument ``float32(Xb a - C)`` (one FMA) with
    ``Xb = 1.5 2^23 + s`` and the row constant ``C = float32(a 1.5 2^23 + (m - sigma))``; in float64 the product and
    the difference are exact, so one rounding to float32, as the FMA's."""
    xb = s.double() + I2F_MAGIC
    a64 = a.double()
    const = (a64 * I2F_MAGIC + (m.double()[..., None] - sigma)).float().double()
    return (xb * a64 - const).float()


def _proxy_values(t: torch.Tensor, saturate: bool, f16: bool) -> torch.Tensor:
    """Stage-A's 16-bit patterns ``t`` (float64 integers, before the clamp) as float32 values: BF16 patterns, or FP16
    with ``f16``; clamped at 0 and (``saturate``) at the largest finite pattern."""
    t = torch.nan_to_num(t, nan=0.0, neginf=0.0)
    top = (F16_MAX_BITS if f16 else 65535.0) if saturate else float("inf")
    t = torch.clamp(t, min=0.0, max=top)
    if f16:  # the kernel reads the low 16 bits of the fp32 word that carries the pattern
        return (t.to(torch.int64) & 0xFFFF).to(torch.int16).view(torch.float16).to(torch.float32)
    bits = (t.to(torch.int64) << 16).to(torch.int32)
    return bits.view(torch.float32)


def stage_a_h15(x: torch.Tensor, m: torch.Tensor, sigma: int) -> torch.Tensor:
    """Difference 8: Rowmax-H15's ``(1 + 0.5 (n mod 2)) 2^(n div 2 + sigma)``, ``n = rne(2 (X - m))`` clamped at
    :data:`H15_MIN_N` (masked or NaN scores too); float32 (B, H, rows, keys) for ``x`` of that shape, ``m`` (..., rows)."""
    n = torch.round(x.double() * 2.0 - m.double()[..., None] * 2.0)
    n = torch.clamp(torch.nan_to_num(n, nan=H15_MIN_N, neginf=H15_MIN_N), min=H15_MIN_N)
    half = torch.floor(n / 2.0)
    return torch.ldexp(1.0 + 0.5 * (n - 2.0 * half), (half + sigma).to(torch.int32)).to(torch.float32)


def mxfp6_p_scaled_e4m3(p: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``fast`` kernel's Stage-B for MXFP6 P (kernels.sm90.fused_attention._stage_ab_fast), in PyTorch.

    ``p`` (..., 32k): non-negative BF16-valued float32 (Stage-A values), blocks of 32 along the last axis.
    Returns ``(p8, block_sums)``: the PV operand values and the per-block sums of the MXFP6 values.
    ``p8`` equals ``e4m3(fake_quantize_mx(p, E2M3, rule='floor'))`` exactly (tests/test_sm90_numerics.py
    checks it): with ``E`` the BF16 exponent field of the block maximum (``s = E - 129``), adding
    ``128 (123 - E)`` to the 16-bit patterns maps ``2^s`` onto E4M3's smallest normal ``2^-6``, where E4M3's
    nearest-even rounding is E2M3's (clamped at 7.5 * 2^-6); the code is rescaled by ``2^(s+6)`` (f16 in
    the kernel, exact) and rounded to E4M3 again. ``E < 7`` (block maximum below 2^-120) is treated as 7:
    those blocks' P8 is 0 either way and their sums (below 2^-110) vanish against ``l``.
    """
    u = (p.contiguous().view(torch.int32) >> 16).to(torch.int64)
    ub = u.reshape(*u.shape[:-1], -1, 32)
    e128 = torch.clamp(ub.amax(dim=-1, keepdim=True) & 0x7F80, min=896)
    g = torch.clamp(ub - e128 + 15744, min=0)
    x = (g.to(torch.int32) << 16).view(torch.float32)
    code = torch.clamp(e4m3(x), max=0.1171875)
    kexp = (e128 >> 7) - 123
    p8 = e4m3(code * torch.exp2(torch.clamp(kexp, min=-10).to(torch.float32)))
    sums = code.sum(dim=-1) * torch.exp2(kexp[..., 0].to(torch.float32))
    return p8.reshape(p.shape), sums
