"""The tests' numeric tolerances, each named for what it bounds, with its reason.

The kernel rule (a kernel's error equals its reference numerics' within 0.05 pp + 2%, outputs within 2%) and the rule
for split computations live in :mod:`fsattn_diffusers.testing` (``within_kernel_rule``, ``errors_agree``); the fuzz's
bounds in :mod:`fsattn_diffusers.measure.kernel_fuzz`. Everything else a test compares against is here, so that a
tolerance is set once and read by name. ``tests/test_tolerance_home.py`` counts the literals written anywhere else.
Errors are relative Frobenius errors ``||out - ref|| / ||ref||`` against exact (float64) attention unless a name says
otherwise; "pp" are percentage points of it.
"""

# ------------------------------------------------------------------ round-off: one quantity computed two ways
#: float64 values of order 1 that are equal in exact arithmetic (2^-52 = 2.2e-16: a few thousand ulps).
FP64_ROUNDOFF = 1e-12
#: A normalized float64 row of a few entries sums to 1 (or to equal weights) within a few ulps.
FP64_ROW_SUM = 1e-15
#: float64 exponentials at the grid's own points against torch.softmax: a few hundred ulps.
FP64_EXP_ON_GRID_REL = 1e-13
#: Two float64 gradients that take the same path (grid softmax, ends kept or detached, off the ends): rounding only.
FP64_SAME_GRADIENT = 1e-14
#: float64 arithmetic on values of order 1 to 100 (PSNR in dB, shares, a bound written to two decimals).
FP64_SLACK = 1e-9
#: float64 autograd against central finite differences (truncation error of the difference quotient).
FINITE_DIFFERENCE_GRAD = 1e-7
#: Where a grid-softmax gradient carries the ends' calibration term (kept ends, detached row sums, the two surrogate
#: placements), it is sizeable: above 1e-3, where the same path's gradients agree within FP64_SAME_GRADIENT.
GRID_ENDS_TERM_MIN = 1e-3
#: float32 results equal in exact arithmetic (2^-23 = 1.2e-7 per operation): a few ulps of values of order 1.
FP32_ROUNDOFF = 1e-6
#: float32 sums over hundreds of terms taken in another order (outputs, relative errors against float64).
FP32_ACCUMULATED = 1e-5
#: A float32 log-sum-exp or score of magnitude ~10 in another summation order, in nats.
FP32_LSE_NATS = 1e-4
#: The exact recipe (float32 arithmetic) against float64 attention, largest element difference.
FP32_ATTENTION_VS_FP64 = 2e-6
#: Sums of 32 float32 values against torch's: one rounding per add; the floor covers blocks below 2^-120.
FP32_BLOCK_SUM_REL = 2e-7
FP32_BLOCK_SUM_FLOOR = 1e-33
#: INT8 codes are integers: held as floats they differ from their rounding (and exceed INT8_MAX) by round-off only.
INT8_CODE_SLACK = 1e-3
#: The paper's tables print two decimals: a value matches when within half a unit of the last one.
PAPER_TWO_DECIMALS = 0.005

# --------------------------------------------------------- error levels of the recipes and baselines (N(0, 1) inputs)
#: Each recipe's error bound against exact attention on Gaussian inputs (exact: float32 round-off).
RECIPE_ERR_MAX = {"exact": FP32_ROUNDOFF, "bf16-emulated": 0.01, "mxfp8": 0.08, "mxfp6": 0.09, "mxfp4": 0.26}
#: BF16 rounding of Q, K, V (and P), 2^-9 relative per element: a BF16 path stays within 1%.
BF16_OPERANDS_ERR_MAX = 1e-2
#: FP8 (E4M3) Q, K, V with per-head scales: a few percent.
FP8_OPERANDS_ERR_MAX = 0.06
#: Benchmarked quantized methods (FP8 and below) on the GPU, as the benchmark's sanity bound.
BENCH_QUANTIZED_ERR_MAX = 0.1
#: A quantized path is not exact: its error exceeds 0.1%.
QUANTIZED_ERR_MIN = 1e-3
#: A stand-in computing exact attention inside a BF16 model, against stock attention (BF16 activations).
STAND_IN_MODEL_ERR_MAX = 2e-2
#: The whole tiny Wan model's output with mxfp8 attention against stock attention.
MXFP8_MODEL_OUTPUT_ERR_MAX = 1e-2
#: Element-wise, the valid rows of a quantized recipe next to non-finite rows against exact attention.
QUANTIZED_ELEMENT_ATOL = 1e-2
#: Gradients of the bf16 recipe against float32 SDPA on the same BF16 inputs (BF16 rounding of out and grads).
BF16_GRAD_ERR_MAX = 2e-2
#: Central finite differences (eps = 1e-2, float32) against the exact recipe's autograd.
FP32_FINITE_DIFFERENCE_GRAD = 2e-3

