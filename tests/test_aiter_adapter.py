"""The AITER adapter's argument mapping, against a stand-in ``aiter.ops.mha_v4`` (no MI355X here)."""

import enum
import sys
import types
import warnings

import pytest
import torch

import fsattn_diffusers as fa
from fsattn_diffusers.backends import aiter_backend
from fsattn_diffusers.hadamard import rotation_signs
from fsattn_diffusers.smoothing import subtract_mean, token_mean


class AttentionFormat(enum.IntEnum):  # the names AITER exposes (values as in its tests)
    FP8_E4M3 = 3
    FP6_E2M3 = 7
    MXFP6 = 7
    FP4_E2M1 = 9
    MXFP4 = 9


@pytest.fixture
def fake_aiter(monkeypatch):
    calls = []

    def mha_v4(q, k, v, qf, kf, vf, softmax_scale=None, out=None, return_lse=False):
        calls.append(("mha_v4", q, (qf, kf, vf), softmax_scale, k))
        return q.flip(-1)  # any deterministic function of q, to check the layout round trip

    def mha_v4_mxfp8(q, k, v, softmax_scale=None, out=None, return_lse=False):
        calls.append(("mha_v4_mxfp8", q, (), softmax_scale, k))
        return q.flip(-1)

    mod = types.SimpleNamespace(AttentionFormat=AttentionFormat, mha_v4=mha_v4, mha_v4_mxfp8=mha_v4_mxfp8)
    monkeypatch.setitem(sys.modules, "aiter", types.ModuleType("aiter"))
    monkeypatch.setitem(sys.modules, "aiter.ops", types.ModuleType("aiter.ops"))
    monkeypatch.setitem(sys.modules, "aiter.ops.mha_v4", mod)
    from fsattn_diffusers import backends

    monkeypatch.setattr(backends._REGISTRY["aiter"], "available", lambda device: None)
    return calls


