"""Wan2.2-A14B-size transformer on N GPUs under diffusers context parallelism: latency, scaling, output match.

One run (``--world`` processes, NCCL on CUDA, gloo on CPU):

1. every rank builds the same seeded transformer (:func:`fsattn_diffusers.measure.e2e.build_transformer`, random
   N(0, 0.02) weights) and the same inputs on its own device; a per-parameter float64 checksum is
   all-gathered and the run stops at once if any rank differs;
2. **1 GPU** (no context parallelism): the policies are split over the ranks (rank r times policies
   r, r + world, ...; each on its own GPU, no communication), each one untimed forward at a fixed
   timestep — whose output is the 1-GPU reference — then ``--steps`` timed CFG steps;
3. **N GPUs**: for each mode (``ulysses``, ``ring``; degree = world) and policy, the model is wired as
   ``enable_parallelism`` wires it (:func:`~fsattn_diffusers.measure.parallel_check._wire_context_parallel`),
   the same one forward (output gathered by Wan's ``_cp_plan``) and timed steps run, then the wiring is
   removed again (one model copy per GPU throughout).

Policies (:mod:`.scaling_policies`): ``bf16`` is stock diffusers attention on cuDNN SDPA (1 GPU: torch SDPA's cuDNN
backend, as :func:`fsattn_diffusers.measure.e2e.run_policy`; N GPUs: diffusers' ``_native_cudnn`` backend, which gives
the ring its LSE). ``sage`` is stock attention on diffusers' ``sage`` backend (SageAttention 2) on every attention
module, set by ``set_attention_backend`` as a diffusers user sets it; under context parallelism diffusers runs it
through its ring / Ulysses templates (diffusers 0.42 registers ``sage`` for context parallelism; the ring merges
SageAttention's ``return_lse`` LSE; huggingface/diffusers#13506, open, reports wrong ring outputs from SageAttention's
CUDA kernels on the ring's K/V views, which this run's output match checks); a backend diffusers does not register for
context parallelism is recorded as not supported instead of run. Every other fixed policy or recipe name runs
:class:`~fsattn_diffusers.integration.WanFSAttnProcessor` on the self-attention. A step-scheduled policy (``hybrid``,
``hybrid-int8-mxfp8``) is not timed as such: its recipes are, and it is projected over its 20-step plan
(:func:`fsattn_diffusers.measure.e2e.summarize`'s ``projections``).

Output match of one transformer call, N GPUs against 1 GPU (relative L2 error and cosine over the whole
output). Rule (:func:`match`): ``bf16``: rel. error vs the 1-GPU bf16 output <= 1e-2; quantized policy P:
``err(P on N GPUs vs bf16 on 1 GPU) <= 1.15 * err(P on 1 GPU vs bf16 on 1 GPU) + max(1e-3, e_cp)``, where
1.15 is the sharded-check tolerance (:data:`~fsattn_diffusers.measure.parallel_check.RELATIVE_TOLERANCE`) and
``e_cp`` is the measured error of stock bf16 attention on N GPUs in the same mode (the sharding's own
BF16 rounding, which the quantized path inherits).

Rank 0 writes ``--json`` and ``--md`` after every measurement, so a run cut short keeps what it measured.
Run: ``python -m fsattn_diffusers.measure.cp_scaling --device cuda --world 2 --json out.json --md out.md``;
``--tiny --device cpu`` for a CPU smoke run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shlex
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence
from unittest import mock

import torch

from . import e2e
from .cp_scaling_report import (ABSOLUTE_FLOOR, BF16_TOLERANCE, MATCH_TIMESTEP, Recorder, _fmt, _log, _versions,
                                run_meta, to_markdown)
from .parallel_check import RELATIVE_TOLERANCE, gloo_loopback, _parallel_config, _wire_context_parallel
from .provenance import policy_record
from .scaling_policies import (PolicyKind, attention_backend, context_parallel_refusal, expand_policies, policy_kind,
                               processor_policy)

#: Every process keeps NVLink multicast (NVLS / symmetric-memory multicast) off.
NVLS_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MODES = ("ulysses", "ring")
#: The policies of issue 54's two-GPU run: stock attention, SageAttention 2 as Wan users run it, mxfp8, the INT8
#: tiers and the Hopper hybrid (its recipes timed, projected over 20 steps).
DEFAULT_POLICIES = "bf16,mxfp8,int8-bf16,int8-bf16+exponential=exact,hybrid-int8-mxfp8,sage"
#: Tiny Wan config for CPU runs (as tests/test_e2e.py): 1 layer, 2 heads of 64.
TINY = dict(num_attention_heads=2, attention_head_dim=64, ffn_dim=64, num_layers=1, text_dim=32)
TINY_SHAPE = dict(frames=5, height=128, width=128)  # latent 16 x 2 x 16 x 16 -> 128 tokens
TINY_TEXT_TOKENS = 16


def make_spec(frames: int, height: int, width: int, tiny: bool) -> e2e.ModelSpec:
    if tiny:
        spec = e2e.wan22_spec(**TINY_SHAPE, scale=TINY)
        spec.text_tokens = TINY_TEXT_TOKENS
        return spec
    return e2e.wan22_spec(frames=frames, height=height, width=width)


# ----------------------------------------------------------------------------------------------- wiring

@contextlib.contextmanager
def policy_processors(model, spec: e2e.ModelSpec, policy: str, backend: str, stock_backend: Optional[str]):
    """Self-attention processors of ``policy``: ``bf16``, a stock ``WanAttnProcessor`` on ``stock_backend`` (``None`` =
    diffusers' active one); an attention-backend policy (``sage``), stock processors with ``set_attention_backend``
    on every attention module (cross-attention included, as a diffusers user sets it); a recipe,
    ``WanFSAttnProcessor``. Cross-attention keeps its processor. Processors and backends restored on exit."""
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    from ..integration.install import set_diffusers_backend
    from ..integration.processors import WanFSAttnProcessor

    kind = policy_kind(policy)
    saved = dict(model.attn_processors)
    procs = {}
    for name, proc in saved.items():
        if not e2e._is_self_attention(name, spec):
            procs[name] = proc
        elif kind is PolicyKind.RECIPE:
            procs[name] = WanFSAttnProcessor(processor_policy(policy), backend=backend, layer=name)
        else:
            procs[name] = WanAttnProcessor()
            procs[name]._attention_backend = stock_backend
    model.set_attn_processor(procs)
    state = None
    try:
        if kind is PolicyKind.ATTENTION_BACKEND:
            state = set_diffusers_backend([model], attention_backend(policy))
        yield
    finally:
        if state is not None:
            state.restore()
        model.set_attn_processor(saved)


@contextlib.contextmanager
def context_parallel(model, config):
    """``_wire_context_parallel`` on entry; hooks, the model's and the processors' configs removed on exit."""
    from diffusers.hooks.context_parallel import remove_context_parallel

    _wire_context_parallel(model, config)
    try:
        yield
    finally:
        remove_context_parallel(model, model._cp_plan)
        model._parallel_config = None
        for module in model.modules():
            proc = getattr(module, "processor", None)
            if proc is not None and hasattr(proc, "_parallel_config"):
                proc._parallel_config = None


@contextlib.contextmanager
def _timed_cp_attention(timer: e2e.AttentionTimer):
    """Time diffusers' ring / Ulysses template (local attention + its communication): the stock
    ``_native_cudnn`` backend and fsattn's ``context_parallel_attention`` both call it by module lookup."""
    from diffusers.models import attention_dispatch as ad

    with mock.patch.object(ad, "_templated_context_parallel_attention",
                           timer.wrap(ad._templated_context_parallel_attention)):
        yield


def _cpu_sdpa_forward_op(ctx, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False, return_lse=False, _save_ctx=True, _parallel_config=None):
    """CPU stand-in for diffusers' cuDNN forward op (CPU runs only): torch's CPU flash SDPA, which has an LSE."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                          attn_mask=attn_mask, scale=scale)
    out = out.transpose(1, 2)
    return (out, lse.transpose(1, 2).contiguous()) if return_lse else out


@contextlib.contextmanager
def _cpu_cudnn_stand_in(active: bool):
    if not active:
        yield
        return
    from diffusers.models import attention_dispatch as ad

    with mock.patch.object(ad, "_cudnn_attention_forward_op", _cpu_sdpa_forward_op):
        yield


# ---------------------------------------------------------------------------------------------- measuring

def measure(model, inputs, spec: e2e.ModelSpec, policy: str, steps: int, warmup: int, cuda: bool,
            parallel: bool, timing=None):
    """One forward at :data:`MATCH_TIMESTEP` (its output returned, float32 on the CPU; it is the first of
    ``max(1, warmup)`` untimed forwards), then ``steps`` timed steps (e2e's ``time_steps``).

    Attention time: 1 GPU as ``e2e.run_policy`` (every SDPA call for bf16, every fsattn call otherwise);
    N GPUs: every call of diffusers' context-parallel template (self-attention incl. its communication).
    ``timing``, if given, replaces that choice: ``timing(timer)`` is the context that routes the calls
    to be timed through ``timer`` (the xDiT run wraps its self-attention processors' attention function).
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = policy_kind(policy)
    kernels = [SDPBackend.CUDNN_ATTENTION] if cuda else [SDPBackend.FLASH_ATTENTION]
    with torch.no_grad(), sdpa_kernel(kernels):
        e2e._sync(cuda)
        t0 = time.perf_counter()
        out = model(**inputs(MATCH_TIMESTEP))[0].float().cpu()
        first = time.perf_counter() - t0
        for _ in range(max(1, warmup) - 1):
            model(**inputs(999.0))
        timer = e2e.AttentionTimer(cuda=cuda)
        if timing is not None:
            region = timing(timer)
        elif parallel:
            region = _timed_cp_attention(timer)
        else:
            region = e2e.timed_attention(timer, kind is PolicyKind.RECIPE, diffusers_backend=attention_backend(
                policy) if kind is PolicyKind.ATTENTION_BACKEND else None)
        with region:
            secs = e2e.time_steps(model, inputs, spec, steps, cuda)
        attn = timer.seconds()
    tiles = max(1, timer.stats["tiles"])
    result = {"policy": policy, "step_seconds": secs, "step_median_s": sorted(secs)[len(secs) // 2],
              "first_forward_s": first, "attention_s_per_step": attn / steps, "attention_share": attn / sum(secs),
              "rollback_rate": timer.stats["rollback_tiles"] / tiles if (kind is PolicyKind.RECIPE and not parallel)
              else None,
              **policy_record(policy)}
    return result, out


def rel_err_cos(out: torch.Tensor, ref: torch.Tensor):
    from ..testing import error_and_cosine

    return error_and_cosine(out, ref)


def match(policy: str, out: torch.Tensor, single: Dict[str, torch.Tensor], e_cp_bf16: Optional[float]) -> dict:
    """N-GPU output vs the 1-GPU outputs (see the module docstring for the rule)."""
    row = {"policy": policy}
    if policy in single:
        row["rel_err_vs_1gpu"], row["cos_vs_1gpu"] = rel_err_cos(out, single[policy])
    if "bf16" not in single:
        row["ok"] = None
        return row
    if policy == "bf16":
        row["rule"] = f"rel_err_vs_1gpu <= {BF16_TOLERANCE:g}"
        row["ok"] = bool(row["rel_err_vs_1gpu"] <= BF16_TOLERANCE)
        return row
    row["e_single"], _ = rel_err_cos(single[policy], single["bf16"]) if policy in single else (None, None)
    row["e_sharded"], _ = rel_err_cos(out, single["bf16"])
    floor = max(ABSOLUTE_FLOOR, e_cp_bf16 or 0.0)
    row["floor"] = floor
    row["rule"] = f"e_sharded <= {1 + RELATIVE_TOLERANCE:g} * e_single + max({ABSOLUTE_FLOOR:g}, e_cp_bf16)"
    row["ok"] = None if row["e_single"] is None else \
        bool(row["e_sharded"] <= (1 + RELATIVE_TOLERANCE) * row["e_single"] + floor)
    return row


# ---------------------------------------------------------------------------------------------- reporting

def fingerprint(model, inputs) -> torch.Tensor:
    """float64 sum of every parameter, then of the latents and text: identical builds give equal vectors."""
    with torch.no_grad():
        sums = [p.detach().double().sum() for p in model.parameters()]
        x = inputs(0.0)
        sums += [x["hidden_states"].double().sum(), x["encoder_hidden_states"].double().sum()]
    return torch.stack(sums)


def _check_identical(model, inputs, world: int) -> None:
    import torch.distributed as dist

    mine = fingerprint(model, inputs)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    bad = [r for r in range(world) if not torch.equal(every[r], every[0])]
    if bad:
        raise RuntimeError(f"ranks {bad} built different weights or inputs than rank 0 (checksums of "
                           f"{mine.numel()} tensors differ); every rank must build the same seeded model")


def _barrier(cuda: bool, rank: int) -> None:
    import torch.distributed as dist

    dist.barrier(device_ids=[rank]) if cuda else dist.barrier()


def _worker(rank: int, world: int, tmp: str, opts: dict, body=None) -> None:
    """One process: NVLS off, its device, the default process group (NCCL / gloo), then
    ``body(rank, world, tmp, opts, cuda, device)`` (default :func:`_run`, the diffusers run)."""
    import warnings

    import torch.distributed as dist

    os.environ.update(NVLS_ENV)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message="fsattn: using the 'emulator' backend")
    cuda = opts["device"] == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{os.path.join(tmp, 'init')}",
                            rank=rank, world_size=world, timeout=datetime.timedelta(minutes=30))
    try:
        (body or _run)(rank, world, tmp, opts, cuda, device)
        _barrier(cuda, rank)  # leave together: a torn-down peer makes gloo abort a rank still in a collective
    finally:
        dist.destroy_process_group()



def save_single(rank: int, tmp: str, policy: str, r: dict, out: torch.Tensor) -> None:
    """Record one 1-GPU measurement of this rank (the run and the compared output) for rank 0 to gather."""
    r.update(setting="1gpu", gpus=1, mode=None, rank=rank)
    torch.save({"run": r, "out": out}, os.path.join(tmp, f"single_{policy}.pt"))
    _log(rank, f"1 GPU  {policy:<6} step {r['step_median_s']:.2f} s (attention {100 * r['attention_share']:.0f}%, "
               f"first forward {r['first_forward_s']:.1f} s)")


def gather_single(rank: int, tmp: str, policies: Sequence[str], rec) -> Dict[str, torch.Tensor]:
    """On rank 0: every rank's 1-GPU runs added to ``rec``; returns ``{policy: one-call output}`` (else empty)."""
    single: Dict[str, torch.Tensor] = {}
    if rank == 0:
        for policy in policies:
            path = os.path.join(tmp, f"single_{policy}.pt")
            if os.path.exists(path):
                saved = torch.load(path, weights_only=False)  # this run's own file (records hold Recipe modes)
                single[policy] = saved["out"]
                rec.add(saved["run"])
    return single

def _run(rank: int, world: int, tmp: str, opts: dict, cuda: bool, device) -> None:
    spec = make_spec(opts["frames"], opts["height"], opts["width"], opts["tiny"])
    policies, modes, steps, warmup, backend = (opts[k] for k in ("policies", "modes", "steps", "warmup", "backend"))
    configs = {mode: _parallel_config(world if mode == "ring" else 1, world if mode == "ulysses" else 1,
                                      rank, world, device) for mode in modes}
    t0 = time.perf_counter()
    model = e2e.build_transformer(spec, device, seed=opts["seed"])
    inputs = e2e.make_inputs(spec, device, seed=opts["seed"])
    _check_identical(model, inputs, world)
    _log(rank, f"built {spec.name} ({e2e.image_tokens(spec)} tokens) in {time.perf_counter() - t0:.0f} s; "
               f"weights and inputs identical on all {world} ranks")
    rec = None
    if rank == 0:
        rec = Recorder(run_meta(opts, spec, world, cuda), opts["json"], opts["md"])
        rec.write()

    # 1 GPU: policies split over the ranks, no communication.
    for policy in policies[rank::world]:
        with policy_processors(model, spec, policy, backend, None), _cpu_cudnn_stand_in(not cuda):
            r, out = measure(model, inputs, spec, policy, steps, warmup, cuda, parallel=False)
        save_single(rank, tmp, policy, r, out)
    _barrier(cuda, rank)
    single = gather_single(rank, tmp, policies, rec)

    # N GPUs: each mode, each policy; the wiring is undone after each.
    stock_backend = "_native_cudnn"
    for mode in modes:
        e_cp_bf16 = None
        for policy in policies:
            why = context_parallel_refusal(policy) if policy_kind(policy) is PolicyKind.ATTENTION_BACKEND else ""
            if why:
                if rank == 0:
                    record_unsupported(rec, policy, mode, world, why)
                continue
            with policy_processors(model, spec, policy, backend, stock_backend), \
                    context_parallel(model, configs[mode]), _cpu_cudnn_stand_in(not cuda):
                r, out = measure(model, inputs, spec, policy, steps, warmup, cuda, parallel=True)
            if rank == 0:
                e_cp_bf16 = record_parallel_run(rec, r, out, single, e_cp_bf16, policy, mode, world)
    if rank == 0:
        rec.write("complete")
        print(to_markdown(rec.doc), flush=True)


def record_parallel_run(rec: Recorder, r: dict, out, single: dict, e_cp_bf16: Optional[float], policy: str,
                        mode: str, world: int) -> Optional[float]:
    """Rank 0: match one N-GPU run against the 1-GPU outputs, record and log it; returns the mode's bf16 N-GPU vs 1-GPU
    error (set by the bf16 run, which comes first) that the quantized policies' match rule uses."""
    mt = match(policy, out, single, e_cp_bf16)
    if policy == "bf16":
        e_cp_bf16 = mt.get("rel_err_vs_1gpu")
    r.update(setting=mode, gpus=world, mode=mode, rank=0, match=mt)
    rec.add(r)
    _log(0, f"{world} GPUs {mode:<7} {policy:<6} step {r['step_median_s']:.2f} s (attention "
            f"{100 * r['attention_share']:.0f}%); vs 1 GPU: rel err {_fmt(mt.get('rel_err_vs_1gpu'), '.3e')}"
            f", cos {_fmt(mt.get('cos_vs_1gpu'), '.6f')}, match {mt.get('ok')}")
    return e_cp_bf16


def record_unsupported(rec: Recorder, policy: str, mode: str, world: int, why: str) -> None:
    """Rank 0: a policy the framework cannot run in ``mode`` (``why``, one line), recorded instead of a measurement."""
    rec.add({"policy": policy, "setting": mode, "gpus": world, "mode": mode, "rank": 0, "unsupported": why,
             **policy_record(policy)})
    _log(0, f"{world} GPUs {mode:<7} {policy:<6} not run: {why}")


def run(opts: dict, body=None) -> None:
    """Spawn ``opts['world']`` processes running ``body`` (default :func:`_run`); rank 0 writes
    ``opts['json']`` / ``opts['md']``."""
    import torch.multiprocessing as mp

    os.environ.update(NVLS_ENV)
    with gloo_loopback(opts["device"]), tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(opts["world"], tmp, opts, body), nprocs=opts["world"], join=True)


def main(argv=None, *, module: str = "fsattn_diffusers.measure.cp_scaling", body=None,
         description: Optional[str] = None, extra_meta: Optional[dict] = None) -> int:
    """Parse ``argv`` and run. ``module``, ``body``, ``description`` and ``extra_meta`` let a sibling run
    (:mod:`.xdit_scaling`) reuse the command line, the checks and the report with its own worker body."""
    parser = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--policies", default=DEFAULT_POLICIES,
                        help="comma-separated policy or recipe names (bf16, sage, mxfp8, int8-bf16, "
                             "int8-bf16+exponential=exact, ...); a step-scheduled policy (hybrid, hybrid-int8-mxfp8) "
                             "runs its recipes and is projected over 20 steps; bf16 is always run")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=1, help="timed CFG steps per (setting, policy)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed forwards per (setting, policy); the first is the compared output (min 1)")
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--tiny", action="store_true", help="1-layer, 2-head Wan at 128 tokens (CPU smoke run)")
    parser.add_argument("--backend", default="auto", help="fsattn backend (auto, triton, emulator)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--md", default=None)
    parser.add_argument("--wrapper", default=None, help="recorded in the report (the calling script)")
    args = parser.parse_args(argv)
    try:
        policies, projections = expand_policies([p for p in args.policies.split(",") if p.strip()])
    except ValueError as exc:
        parser.error(str(exc))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODES for m in modes):
        parser.error(f"--modes: accepted {', '.join(MODES)}, got {args.modes!r}")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        parser.error(f"--device cuda --world {args.world}: only {torch.cuda.device_count()} CUDA device(s)")
    spec = make_spec(args.frames, args.height, args.width, args.tiny)
    if spec.config["num_attention_heads"] % args.world or e2e.image_tokens(spec) % args.world:
        parser.error(f"heads ({spec.config['num_attention_heads']}) and tokens ({e2e.image_tokens(spec)}) must "
                     f"divide by --world {args.world}")
    cmd = f"python -m {module} " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    meta = dict(_versions(), date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), command=cmd.strip(),
                wrapper=args.wrapper, world=args.world, backend=args.backend, steps=args.steps,
                warmup=max(1, args.warmup), policies=policies, modes=modes, env=dict(NVLS_ENV),
                projections=projections,
                notes=[f"{name} is projected from the measured step times of its recipes in the same setting "
                       f"({' + '.join(f'{plan.count(p)} {p}' for p in dict.fromkeys(plan))} of {len(plan)} steps), "
                       "not timed with step tracking" for name, plan in projections.items()])
    meta.update(extra_meta or {})
    opts = dict(device=args.device, world=args.world, policies=policies, modes=modes, steps=args.steps,
                warmup=max(1, args.warmup), frames=args.frames, height=args.height, width=args.width,
                tiny=args.tiny, backend=args.backend, seed=args.seed, json=args.json, md=args.md, meta=meta)
    run(opts, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