# ----------------------------------------------------------------------------- paper Table 4 (percent of error)
#: "+ l as GEMM" on BF16: paper 0.026%.
TABLE4_L_AS_GEMM_PCT_MAX = 0.05
#: "+ frozen max" on BF16: paper 0.310%.
TABLE4_FROZEN_MAX_PCT = (0.05, 0.5)
#: "+ Schraudolph U16" on BF16: the paper's 1.798%, matched within 0.1 pp.
TABLE4_SCHRAUDOLPH_U16_BF16_PCT = 1.798
TABLE4_MATCH_PP = 0.1
#: The U32 proxy equals U16's within 0.02 pp; U8's costs at least 1.5 times U16's.
TABLE4_U32_VS_U16_PP = 0.02
TABLE4_U8_OVER_U16_MIN = 1.5
#: Conventional softmax on MX operands: within 0.35 pp of the paper (0.7 pp for mxfp4, whose error is 20%).
TABLE4_CONVENTIONAL_PP = 0.35
#: Schraudolph's exponential adds under 0.5 pp to the conventional error on MX operands.
TABLE4_SCHRAUDOLPH_COST_PP_MAX = 0.5
#: The rollback gate on spiked rows gives conventional softmax's error within 0.1 pp.
ROLLBACK_EQUALS_CONVENTIONAL_PP = 0.1
#: One Schraudolph exponential against its closed form.
SCHRAUDOLPH_P_REL = 0.02

# ------------------------------------------------------------------------------------- the Hopper (sm90) numerics
#: The sm90 reference against the MI355X emulator: outputs within 3%, LSE within 0.05 nats.
SM90_VS_MI355X_OUT = 0.03
SM90_VS_MI355X_LSE = 0.05
#: The two numerics' errors against exact attention agree within 2 pp.
SM90_VS_MI355X_ERR = 0.02
#: Rowmax-H15 with MI355X semantics on the input of test_sm90_numerics: an error between 8% and 14%.
H15_MI355X_ERR = (0.08, 0.14)
#: A kernel's LSE against its reference, per row, on the kernel tests' inputs (the fuzz allows one E4M3 step of P,
#: ``kernel_fuzz.LSE_REF_MAX`` = ln(9/8) + 1e-2; these inputs stay within 5e-2).
KERNEL_LSE_VS_REFERENCE = 5e-2
#: The mean over rows of that LSE difference (most rows move far less than one step).
KERNEL_LSE_MEAN_VS_REFERENCE = 1e-2
#: A kernel's LSE against exact attention: Schraudolph's bias in l (~0.04) plus the Q/K formats' score error.
KERNEL_LSE_VS_EXACT = {"mxfp8": 0.1, "mxfp6": 0.1, "mxfp4": 0.3, "mxfp8+exponential=rowmax_h15": 0.25}
#: Identical keys (uniform rows): a kernel's LSE against exact attention within Schraudolph's bias in l plus slack.
UNIFORM_ROWS_LSE_VS_EXACT = 0.1
#: Rows dominated by one 8-doubling-high tile: the FP8 GEMMs' accumulation moves the output up to 2.6e-2 (H200).
KERNEL_HIGH_TILE_VS_REFERENCE = 4e-2
#: The sink pattern with the lowering (5.6% without it at S_k = 8192).
KERNEL_SINK_ERR_MAX = 0.035
#: gluon_pingpong against the triton variant: l summed on the tensor cores vs in fp32 (H200: LSE 1e-4 to 1.9e-3).
GLUON_VS_TRITON_OUT = 2e-3
GLUON_VS_TRITON_LSE = 5e-3
#: The INT8 tier: error at most 0.6 times mxfp8's and below 3% on its test inputs.
INT8_OVER_MXFP8_MAX = 0.6
INT8_TIER_ERR_MAX = 0.03
#: The INT8 backend against the emulator: errors within 0.2 pp, outputs within 1%.
INT8_BACKEND_ERR_AGREE = 2e-3
INT8_BACKEND_VS_EMULATOR = 1e-2
#: The exact exponential on INT8 scores at most 0.7 times the ramp's error.
INT8_EXACT_EXP_OVER_RAMP_MAX = 0.7

