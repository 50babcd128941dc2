"""xDiT adapter: the kernel contract checked directly, the registry hook on a stand-in registry, step
following under CFG, the runner's argument handling, and the LSE merge helper.

xfuser 0.7 does not import on a CPU-only torch (it needs triton and CUDA), so the registry, the backend
enum and the runtime state are stand-ins with xfuser's names and behaviour (read from its source):
``ATTENTION_FUNCTION_REGISTRY[AttentionBackendType.X]`` looked up at every call, a runtime state with
``attention_backend`` / ``cross_attention_backend`` whose setters validate against ring attention.
"""

import math
from enum import Enum

import pytest
import torch

import fsattn_diffusers as fa
from fsattn_diffusers.integration.policy import entry_name
from fsattn_diffusers.parallel import XDiTAttention, install, merge_by_lse
from fsattn_diffusers.pipelines.xdit_video import split_argv, xdit_argv
from tolerances import FP32_ACCUMULATED, FP32_LSE_NATS

RECIPES = ["exact", "bf16-emulated", "mxfp8", "mxfp6", "mxfp4"]


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def stock_kernel(query, key, value, dropout_p=0.0, is_causal=False, attention_kwargs=None):
    """A bf16 kernel with xDiT's contract (what SDPA_FLASH / CUDNN compute)."""
    s = torch.matmul(query.float(), key.float().transpose(-1, -2)) * query.shape[-1] ** -0.5
    return torch.matmul(torch.softmax(s, -1), value.float()).to(query.dtype), torch.logsumexp(s, -1)


# ---- the contract ------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", RECIPES)
def test_contract_layout_dtype_and_lse(recipe):
    """(B, H, S, D) in, (out (B, H, S_q, D) in q's dtype, natural-log fp32 LSE (B, H, S_q)) out."""
    q, k, v = rand(1, 2, 96, 64, seed=1), rand(1, 2, 160, 64, seed=2), rand(1, 2, 160, 64, seed=3)
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    # A Recipe object, not the name: in a policy the name "bf16" means the stock kernel.
    fn = XDiTAttention(fa.PRESETS[recipe], stock_kernel)
    out, lse = fn(q, k, v, dropout_p=0.0, is_causal=False, attention_kwargs=None)
    assert out.shape == (1, 2, 96, 64) and out.dtype == torch.bfloat16
    assert lse.shape == (1, 2, 96) and lse.dtype == torch.float32
    want_out, want_lse = fa.attention(q, k, v, recipe, layout="bhsd", return_lse=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_contract_scale_is_inverse_sqrt_head_dim_and_lse_natural_log():
    q, k, v = rand(2, 3, 70, 64, seed=4), rand(2, 3, 130, 64, seed=5), rand(2, 3, 130, 64, seed=6)
    out, lse = XDiTAttention("exact", stock_kernel)(q, k, v, 0.0, False)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) / math.sqrt(64)
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double())
    print(f"out max err {(out.double() - ref).abs().max():.2e}, "
          f"lse max err {(lse.double() - torch.logsumexp(scores, -1)).abs().max():.2e}")
    assert torch.allclose(out.double(), ref, atol=FP32_ACCUMULATED)
    assert torch.allclose(lse.double(), torch.logsumexp(scores, -1), atol=FP32_LSE_NATS)


def test_policy_name_bf16_means_the_stock_kernel():
    q = rand(1, 2, 64, 32, seed=15)
    assert torch.equal(XDiTAttention("bf16", stock_kernel)(q, q, q, 0.0, False)[0], stock_kernel(q, q, q)[0])


def test_lse_skipped_when_ring_is_off():
    q = rand(1, 2, 64, 32, seed=7)
    out, lse = XDiTAttention("mxfp8", stock_kernel, need_lse=lambda: False)(q, q, q, 0.0, False, None)
    assert lse is None and out.shape == q.shape


#: The one-time notice of a call falling back to the stock xDiT kernel: these tests are about the fallback itself.
STOCK_KERNEL_NOTICE = "ignore:fsattn. using the stock xDiT kernel instead:fsattn_diffusers.notices.FSAttnWarning"