@pytest.mark.parametrize("paper", [True, False], ids=["paper", "default"])
@pytest.mark.parametrize("recipe,fn,formats", [
    ("mxfp8", "mha_v4_mxfp8", ()),
    ("mxfp6", "mha_v4", (AttentionFormat.MXFP6,) * 3),
    ("mxfp4", "mha_v4", (AttentionFormat.MXFP4,) * 3),
])
@pytest.mark.filterwarnings("ignore:fsattn. AITER mha_v4 .* is not applied there:fsattn_diffusers.notices.FSAttnWarning")
def test_recipes_map_to_aiter_calls(fake_aiter, recipe, fn, formats, paper):
    """The paper presets reach AITER's kernels with the inputs as they are; the default presets with K smoothed and
    the channel signs of the signed rotation applied on the host (AITER's kernel rotates by H itself)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 40, 2, 128, generator=g)
    k = torch.randn(1, 40, 2, 128, generator=g) + 3.0  # a shared offset, for K smoothing to remove
    before = (q.clone(), k.clone())
    name_ = recipe + ("-paper" if paper else "")
    out = fa.attention(q, k, k, name_, backend="aiter", scale=0.07)
    name, q_seen, fmts, scale, k_seen = fake_aiter[-1]
    assert (name, fmts, scale) == (fn, formats, 0.07)
    assert q_seen.dtype == torch.bfloat16 and q_seen.is_contiguous() and q_seen.shape == (1, 40, 2, 128)
    signs = torch.ones(128) if paper else rotation_signs(128)
    k_host = k.bfloat16().float()
    if not paper:  # what the emulator subtracts (smoothing.smooth_inputs), on the BHSD view
        kh = k.transpose(1, 2)
        k_host = subtract_mean(kh, token_mean(kh)).transpose(1, 2)
    print(f"{name_}: |mean of K seen| {k_seen.float().mean(dim=1).abs().max():.3e}")
    assert torch.equal(q_seen.float(), q.bfloat16().float() * signs)
    assert torch.equal(k_seen.float(), k_host * signs)
    assert out.dtype == q.dtype and torch.equal(out, (q.bfloat16() * signs.bfloat16()).flip(-1).float())
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])  # the caller's tensors untouched


def test_mxfp8_falls_back_to_mha_v4_formats_without_the_old_entry(fake_aiter):
    mod = sys.modules["aiter.ops.mha_v4"]
    del mod.mha_v4_mxfp8
    fn, formats = aiter_backend.aiter_call(fa.PRESETS["mxfp8"], mod)
    assert fn is mod.mha_v4 and formats == (AttentionFormat.FP8_E4M3,) * 3


@pytest.mark.parametrize("kwargs,why", [
    (dict(recipe=fa.PRESETS["mxfp8"].replace(proxy="u32")), "AITER runs only the presets"),
    (dict(recipe="mxfp8+smooth_q+smooth_q_min_ratio=0"), "Q smoothing selects 2 of 2"),
    (dict(recipe="mxfp8+smooth_q", offset=3.0), "Q smoothing selects 2 of 2"),
    (dict(kv_lens=[20]), "key-padding"),
    (dict(return_lse=True), "no LSE"),
])
def test_cases_aiter_cannot_take_fall_back_with_a_warning(fake_aiter, kwargs, why):
    from fsattn_diffusers import backends

    backends._WARNED.clear()
    q = torch.randn(1, 400, 2, 128, generator=torch.Generator().manual_seed(0)) + kwargs.pop("offset", 0.0)
    recipe = kwargs.pop("recipe", "mxfp6")
    with pytest.warns(RuntimeWarning, match=why):
        fa.attention(q, q, q, recipe, backend="aiter", **kwargs)
    assert not fake_aiter  # never called


@pytest.mark.parametrize("offset_rows,runs_aiter", [("padded", True), ("valid", False)])
def test_q_smoothing_switch_counts_only_the_queries_before_q_lens(fake_aiter, offset_rows, runs_aiter):
    """With ``q_lens``, the default preset's Q-smoothing switch looks at the valid queries only: padded rows with a
    large shared offset leave the call on AITER; the same offset on the valid rows sends it to the fallback."""
    from fsattn_diffusers import backends

    backends._WARNED.clear()
    q = torch.randn(1, 400, 2, 128, generator=torch.Generator().manual_seed(0))
    rows = slice(300, None) if offset_rows == "padded" else slice(None, 300)
    q[:, rows] += 3.0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fa.attention(q, q, q, "mxfp8", backend="aiter", q_lens=[300])
    fallbacks = [str(w.message) for w in seen if "falling back" in str(w.message)]
    print(offset_rows, [c[0] for c in fake_aiter], fallbacks)
    assert bool(fake_aiter) == runs_aiter
    assert bool(fallbacks) != runs_aiter
    if not runs_aiter:
        assert "Q smoothing selects 2 of 2" in fallbacks[0]
    assert torch.isfinite(out).all()


def test_head_dim_other_than_128_is_refused(fake_aiter):
    from fsattn_diffusers.backends import AttentionRequest

    q = torch.randn(1, 2, 40, 64)
    assert "head dim 128" in aiter_backend._unsupported(AttentionRequest(q, q, q, fa.PRESETS["mxfp6"], 0.125))


def test_unavailable_without_rocm():
    assert "not ROCm" in aiter_backend._available(torch.device("cpu"))


def test_the_key_order_and_the_raised_reference_run_aiters_own_and_say_so_once(fake_aiter):
    """AITER's kernel takes no key order and no offset of the frozen reference: the default presets (diagonal; mxfp6
    and mxfp4 also raised by 3/32) still run there, with one warning per process and field naming it; the paper
    presets warn nothing."""
    from fsattn_diffusers import backends

    backends._WARNED.clear()
    q = torch.randn(1, 40, 2, 128, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for name in ("mxfp8-paper", "mxfp6-paper", "mxfp8", "mxfp8", "mxfp6", "mxfp4"):
            fa.attention(q, q, q, name, backend="aiter")
    notes = [str(w.message) for w in seen if "not applied" in str(w.message)]
    print(notes)
    assert len(notes) == 2 and all("\n" not in n for n in notes)
    assert "key_order='diagonal'" in notes[0] and "frozen_max_offset_log2=0.09375" in notes[1]
    assert [c[0] for c in fake_aiter] == ["mha_v4_mxfp8", "mha_v4", "mha_v4_mxfp8", "mha_v4_mxfp8", "mha_v4",
                                          "mha_v4"]