# --------------------------------------------------------------------------- smoothing, key term, rollback floor
#: Q/K smoothing gains: the smoothed error at most 0.8 times the unsmoothed on inputs with a shared offset.
SMOOTHING_GAIN_MAX = 0.8
#: Smoothing rounds (q - mean), (k - mean) to BF16: outputs and LSE of the exact recipe move within 2%.
SMOOTHING_BF16_ROUNDING = 2e-2
#: Smoothed quantized recipes against the exact LSE per recipe (without the offset it would be ~34 nats).
SMOOTHED_LSE_VS_EXACT = {"mxfp8": 0.1, "mxfp6": 0.15, "mxfp4": 0.3}
#: Unsmoothed paper preset on a shared +3 offset fails (> 50%); the default stays within 2.5 times its Gaussian error.
OFFSET_BREAKS_PAPER_MIN = 0.5
OFFSET_DEFAULT_OVER_GAUSSIAN_MAX = 2.5
#: Garbage queries past q_lens move the valid rows by more than this without q_lens (the case the argument is for).
GARBAGE_MOVES_ROWS_MIN = 1e-3
#: The key term's reference against the emulator: within 1.25 times its error plus 0.5 pp.
KEY_TERM_ERR_RATIO = 1.25
KEY_TERM_ERR_FLOOR = 5e-3
#: The key term on a slice of small queries against exact attention.
KEY_TERM_SMALL_SLICE_ERR = 0.05
#: Key halves merged by LSE: within 1.2 times one call's error plus 0.2 pp; 0.2 pp is also what the lowering may
#: cost where it has nothing to recover.
ROLLBACK_MERGED_RATIO = 1.2
ROLLBACK_SLACK_PP = 2e-3
#: The lowering on sm90: without it the sink input errs > 5%; with it at most 0.6 times that and below 3.5%.
ROLLBACK_OFF_ERR_MIN = 0.05
ROLLBACK_GAIN_MAX = 0.6
ROLLBACK_ON_ERR_MAX = 0.035
#: A far sink: error below 7%, LSE unchanged by the lowering within 1e-3 nats (the sink holds all the mass).
FAR_SINK_ERR_MAX = 0.07
FAR_SINK_LSE = 1e-3
#: The diagonal key order lowers the locality family's error by at least 0.15 pp.
DIAGONAL_ORDER_GAIN_MIN = 1.5e-3
#: Another key order changes a quantized output, by less than 10%.
KEY_ORDER_CHANGE_MAX = 0.1
#: The frozen-max offset: lowers the locality family's error by 0.2 pp and costs Gaussian inputs under 0.1 pp.
FROZEN_OFFSET_LOCALITY_GAIN = 0.002
FROZEN_OFFSET_GAUSSIAN_COST = 0.001