@pytest.mark.parametrize("call,note", [
    (dict(is_causal=True), "causal"), (dict(dropout_p=0.1), "dropout"),
    (dict(attention_kwargs={"attn_mask": torch.ones(1, 1, 64, 64, dtype=torch.bool)}), "masked"),
])
@pytest.mark.filterwarnings(STOCK_KERNEL_NOTICE)
def test_calls_fsattn_cannot_take_run_the_stock_kernel(call, note):
    q = rand(1, 2, 64, 32, seed=8)
    fn = install("mxfp6", **fake_xdit()).function
    out, lse = fn(q, q, q, **{"dropout_p": 0.0, "is_causal": False, **call})
    assert torch.equal(out, stock_kernel(q, q, q)[0])
    assert fn.tracker.records[-1].recipe == "bf16" and note in fn.tracker.records[-1].note


@pytest.mark.filterwarnings(STOCK_KERNEL_NOTICE)
def test_unsupported_head_dim_runs_the_stock_kernel():
    q = rand(1, 2, 64, 48, seed=9)
    fn = install("mxfp4", **fake_xdit()).function
    assert torch.equal(fn(q, q, q, 0.0, False)[0], stock_kernel(q, q, q)[0])


# ---- the registry hook ---------------------------------------------------------------------------------
class AttentionBackendType(Enum):  # xfuser's names (values abridged)
    SDPA = "SDPA"
    SDPA_FLASH = "SDPA with FLASH backend"
    SDPA_EFFICIENT = "SDPA with memory-efficient backend"
    CUDNN = "cuDNN"
    FLASH = "Flash Attention V2"
    FLASH_3 = "Flash Attention V3"


class RuntimeState:
    """xfuser's DiTRuntimeState attention fields; setters refuse SDPA with ring as xfuser does."""

    def __init__(self, backend=AttentionBackendType.CUDNN, ring_degree=2):
        self.attention_backend, self.cross_attention_backend, self.ring_degree = backend, None, ring_degree

    def _check(self, backend):
        if backend == AttentionBackendType.SDPA and self.ring_degree > 1:
            raise RuntimeError("Selected attention backend does not support ring parallelism.")

    def set_attention_backend(self, backend):
        self._check(backend)
        self.attention_backend = backend

    def set_cross_attention_backend(self, backend):
        self._check(backend)
        self.cross_attention_backend = backend

    def get_cross_attention_backend(self):
        return self.cross_attention_backend or self.attention_backend


def fake_xdit(state=None):
    registry = {b: stock_kernel for b in AttentionBackendType}
    return dict(registry=registry, backend_types=AttentionBackendType, runtime_state=state)


def test_install_takes_the_slot_and_keeps_cross_attention_on_a_stock_slot():
    state = RuntimeState(backend=AttentionBackendType.CUDNN)
    xdit = fake_xdit(state)
    handle = install("mxfp8", slot="sdpa_flash", **xdit)
    reg = xdit["registry"]
    # USP looks the self-attention kernel up as registry[runtime_state.attention_backend] ...
    assert isinstance(reg[state.attention_backend], XDiTAttention)
    assert state.attention_backend == AttentionBackendType.SDPA_FLASH
    # ... and Wan's cross-attention as registry[runtime_state.get_cross_attention_backend()]
    assert state.get_cross_attention_backend() == AttentionBackendType.CUDNN
    assert reg[state.get_cross_attention_backend()] is stock_kernel
    handle.uninstall()
    assert reg[AttentionBackendType.SDPA_FLASH] is stock_kernel
    assert state.attention_backend == AttentionBackendType.CUDNN and state.cross_attention_backend is None


def test_install_twice_keeps_the_true_stock_kernel_and_explicit_cross_slot_is_kept():
    state = RuntimeState(backend=AttentionBackendType.CUDNN)
    state.cross_attention_backend = AttentionBackendType.FLASH
    xdit = fake_xdit(state)
    install("mxfp8", slot="CUDNN", **xdit)
    handle = install("mxfp4", slot="CUDNN", **xdit)
    assert handle.original is stock_kernel and handle.function.policy.name == "mxfp4"
    assert state.get_cross_attention_backend() == AttentionBackendType.FLASH  # user's choice kept


def test_default_cross_slot_differs_from_a_cudnn_slot():
    state = RuntimeState(backend=AttentionBackendType.CUDNN)
    install("mxfp8", slot="CUDNN", **fake_xdit(state))
    assert state.get_cross_attention_backend() == AttentionBackendType.SDPA_FLASH


def test_cross_slot_must_be_another_stock_slot():
    xdit = fake_xdit(RuntimeState())
    with pytest.raises(ValueError, match="must be a stock slot other than SDPA_FLASH"):
        install("mxfp8", slot="SDPA_FLASH", cross_slot="sdpa_flash", **xdit)
    assert xdit["registry"][AttentionBackendType.SDPA_FLASH] is stock_kernel  # left as it was
    assert xdit["runtime_state"].attention_backend == AttentionBackendType.CUDNN
    state = RuntimeState()
    install("mxfp8", slot="SDPA_FLASH", cross_slot="flash_3", **fake_xdit(state))
    assert state.get_cross_attention_backend() == AttentionBackendType.FLASH_3


