"""What the pre-pass finds besides the operands, on a CUDA GPU (sm_90+) or under Triton's interpreter
(``FSATTN_KERNEL_TEST_CPU=1 TRITON_INTERPRET=1``): K's (and Q's) token mean (``kernels.token_mean``, bit-identical to
``smoothing.token_mean``) and the per-(batch, head) non-finite flags (equal to ``nonfinite.detect``'s), and the public
call's repair of the slices they flag. Every test prints its numbers before asserting."""

import math
import warnings

import pytest
import torch

from kernel_device import CPU_INTERPRET, DEV, make, skip_module_without_sm90  # noqa: E402

skip_module_without_sm90()
pytest.importorskip("triton")

import fsattn_diffusers as fa  # noqa: E402
from fsattn_diffusers import nonfinite  # noqa: E402
from fsattn_diffusers.recipe import get_recipe  # noqa: E402
from fsattn_diffusers.smoothing import q_smoothing_heads  # noqa: E402
from fsattn_diffusers.smoothing import token_mean as reference_token_mean  # noqa: E402
from fsattn_diffusers.testing import exact_attention  # noqa: E402

from fsattn_diffusers.kernels.sm90.ops import prepass  # noqa: E402
from fsattn_diffusers.kernels.sm90.plan import plan_for  # noqa: E402
from fsattn_diffusers.kernels.token_mean import CHUNK, token_mean  # noqa: E402
from fsattn_diffusers.kernels.common import pow2, shared_exp  # noqa: E402
from fsattn_diffusers.kernels.sm90.prepass import INTERPRET, _round_elems  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.gpu


def _plant_nonfinite(q, k, v, dtype):
    """NaN/inf at slice edges and past kv_lens = [200, 1, 100] (q (3, H, 70, D), k/v (3, H, 200, D), H = 4 or 2); with
    those lengths the flagged slices are (0, 1) and (1, H - 2). fp32: also a large finite value, which is never
    flagged."""
    h = q.shape[1]
    q[0, 1, 69, 63] = float("nan")  # the last row and column of a slice
    k[1, h - 2, 0, 0] = float("inf")
    v[2, h - 1, 150, 7] = float("-inf")  # past kv_lens[2] = 100: ignored there
    k[2, 0, 199, 5] = float("nan")  # likewise
    if dtype == torch.float32:
        v[1, 0 if h > 2 else 1, 3, 3] = 3e38  # large but finite (BF16's largest is 3.39e38), in an unflagged slice


