"""End-to-end denoising-step latency at real model size, with random weights.

Latency does not depend on weight values, so the published Wan2.2-T2V-A14B and HunyuanVideo transformer
configurations are built directly on the GPU in BF16 with N(0, 0.02) weights and timed for whole
denoising steps: stock attention (torch SDPA, cuDNN backend) and the FlashAttention-3 baselines against
each fsattn policy through our processors, optionally with FP8 linear layers and compiled blocks
(:mod:`fsattn_diffusers.measure.e2e_config`). Text encoder and VAE decode are excluded (their cost does not change
with the policy).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional
from unittest import mock

import torch

from ..integration.policy import HYBRID_N_ENDS, HYBRID_REFERENCE_STEPS
from .provenance import policy_record

# Wan2.2-T2V-A14B (one expert): 40 layers, 40 heads of 128, model dim 5120, FFN 13824 (diffusers config).
WAN22_A14B = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                  out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
# HunyuanVideo (hunyuanvideo-community/HunyuanVideo): 20 dual + 40 single blocks, 24 heads of 128.
HUNYUAN_VIDEO = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128,
                     num_layers=20, num_single_layers=40, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2,
                     patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096,
                     pooled_projection_dim=768, rope_theta=256.0, rope_axes_dim=(16, 56, 56))
# Realistic initial weight scale so activations stay finite (the issue asks for e.g. N(0, 0.02)).
WEIGHT_STD = 0.02
# The paper's Wan2.2 run: 20 denoising steps; the hybrid schedule runs mxfp6 on the first and last 3 (the policy
# module's constants, which the schedules of both hybrids use).
PAPER_STEPS = HYBRID_REFERENCE_STEPS
HYBRID_ENDS = HYBRID_N_ENDS


@dataclass
class ModelSpec:
    """A transformer to time: its class, config, latent shape and forward calls per denoising step."""

    name: str
    config: dict
    latent: tuple  # (C, F, H, W) of the VAE latent
    text_tokens: int
    calls_per_step: int  # 2 under classifier-free guidance (cond + uncond), 1 with embedded guidance


def wan22_spec(frames: int = 81, height: int = 720, width: int = 1280, scale: Optional[dict] = None) -> ModelSpec:
    """Wan2.2-T2V-A14B at the paper's 81 x 1280x720 (VAE: time /4, space /8): 75600 tokens, CFG."""
    cfg = dict(WAN22_A14B, **(scale or {}))
    return ModelSpec("wan2.2-t2v-a14b", cfg, (16, (frames - 1) // 4 + 1, height // 8, width // 8), 512, 2)


def hunyuan_spec(frames: int = 129, height: int = 720, width: int = 1280, scale: Optional[dict] = None) -> ModelSpec:
    """HunyuanVideo 720p x 129 frames: 118800 image tokens + 256 text tokens, embedded guidance."""
    cfg = dict(HUNYUAN_VIDEO, **(scale or {}))
    return ModelSpec("hunyuanvideo", cfg, (16, (frames - 1) // 4 + 1, height // 8, width // 8), 256, 1)


def build_transformer(spec: ModelSpec, device, dtype=torch.bfloat16, seed: int = 0, cls=None):
    """The transformer of ``spec`` on ``device`` with N(0, WEIGHT_STD) weights (norm weights 1).

    ``cls``: the model class (default diffusers' Wan / HunyuanVideo transformer); a subclass that adds no
    parameters (e.g. xDiT's ``xFuserWanTransformer3DWrapper``) gets the same weights for the same seed.
    """
    from diffusers import HunyuanVideoTransformer3DModel, WanTransformer3DModel

    if cls is None:
        cls = WanTransformer3DModel if spec.name.startswith("wan") else HunyuanVideoTransformer3DModel
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(**spec.config)
    # nn.Module.to, not diffusers' override: its "should be kept in float32" note is about from_pretrained, and the
    # loop below keeps those modules in float32 as from_pretrained does
    model = torch.nn.Module.to(model, dtype=dtype).eval().requires_grad_(False)
    for name, module in model.named_modules():  # as from_pretrained(torch_dtype=bf16) does
        if any(keep in name.split(".") for keep in (model._keep_in_fp32_modules or [])):
            module.float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, WEIGHT_STD)
            elif "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, WEIGHT_STD)
    return model


def make_inputs(spec: ModelSpec, device, dtype=torch.bfloat16, seed: int = 0,
                text_valid: Optional[int] = None) -> Callable[[float], dict]:
    """Returns ``inputs(t)``: the keyword arguments of one transformer forward at timestep ``t``.

    ``text_valid`` (HunyuanVideo): valid text tokens of the ``spec.text_tokens`` (the rest is padding, False
    in ``encoder_attention_mask``, as a short prompt gives); default all valid."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    c, f, h, w = spec.latent
    latents = torch.randn(1, c, f, h, w, generator=g).to(device, dtype)
    text_dim = spec.config.get("text_dim", spec.config.get("text_embed_dim"))
    text = torch.randn(1, spec.text_tokens, text_dim, generator=g).to(device, dtype)
    extra = {}
    if not spec.name.startswith("wan"):
        pooled = torch.randn(1, spec.config["pooled_projection_dim"], generator=g).to(device, dtype)
        valid = spec.text_tokens if text_valid is None else text_valid
        if not 1 <= valid <= spec.text_tokens:
            raise ValueError(f"text_valid={text_valid} is out of range; accepted: 1..{spec.text_tokens}")
        mask = torch.arange(spec.text_tokens, device=device)[None, :] < valid
        extra = dict(encoder_attention_mask=mask,
                     pooled_projections=pooled,
                     guidance=torch.tensor([6000.0], device=device, dtype=dtype))

    def inputs(t: float) -> dict:
        return dict(hidden_states=latents, timestep=torch.tensor([t], device=device), encoder_hidden_states=text,
                    return_dict=False, **extra)

    return inputs


def image_tokens(spec: ModelSpec) -> int:
    c, f, h, w = spec.latent
    return f * (h // 2) * (w // 2)


@dataclass
class AttentionTimer:
    """CUDA-event timing of every self-attention kernel call (SDPA or fsattn) inside a region."""

    events: List = field(default_factory=list)
    stats: Dict[str, int] = field(default_factory=lambda: {"rollbacks": 0, "tiles": 0, "rollback_tiles": 0})

    cuda: bool = True

    def seconds(self) -> float:
        if not self.cuda:
            return sum(b - a for a, b in self.events)
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.events) / 1000.0

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wrap(self, fn, with_stats=False):
        def timed(*args, **kwargs):
            start = self._mark()
            if with_stats:
                out, st = fn(*args, return_stats=True, **kwargs)
                for k in self.stats:
                    self.stats[k] += st[k]
            else:
                out = fn(*args, **kwargs)
            self.events.append((start, self._mark()))
            return out

        return timed


@contextlib.contextmanager
def timed_attention(timer: AttentionTimer, fsattn: bool, with_stats: bool = True,
                    diffusers_backend: Optional[str] = None):
    """Route attention calls through ``timer``: torch SDPA for stock runs, the function diffusers registered for
    ``diffusers_backend`` (``sage``: every attention call of the model), our processors' attention (fsattn recipes,
    with rollback statistics when ``with_stats``; baseline kernels) otherwise."""
    import torch.nn.functional as F

    from ..integration import processors

    if diffusers_backend is not None:
        from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

        name = AttentionBackendName(diffusers_backend)
        patch = mock.patch.dict(_AttentionBackendRegistry._backends,
                                {name: timer.wrap(_AttentionBackendRegistry._backends[name])})
    elif fsattn:
        timed = timer.wrap(processors.attention, with_stats=with_stats)
        patch = mock.patch.object(processors, "attention", timed)
    else:
        patch = mock.patch.object(F, "scaled_dot_product_attention", timer.wrap(F.scaled_dot_product_attention))
    with patch:
        yield


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def time_steps(model, inputs, spec: ModelSpec, steps: int, cuda: bool,
               timestep: Callable[[int], float] = lambda i: 999.0 - 37.0 * i) -> List[float]:
    """Wall seconds of ``steps`` denoising steps (``calls_per_step`` forwards each at ``timestep(i)``,
    device-synchronized)."""
    out = []
    for i in range(steps):
        _sync(cuda)
        t0 = time.perf_counter()
        for _ in range(spec.calls_per_step):
            model(**inputs(timestep(i)))
        _sync(cuda)
        out.append(time.perf_counter() - t0)
    return out


def run_policy(model, inputs, spec: ModelSpec, policy: str, steps: int, warmup: int = 1,
               backend: str = "auto", instrument: bool = True, compiled: bool = False,
               compile_backend: str = "inductor") -> dict:
    """Time ``steps`` steps of ``model`` under ``policy`` (``"bf16"``: stock SDPA on its cuDNN backend;
    ``"fa3"``/``"fa3-fp8"``: FlashAttention-3 through our processors; ``"sage"``: diffusers' ``sage`` backend on
    every attention module, set by ``set_attention_backend`` and restored after) after ``warmup`` untimed forward calls,
    then (``instrument``) one instrumented step for the attention time (CUDA events around every
    self-attention call), its share of that step, and the rollback statistics (fsattn recipes only).
    ``instrument=False`` leaves those None. ``compiled``: the model's repeated blocks are compiled
    (:func:`fsattn_diffusers.measure.e2e_config.compile_blocks`); they are compiled again with ``fullgraph=True`` for
    this policy, the warm-up compiles them (falling back to ``fullgraph=False`` on a graph break, reported as
    ``"compile"``), and the instrumented step is skipped (its timer would recompile the blocks)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ..integration.policy import get_policy
    from ..integration.processors import HunyuanVideoFSAttnProcessor, WanFSAttnProcessor

    stock = policy == "bf16"
    resolved = None if stock else get_policy(policy)
    chosen = getattr(resolved, "attention_backend", None)  # sage: stock processors on a diffusers backend
    baseline = not stock and (resolved.backend is not None or chosen is not None)  # a baseline: no rollback gate
    cuda = next(model.parameters()).is_cuda
    saved = dict(model.attn_processors)
    if not stock:
        cls = WanFSAttnProcessor if spec.name.startswith("wan") else HunyuanVideoFSAttnProcessor
        procs = {k: (cls(policy, backend=backend, layer=k) if _is_self_attention(k, spec) else v)
                 for k, v in saved.items()}
        model.set_attn_processor(procs)
    state = None
    try:
        if chosen is not None:
            from ..integration.install import set_diffusers_backend

            state = set_diffusers_backend([model], chosen)
        kernels = [SDPBackend.CUDNN_ATTENTION] if cuda else [SDPBackend.MATH]
        with torch.no_grad(), sdpa_kernel(kernels):
            def warm():  # warm-up forwards (kernel compilation, allocator), untimed
                for _ in range(warmup):
                    model(**inputs(999.0))

            compile_info = None
            if compiled:
                from . import e2e_config

                from ..backends import availability

                availability(next(model.parameters()).device)  # backend probes eagerly, before tracing
                e2e_config.compile_blocks(model, fullgraph=True, backend=compile_backend)
                t0 = time.perf_counter()
                compile_info = e2e_config.warm_compiled(model, warm, backend=compile_backend)
                compile_info["warmup_s"] = time.perf_counter() - t0
                instrument = False
            else:
                warm()
            # Step latency uninstrumented: the timer's per-call events and statistics (a host sync per call, for
            # the rollback counts) leave the GPU idle between calls, which a user's run never has.
            secs = time_steps(model, inputs, spec, steps, cuda)
            timer = AttentionTimer(cuda=cuda)
            inst, attn = [None], None
            if instrument:  # one more step, instrumented: attention time and rollbacks
                with timed_attention(timer, not stock, with_stats=not baseline, diffusers_backend=chosen):
                    inst = time_steps(model, inputs, spec, 1, cuda)
                attn = timer.seconds()
    finally:
        model.set_attn_processor(saved)
        if state is not None:
            state.restore()
    step = sorted(secs)[len(secs) // 2]
    tiles = max(1, timer.stats["tiles"])
    gated = instrument and not stock and not baseline
    return {"policy": policy, "step_seconds": secs, "step_median_s": step, "attention_s_per_step": attn,
            "instrumented_step_s": inst[0], "attention_share": attn / inst[0] if instrument else None,
            "rollbacks": timer.stats["rollbacks"] if gated else None,
            "rollback_rate": timer.stats["rollback_tiles"] / tiles if gated else None, "compile": compile_info,
            **policy_record(policy)}


def run_schedule(model, inputs, spec: ModelSpec, policy: str = "hybrid", steps: int = PAPER_STEPS, warmup: int = 1,
                 backend: str = "auto") -> dict:
    """Time one real run of ``steps`` denoising steps under a step-scheduled ``policy`` (``"hybrid"``: mxfp6 on the
    first and last 3 of 20 steps, mxfp4 between; ``"hybrid-int8-mxfp8"``: int8-bf16 there, mxfp8 between;
    ``"hybrid-int8"``: int8-bf16 there, int8-fp8 between), as a
    pipeline runs it: :func:`fsattn_diffusers.apply` on the transformer, one timestep per step (``calls_per_step``
    forwards each), the processors switching recipes by themselves. Before the run, ``warmup`` untimed forwards per
    recipe of the plan (kernel compilation).

    Returns ``{"policy", "steps", "plan", "ran", "fallback_calls", "step_seconds", "total_s", "step_mean_s"}``:
    ``plan`` the policy's recipe per step, ``ran`` the recipes the calls of each step actually used (from the
    handle's records), ``fallback_calls`` calls that ran something else than planned."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from .. import apply, remove
    from ..integration.policy import get_policy

    cuda = next(model.parameters()).is_cuda
    plan = get_policy(policy).plan_names(steps)
    kernels = [SDPBackend.CUDNN_ATTENTION] if cuda else [SDPBackend.MATH]
    with torch.no_grad(), sdpa_kernel(kernels):
        for name in sorted(set(plan)):
            apply(model, policy=name, backend=backend, record=False)
            try:
                for _ in range(warmup):
                    model(**inputs(999.0))
            finally:
                remove(model)
        handle = apply(model, policy=policy, backend=backend, record=True)
        try:
            handle.tracker.begin_run(steps)
            secs = time_steps(model, inputs, spec, steps, cuda, timestep=lambda i: 999.0 * (1.0 - i / steps))
            records = list(handle.records)
        finally:
            remove(model)
    ran = [sorted({r.recipe for r in records if r.step == i}) for i in range(steps)]
    return {"policy": policy, "steps": steps, "plan": plan, "ran": ran,
            "fallback_calls": sum(r.recipe != r.planned for r in records), "step_seconds": secs,
            "total_s": sum(secs), "step_mean_s": sum(secs) / steps, **policy_record(policy, steps)}


def _is_self_attention(name: str, spec: ModelSpec) -> bool:
    if spec.name.startswith("wan"):
        return name.endswith("attn1.processor")
    return "token_refiner" not in name  # HunyuanVideo: joint image+text attention in every block


#: Baselines a speedup is reported against, when the run measured them: stock SDPA (cuDNN) BF16,
#: FlashAttention-3 BF16, FlashAttention-3 FP8 (per-(batch, head) scales), SageAttention (diffusers' sage backend).
BASELINES = ("bf16", "fa3", "fa3-fp8", "sage")


def summarize(results: Dict[str, dict], steps_total: int = PAPER_STEPS, ends: int = HYBRID_ENDS,
              schedules: Optional[Dict[str, dict]] = None,
              projections: Optional[Dict[str, List[str]]] = None) -> Dict[str, dict]:
    """Projected ``steps_total``-step latency and speedups; ``"<name> (projected)"`` for each step-scheduled policy of
    ``projections`` (name -> recipe per step) whose recipes were all measured, from their measured step times
    (default: ``hybrid``, ``2 * ends`` mxfp6 + the rest mxfp4 steps, when both were measured); each run of
    ``schedules`` (:func:`run_schedule`) as measured over its real schedule.

    ``speedup`` is over bf16 (stock SDPA); ``speedup_vs`` maps every baseline of :data:`BASELINES` present
    in ``results`` to the speedup over it (baseline step / this step, both from the same run)."""
    base = results["bf16"]["step_median_s"]
    present = [b for b in BASELINES if b in results]
    table = {}
    for name, r in results.items():
        table[name] = {"step_s": r["step_median_s"], "projected_s": r["step_median_s"] * steps_total,
                       "speedup": base / r["step_median_s"], "attention_share": r["attention_share"],
                       "rollback_rate": r["rollback_rate"]}
    if projections is None:
        n6 = min(2 * ends, steps_total)
        projections = {"hybrid": ["mxfp6"] * n6 + ["mxfp4"] * (steps_total - n6)}
    for name, plan in projections.items():
        if plan and all(p in results for p in plan):
            table[f"{name} (projected)"] = _projected(results, plan, base, steps_total)
    for name, run in (schedules or {}).items():
        table[name] = {"step_s": run["step_mean_s"], "projected_s": run["step_mean_s"] * steps_total,
                       "speedup": base / run["step_mean_s"], "attention_share": None, "rollback_rate": None,
                       "note": f"measured over a real {run['steps']}-step run ({run['fallback_calls']} calls fell back)"}
    for row in table.values():
        row["speedup_vs"] = {b: results[b]["step_median_s"] / row["step_s"] for b in present}
    return table


def _projected(results: Dict[str, dict], plan: List[str], base: float, steps_total: int) -> dict:
    """One projected row: the plan's measured step times summed (scaled to ``steps_total`` steps)."""
    total = sum(results[p]["step_median_s"] for p in plan) * steps_total / len(plan)
    counts = " + ".join(f"{plan.count(p)} {p} steps" for p in dict.fromkeys(plan))
    return {"step_s": total / steps_total, "projected_s": total, "speedup": base * steps_total / total,
            "attention_share": None, "rollback_rate": None, "note": f"{counts} from the measured step times"}


def flops_per_step(spec: ModelSpec) -> float:
    """Self-attention FLOPs of one step: 4 * S^2 * D * heads per call (non-causal forward)."""
    s = image_tokens(spec) + (0 if spec.name.startswith("wan") else spec.text_tokens)
    d, h = spec.config["attention_head_dim"], spec.config["num_attention_heads"]
    layers = spec.config["num_layers"] + spec.config.get("num_single_layers", 0)
    return 4.0 * s * s * d * h * layers * spec.calls_per_step


__all__ = ["wan22_spec", "hunyuan_spec", "build_transformer", "make_inputs", "run_policy", "run_schedule", "summarize",
           "BASELINES",
           "flops_per_step", "image_tokens"]