# ------------------------------------------------------------------------------------------ inputs and extremes
#: Extreme inputs: the pipeline within 1.05 times conventional softmax on the same operands plus 0.1 pp.
EXTREME_PIPELINE_RATIO = 1.05
EXTREME_PIPELINE_FLOOR = 1e-3
#: Sharp scores: the gate fires on most tiles, conventional errs > 20%, BF16 > 2% (any rounding flips the winner).
EXTREME_ROLLBACK_RATE_MIN = 0.5
EXTREME_CONVENTIONAL_ERR_MIN = 0.2
EXTREME_BF16_ERR_MIN = 0.02
#: A block maximum just below 1.75 quantizes (round_up_175) to within 1% of 1.75.
E4M3_ROUNDTRIP = 0.01
#: The structured families: mean-vector norms within 5%, channel means within 0.3 of their offset, a shared Q/K
#: direction with cosine > 0.99, outlier-free channels with std < 1.2, a sink holding > 60% of the mass (< 1% on
#: Gaussian inputs).
FAMILY_OFFSET_NORM_REL = 0.05
FAMILY_CHANNEL_MEAN = 0.3
FAMILY_SHARED_DIRECTION_COS = 0.99
FAMILY_PLAIN_CHANNEL_STD_MAX = 1.2
FAMILY_SINK_MASS_MIN = 0.6
GAUSSIAN_FIRST_KEY_MASS_MAX = 0.01
#: The fake FA3's columns: FP8 per-head scales err 1% to 8%, BF16 under 0.5%.
FAKE_FA3_FP8_ERR = (0.01, 0.08)
FAKE_FA3_BF16_ERR_MAX = 0.005
#: A structured-suite cell of a quantized recipe: between 1% and 50%.
SUITE_CELL_ERR = (0.01, 0.5)
#: The suite's error on 128 query rows equals the full one within 1 pp.
SUITE_SUBSAMPLE_PP = 0.01

# --------------------------------------------------------------------------- interventions, quality, parallel
#: JSD-matched interventions (bisection on the scaling) reach their target JSD within 0.1% relative.
JSD_TARGET_REL = 1e-3
#: top:0.5 zeroes half of each row's mass within one key in 100.
ZERO_SHARE_ABS = 0.01
#: Captured calls: error under 50% (a sanity bound on real activations).
CAPTURED_ERR_PCT_MAX = 50.0
#: The tiny sweep's frames: PSNR above 20 dB against bf16.
SWEEP_PSNR_DB_MIN = 20.0
#: Sharded quantized runs against one process: cosine above 0.999.
SHARDED_COSINE_MIN = 0.999

# ------------------------------------------------------------------ the int8-fp8 speed tier (reference, CPU shapes)
#: The tier's error over SageAttention 2's CPU model at (1, 2, 1024, 64), one seed (the bar is 1.10x on gaussian at
#: the suite's shape; the small shape and one seed add noise).
INT8_FP8_OVER_SAGE2_MODEL_MAX = 1.15
#: The tier's error against exact at those shapes (normal and structured inputs: 3.5-4.5%).
INT8_FP8_ERR_MAX = 0.05
#: On awkward shapes with padded keys (fewer keys: a little more noise).
INT8_FP8_AWKWARD_ERR_MAX = 0.06
#: Its LSE against exact, natural log (P's 2^4 taken out; the frozen reference on the 1/128 grid).
INT8_FP8_LSE_NATS = 0.05
#: One E4M3 value times an fp32 channel scale computed two ways (scale = amax / 448): fp32 rounding.
FP8_CHANNEL_SCALED_ATOL = 1e-7
#: O chained on the FP8 tensor cores without the fp32 promotion moves a sharp-row output by less than this.
PROMOTION_MOVE_MAX = 0.05

#: The INT8 reference with Stage-A on biased scores (sm90_numerics difference 14) against Stage-A from float32(S a):
#: errors against exact attention within this share (Schraudolph: the constant rounds to the pattern's integer grid,
#: up to 1/256 doubling per row and key tile; CPU, gaussian D 128: 2.190% -> 2.197%).
INT8_BIASED_ERR_MOVE_MAX = 0.01

#: The reference with Q smoothing's key term folded into Stage-A's argument (sm90_numerics difference 12) against the
#: scores path (the term added to float32(S a), Stage-A on float32(y - m)) on offset inputs, (1, 2, 384, 64): the two
#: differ by roundings at the argument's magnitude, which move an E4M3 / BF16 P where it lies at a rounding tie
#: (measured: outputs 1.9e-4 - 2.9e-4 apart, errors within 1e-5).
KEY_TERM_FOLD_OUT_MAX = 2e-3
KEY_TERM_FOLD_ERR_MOVE_MAX = 2e-4
#: Their LSE: at most one E4M3 step of a row's dominant weight, ln(9/8) < 0.12 nats (measured: 8e-4 - 2.9e-3).
KEY_TERM_FOLD_LSE_NATS = 0.12
#: A bound computed as a sum of half-ulps in float64 against a difference computed there: relative slack.
HALF_ULP_BOUND_SLACK = 1e-9