def _structured(x, kind, g):
    """Offsets shared by the tokens, channel outliers, tiny values beside large ones."""
    d = x.shape[-1]
    if kind == "offset":
        return x + 3.0
    if kind == "outliers":
        return x * torch.where(torch.rand(d, generator=g) < 0.1, 100.0, 1.0)
    if kind == "mixed_magnitudes":
        return x * torch.exp2(torch.randint(-30, 10, x.shape, generator=g).float())
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("kind", ["gaussian", "offset", "outliers", "mixed_magnitudes"])
def test_token_mean_kernel_is_bit_identical_to_the_pytorch_mean(dtype, kind):
    if CPU_INTERPRET and dtype == torch.float16:
        pytest.skip("Triton's interpreter: bfloat16 and float32 (float16 runs the same kernel code); all on the GPU")
    g = torch.Generator().manual_seed(3)
    b, h, s, d = 3, 2, 2 * CHUNK + 77, 64  # three chunks, the last one partial
    x = _structured(torch.randn(b, h, s, d, generator=g), kind, g).to(dtype)
    lens = torch.tensor([s, CHUNK, 0])  # a whole slice, exactly one chunk, no valid token
    valid = torch.arange(s)[None, :] < lens[:, None]
    # Triton's interpreter runs one code for any strides (a GPU compiles unit and 16-divisible strides apart): there
    # the strided layout only
    for strided in (True,) if CPU_INTERPRET else (False, True):
        xs = (x.transpose(1, 2).contiguous().transpose(1, 2) if strided else x).to(DEV)
        for kv in (None, lens):
            got = token_mean(xs, None if kv is None else kv.to(DEV)).cpu()
            want = reference_token_mean(x, None if kv is None else valid)
            diff = int((got != want).sum())
            print(f"{dtype} {kind} strided={strided} kv_lens={None if kv is None else kv.tolist()}: {diff} of "
                  f"{want.numel()} means differ; max |mean| {float(want.abs().max()):.3g}")
            assert diff == 0
    assert not torch.equal(x.cpu(), torch.zeros_like(x.cpu()))  # the input is what it was (no in-place change)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_token_mean_kernel_selects_the_slices_q_smoothing_selects(dtype):
    """kernels.token_mean's per-slice switch = smoothing.q_smoothing_heads, the mean zeroed where it is off; ratios
    from ~1/sqrt(S) (no shared component) to ~3, and one slice placed on either side of the threshold."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 6, 777, 64, generator=g)
    x[0, 1] += 3.0
    x[1, 2] += torch.randn(64, generator=g)  # a random shared direction
    x[1, 3] += 0.12 * torch.randn(64, generator=g) / 0.125  # near the 0.1 threshold
    x = x.to(dtype)
    ratio2 = float(torch.tensor(0.1 ** 2, dtype=torch.float32))
    mean, sel = token_mean(x.to(DEV), ratio2=ratio2)
    want = q_smoothing_heads(x, 0.1).reshape(-1)
    full = reference_token_mean(x)
    print(f"{dtype}: selected {sel.tolist()}")
    assert torch.equal(sel.cpu().bool(), want) and 0 < int(want.sum()) < 12
    assert torch.equal(mean.cpu(), torch.where(want.view(2, 6, 1, 1), full, torch.zeros_like(full)))


def test_token_mean_kernel_leaves_its_input_alone_and_ignores_garbage_past_kv_lens():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 300, 128, generator=g).bfloat16()
    lens = torch.tensor([300, 120])
    noisy = x.clone()
    noisy[1, :, 120:] = float("nan")  # padded keys: never read
    before = noisy.clone()
    got = token_mean(noisy.to(DEV), lens.to(DEV)).cpu()
    want = token_mean(x.to(DEV), lens.to(DEV)).cpu()
    print("max |mean(garbage-padded) - mean(clean)|:", float((got - want).abs().max()))
    assert torch.equal(got, want) and torch.isfinite(got).all()
    assert torch.equal(noisy.view(torch.int16), before.view(torch.int16))


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp6", "mxfp4", "mxfp8+smooth_q+smooth_q_min_ratio=0", "mxfp8-paper"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prepass_flags_equal_the_pytorch_detector_and_leave_the_operands_alone(recipe, dtype):
    if CPU_INTERPRET and dtype == torch.float32 and recipe != "mxfp8":
        pytest.skip("Triton's interpreter: float32 inputs with mxfp8 only (the CI's time); every recipe and dtype "
                    "on the GPU")
    # Triton's interpreter: 2 heads, not 4 (its time grows with the slices, each a full chunk of the token mean)
    h = 2 if CPU_INTERPRET else 4
    q, k, v = (t.to(dtype) for t in make(3, h, 70, 200, 64, "bshd", seed=5))
    clean = [t.clone() for t in (q, k, v)]
    _plant_nonfinite(q, k, v, dtype)
    before = [t.clone() for t in (q, k, v)]
    plan = plan_for(get_recipe(recipe))
    lens = torch.tensor([200, 1, 100], dtype=torch.int32, device=DEV)
    scale = 64 ** -0.5
    for kv in (None, lens):
        flags = torch.zeros((3 * h,), dtype=torch.int32, device=DEV)
        prepass(q, k, v, plan, scale, kv, flags=flags)
        want = nonfinite.detect(q, k, v, kv)
        got = flags.view(3, h) > 0
        print(f"{recipe} {dtype} kv_lens={None if kv is None else kv.tolist()}: pre-pass {got.nonzero().tolist()} "
              f"pytorch {want.nonzero().tolist()}")
        assert torch.equal(got, want)
    assert (flags.view(3, h) > 0).nonzero().tolist() == [[0, 1], [1, h - 2]]
    for a, b_ in zip((q, k, v), before):
        assert torch.equal(a.contiguous().view(torch.uint8), b_.contiguous().view(torch.uint8)), "inputs changed"
    # the flags ride along: the operands of finite inputs are the same with and without them (Kx: the rows of the
    # slices Q smoothing's switch selects; the others are left unwritten and never loaded, kernels.sm90.key_term)
    with_flags = prepass(*clean, plan, scale, lens, flags=torch.zeros((3 * h,), dtype=torch.int32, device=DEV))
    without = prepass(*clean, plan, scale, lens)
    for name, a, b_ in zip(with_flags._fields, with_flags, without):
        if isinstance(a, torch.Tensor):
            a, b_ = (t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t for t in (a, b_))
            if name == "kx" and without.q_sel is not None:
                assert torch.equal(with_flags.q_sel, without.q_sel)
                sel = without.q_sel.bool()
                a, b_ = (t.view(sel.numel(), -1)[sel] for t in (a, b_))
            assert torch.equal(a, b_), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_nonfinite_flags_kernel_matches_the_pytorch_detector(dtype, layout):
    from fsattn_diffusers.backends import detect_nonfinite
    from fsattn_diffusers.kernels.nonfinite_flags import flag_nonfinite

    q, k, v = (t.to(dtype) for t in make(3, 4, 70, 200, 64, layout, seed=5))
    _plant_nonfinite(q, k, v, dtype)
    before = [t.clone() for t in (q, k, v)]
    lens = torch.tensor([200, 1, 100], dtype=torch.int32, device=DEV)
    for kv in (None, lens):
        got = flag_nonfinite(q, k, v, kv)
        want = nonfinite.detect(q, k, v, kv)
        print(f"{dtype} {layout} kv_lens={None if kv is None else kv.tolist()}: kernel {got.nonzero().tolist()} "
              f"pytorch {want.nonzero().tolist()}")
        assert torch.equal(got, want)
        assert torch.equal(detect_nonfinite(q, k, v, kv), want)
    assert flag_nonfinite(q, k, v, lens).nonzero().tolist() == [[0, 1], [1, 2]]
    for a, b_ in zip((q, k, v), before):
        assert torch.equal(a.view(torch.uint8) if a.is_contiguous() else a.contiguous().view(torch.uint8),
                           b_.contiguous().view(torch.uint8)), "inputs must not change"


@pytest.mark.skipif(DEV != "cuda", reason="the public call's Triton backend needs a CUDA device")
def test_public_call_repairs_a_nonfinite_slice_found_by_the_prepass():
    q, k, v = make(2, 3, 300, 257, 128, "bshd", seed=9)
    clean = fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="triton")
    k_bad = k.clone()
    k_bad[1, 2, 40, 3] = float("nan")
    with warnings.catch_warnings():  # the one warning per process may have been given already
        warnings.simplefilter("ignore", RuntimeWarning)
        out = fa.attention(q, k_bad, v, "mxfp8", layout="bhsd", backend="triton")
    others = torch.ones((2, 3), dtype=torch.bool)
    others[1, 2] = False
    print("flagged slice NaN rows:", int(torch.isnan(out[1, 2]).any(dim=-1).sum()), "of", out.shape[2])
    assert torch.equal(out[others], clean[others]), "unflagged slices: the kernel's own result"
    # Flagged slice: exact float64 softmax attention, where key 40's NaN score reaches every row.
    ex, _ = exact_attention(q, k_bad, v, 1.0 / math.sqrt(128), None)
    assert torch.isnan(ex[1, 2]).all() and torch.isnan(out[1, 2]).all(), "flagged slice: exact attention"


@pytest.mark.skipif(DEV != "cuda", reason="the public call's Triton backend needs a CUDA device")
def test_public_call_ignores_garbage_past_kv_lens_and_strict_raises_before_any_work():
    q, k, v = make(2, 2, 200, 300, 64, "bhsd", seed=11)
    lens = [300, 150]
    clean = fa.attention(q, k, v, "mxfp8", layout="bhsd", kv_lens=lens, backend="triton")
    k_pad, v_pad = k.clone(), v.clone()
    k_pad[1, :, 150:] = float("nan")
    v_pad[1, :, 150:] = float("inf")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no warning: nothing past kv_lens is read
        out = fa.attention(q, k_pad, v_pad, "mxfp8", layout="bhsd", kv_lens=lens, backend="triton")
    print("max |out(garbage past kv_lens) - out(clean)|:", float((out.float() - clean.float()).abs().max()))
    assert torch.equal(out, clean)
    q_bad = q.clone()
    q_bad[0, 1, 5, 0] = float("inf")
    with pytest.raises(ValueError, match="non-finite") as err:
        fa.attention(q_bad, k, v, "mxfp8", layout="bhsd", backend="triton", strict=True)
    print("strict:", err.value)
    assert "\n" not in str(err.value)


@triton.jit
def _round_elems_kernel(T, OUT, MBITS: tl.constexpr, EMIN: tl.constexpr, MAXV: tl.constexpr, HW_CVT: tl.constexpr,
                        FAST: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    elem, e6 = _round_elems(tl.load(T + offs), MBITS, EMIN, MAXV, HW_CVT, FAST)
    tl.store(OUT + offs, elem * pow2(tl.zeros((BLOCK,), tl.int32) + e6))


@pytest.mark.parametrize("fmt", ["e2m3", "e2m1"])
def test_short_element_roundings_equal_round_to_elem(fmt):
    """The pre-pass's element rounding (``prepass._round_elems``) with its short forms (E2M3 by the hardware E4M3 cast,
    on a GPU; E2M1 on the fp32 bits) and with the bit arithmetic of ``common.round_elem`` equals
    ``formats.round_to_elem`` (values; zeros of either sign count as zero): every multiple of 2^-12 in [-8, 8) and both fp32 neighbours of each
    (the grid midpoints and their nearest values included)."""
    import numpy as np

    from fsattn_diffusers.formats import ELEM_FORMATS, round_to_elem

    f = ELEM_FORMATS[fmt]
    grid = np.arange(-8 * 4096, 8 * 4096, dtype=np.float64).astype(np.float32) / np.float32(4096)
    vals = np.concatenate([grid, np.nextafter(grid, np.float32(np.inf)), np.nextafter(grid, np.float32(-np.inf)),
                           np.array([-0.0], np.float32)])
    vals = vals[np.abs(vals) < 8]
    block = 1024
    t = torch.zeros(-(-vals.size // block) * block, dtype=torch.float32)
    t[:vals.size] = torch.from_numpy(vals)
    t = t.to(DEV)
    want = round_to_elem(t.cpu(), f)
    for fast in (False, True):
        got = torch.empty_like(t)
        _round_elems_kernel[(t.numel() // block,)](t, got, MBITS=f.mbits, EMIN=f.emin, MAXV=f.max_value,
                                             HW_CVT=not INTERPRET, FAST=fast, BLOCK=block)
        got = got.cpu()
        diff = got != want  # values: a zero's sign is not kept by round_elem, and E4M3 carries both zeros as zero
        bad = int(diff.sum())
        print(f"{fmt} fast={fast}: {bad} of {t.numel()} values differ from round_to_elem; first inputs "
              f"{t.cpu()[diff][:4].tolist()} -> {got[diff][:4].tolist()} (want {want[diff][:4].tolist()})")
        assert bad == 0


@triton.jit
def _shared_exp_kernel(A, OUT, RULE: tl.constexpr, EMAX: tl.constexpr, MAXV: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, shared_exp(tl.load(A + offs), RULE, EMAX, MAXV))


@pytest.mark.parametrize("fmt", ["e4m3", "e2m3", "e2m1"])
def test_ceil_scale_rule_without_division_equals_the_reference(fmt):
    """``common.shared_exp``'s ceil rule (bit arithmetic, no division) equals ``formats.shared_exponent(amax, fmt,
    'ceil')`` for every fp32 mantissa at the subnormal exponent and at 2^1, every seventh at the smallest normal
    exponents, around 1 and at the top of the range, and for zero."""
    from fsattn_diffusers.formats import ELEM_FORMATS, shared_exponent

    f = ELEM_FORMATS[fmt]
    mant = torch.arange(0, 1 << 23, dtype=torch.int32)
    bits = torch.cat([mant | (0 << 23), mant | (128 << 23)] + [mant[::7] | (e << 23) for e in (1, 2, 127, 253, 254)])
    bits = torch.cat([bits, torch.zeros((-bits.numel()) % (1 << 16), dtype=torch.int32)])  # whole blocks
    amax = bits.view(torch.float32)
    want = shared_exponent(amax, f, "ceil")
    got = torch.empty(amax.shape, dtype=torch.int32, device=DEV)
    block = 1 << 16
    _shared_exp_kernel[(amax.numel() // block,)](amax.to(DEV), got, RULE=2, EMAX=f.emax, MAXV=f.max_value, BLOCK=block)
    diff = got.cpu() != want
    bad = int(diff.sum())
    print(f"{fmt}: {bad} of {amax.numel()} exponents differ; first amax {amax[diff][:4].tolist()} -> "
          f"{got.cpu()[diff][:4].tolist()} (want {want[diff][:4].tolist()})")
    assert bad == 0