@pytest.mark.parametrize("slot", ["SDPA", "NO_SUCH"])
def test_slots_without_lse_or_ring_are_refused(slot):
    with pytest.raises(ValueError, match="accepted: SDPA_FLASH"):
        install("mxfp8", slot=slot, **fake_xdit())


def _xfuser_importable() -> bool:
    try:
        import xfuser.core.distributed.attention_backend  # noqa: F401
    except Exception:  # not installed, or its RuntimeError on a CPU-only torch
        return False
    return True


@pytest.mark.skipif(_xfuser_importable(), reason="xfuser imports here; the real hook is tested below")
def test_install_without_xfuser_says_why():
    with pytest.raises(RuntimeError, match="xfuser"):
        install("mxfp8")


@pytest.mark.skipif(_xfuser_importable(), reason="xfuser imports here")
def test_runner_without_xfuser_exits_with_one_line(capsys):
    from fsattn_diffusers.pipelines.xdit_video import main

    assert main(["--model", "Wan2.2-T2V", "--ulysses_degree", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "xfuser" in err and len(err.splitlines()) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not _xfuser_importable() or not torch.cuda.is_available(), reason="needs xfuser 0.7 and CUDA")
def test_install_into_the_real_xfuser_registry():
    from xfuser.core.distributed.attention_backend import ATTENTION_FUNCTION_REGISTRY, AttentionBackendType
    from xfuser.model_executor.layers.usp import _get_attention_function

    stock = ATTENTION_FUNCTION_REGISTRY[AttentionBackendType.SDPA_FLASH]
    handle = install("mxfp8", slot="SDPA_FLASH", record=True)
    try:
        assert ATTENTION_FUNCTION_REGISTRY[AttentionBackendType.SDPA_FLASH] is handle.function
        q, k, v = (rand(1, 4, 256, 128, seed=s).to("cuda", torch.bfloat16) for s in (16, 17, 18))
        kernel = _get_attention_function(backend=AttentionBackendType.SDPA_FLASH)  # as USP fetches it
        out, _ = kernel(q, k, v, dropout_p=0.0, is_causal=False, attention_kwargs=None)
        assert torch.equal(out, fa.attention(q, k, v, "mxfp8", layout="bhsd", backend=handle.function.backend))
        assert handle.records[-1].recipe == "mxfp8"
    finally:
        handle.uninstall()
    assert ATTENTION_FUNCTION_REGISTRY[AttentionBackendType.SDPA_FLASH] is stock


# ---- the denoising step under CFG ----------------------------------------------------------------------
class Scheduler:
    order = 1

    def set_timesteps(self, n, device=None):
        self.timesteps = torch.linspace(999, 0, n)

    def step(self, model_output, t, sample, **kwargs):
        return (sample,)


class XDiTLikeTransformer(torch.nn.Module):
    """Calls the kernel the way xDiT's USP does: registry[runtime_state.attention_backend](..., keywords)."""

    def __init__(self, registry, state):
        super().__init__()
        self.registry, self.state = registry, state

    def forward(self, hidden_states, timestep):
        q = hidden_states
        return self.registry[self.state.attention_backend](q, q, q, dropout_p=0.0, is_causal=False,
                                                            attention_kwargs=None)[0]


class Pipeline:
    def __init__(self, transformer):
        self.scheduler, self.transformer = Scheduler(), transformer
        self.components = {"scheduler": self.scheduler, "transformer": transformer}

    def __call__(self, steps, cfg_calls):
        x = rand(1, 2, 64, 32, seed=10)
        self.scheduler.set_timesteps(steps)
        for t in self.scheduler.timesteps:
            for _ in range(cfg_calls):  # 2: cond + uncond without CFG-parallel; 1: CFG-parallel / no CFG
                self.transformer(x, timestep=t.expand(1))
            self.scheduler.step(x, t, x)


@pytest.mark.parametrize("cfg_calls", [2, 1])
@pytest.mark.parametrize("follow", ["pipeline", "transformer"])
def test_policy_follows_the_denoising_step_not_the_forward_calls(cfg_calls, follow):
    steps = 8
    state = RuntimeState(backend=AttentionBackendType.SDPA_FLASH)
    xdit = fake_xdit(state)
    handle = install("hybrid", slot="SDPA_FLASH", **xdit)
    pipe = Pipeline(XDiTLikeTransformer(xdit["registry"], state))
    handle.follow(pipe if follow == "pipeline" else pipe.transformer)
    if follow == "transformer":
        handle.function.tracker.num_steps = steps  # a bare transformer does not know the run length
    pipe(steps, cfg_calls)
    records = handle.records
    assert [r.step for r in records] == [s for s in range(steps) for _ in range(cfg_calls)]
    per_step = [records[i * cfg_calls].recipe for i in range(steps)]
    print(f"cfg calls/step {cfg_calls}, following {follow}: {per_step}")
    assert per_step == handle.function.policy.plan_names(steps) == ["mxfp6"] + ["mxfp4"] * 6 + ["mxfp6"]
    recorded = [r.recipe for r in records]
    assert recorded == [per_step[i // cfg_calls] for i in range(len(records))]
    # Taking the forward-call count as the step (without xDiT's CFG multiplier) goes wrong under CFG
    by_call = [handle.function.policy.entry_at(i, steps) for i in range(len(records))]
    assert ([entry_name(e) for e in by_call] == recorded) == (cfg_calls == 1)


def test_unfollowed_step_policy_warns_and_uses_its_first_step():
    fn = install("hybrid", **fake_xdit()).function
    q = rand(1, 2, 64, 32, seed=11)
    with pytest.warns(RuntimeWarning, match="no pipeline is followed"):
        fn(q, q, q, 0.0, False)
    assert fn.tracker.records[-1].recipe == "mxfp6"


# ---- the runner's arguments (no xfuser needed) ---------------------------------------------------------
def test_runner_passes_xdit_flags_and_adds_the_slots():
    ours, rest = split_argv(["--model", "Wan2.2-T2V", "--ulysses_degree", "2", "--policy", "mxfp6",
                             "--prompt", "a cat"])
    assert ours.policy == "mxfp6" and ours.fsattn_slot == "SDPA_FLASH"
    argv = xdit_argv(ours, rest, supports_cross_backend=True)
    assert argv[:4] == ["--model", "Wan2.2-T2V", "--ulysses_degree", "2"]
    assert argv[-4:] == ["--attention_backend", "SDPA_FLASH", "--cross_attention_backend", "CUDNN"]
    assert "--cross_attention_backend" not in xdit_argv(ours, rest, supports_cross_backend=False)  # HunyuanVideo


@pytest.mark.parametrize("extra,match", [
    (["--use_hybrid_attn_schedule"], "conflicts with --policy"),
    (["--attention_backend", "CUDNN"], "differs from --fsattn_slot"),
    (["--cross_attention_backend=SDPA_FLASH"], "fsattn's slot"),
])
def test_runner_refuses_conflicting_flags(extra, match):
    ours, rest = split_argv(["--model", "Wan2.2-T2V", "--ring_degree", "2"] + extra)
    with pytest.raises(ValueError, match=match):
        xdit_argv(ours, rest, supports_cross_backend=True)


# ---- the LSE merge helper ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_merge_by_lse_equals_one_call_and_ignores_empty_shards(layout):
    q, k, v = rand(2, 80, 2, 64, seed=12), rand(2, 300, 2, 64, seed=13), rand(2, 300, 2, 64, seed=14)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    seq = 2 if layout == "bhsd" else 1
    full, full_lse = fa.attention(q, k, v, "exact", layout=layout, return_lse=True)
    parts = [fa.attention(q, k.narrow(seq, a, n), v.narrow(seq, a, n), "exact", layout=layout, return_lse=True,
                          kv_lens=[n, 0] if a == 200 else None)  # batch 1 sees no key in the last shard
             for a, n in ((0, 120), (120, 80), (200, 100))]
    merged, lse = merge_by_lse([p[0] for p in parts], [p[1] for p in parts], layout=layout)
    # batch 1 has only the first 200 keys: compare it with a call over those
    ref1, ref1_lse = fa.attention(q[1:], k[1:].narrow(seq, 0, 200), v[1:].narrow(seq, 0, 200), "exact",
                                  layout=layout, return_lse=True)
    assert torch.allclose(merged[:1], full[:1], atol=FP32_ACCUMULATED)
    assert torch.allclose(lse[:1], full_lse[:1], atol=FP32_LSE_NATS)
    assert torch.allclose(merged[1:], ref1, atol=FP32_ACCUMULATED)
    assert torch.allclose(lse[1:], ref1_lse, atol=FP32_LSE_NATS)
