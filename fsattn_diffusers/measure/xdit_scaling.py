"""Wan2.2-A14B-size transformer on N GPUs under xDiT (``xfuser`` 0.7): latency, scaling, output match.

The measurements, the match rule and the report of :mod:`.cp_scaling` (whose
helpers run here too), with xDiT doing the sequence parallelism and fsattn as xDiT's attention kernel.

* Model: xDiT's own Wan transformer, ``xFuserWanTransformer3DWrapper`` (what xDiT's Wan2.2 T2V runner
  loads, with the runner's ``attention_kwargs``), built by :func:`fsattn_diffusers.measure.e2e.build_transformer`
  with ``cls=`` that class: it adds no parameters, so the seeded random weights are those of the diffusers
  run. It shards the token sequence itself (chunk after the patch embedding, all-gather after
  ``proj_out``); self-attention goes through xDiT's ``USP`` (Ulysses all-to-all over heads, or torch's
  templated ring attention over yunchang's ring group, the kernel merged by its LSE); cross-attention runs
  locally on xDiT's cross-attention backend.
* xDiT is set up per setting as its runner sets it up: ``xFuserArgs(...).create_config()``,
  ``initialize_model_parallel(...)``, ``initialize_runtime_state(...)`` (the "pipeline" is a stand-in
  holding the transformer: the transformer is called directly, 2 forwards per CFG step, as in
  :mod:`.scaling`); the groups are destroyed after each setting.
  **1 GPU** = ``data_parallel_degree=world`` (every rank its own sequence-parallel group of one, no
  communication; the policies are split over the ranks); **N GPUs** = ``ulysses_degree=world`` or
  ``ring_degree=world``.
* ``bf16`` = stock xDiT attention in its ``CUDNN`` slot (xDiT's own default on an H200 without
  flash-attn) for self- and cross-attention. ``sage`` = xDiT's own ``SAGE`` slot (``sageattn`` with its LSE, which
  the ring merges) for self- and cross-attention, as ``--attention_backend SAGE`` selects it; a slot xDiT refuses in
  a setting (its runtime check) is recorded as not supported instead of run. fsattn recipes:
  :func:`fsattn_diffusers.xdit.install` puts fsattn into the ``SDPA_FLASH`` slot and points xDiT's attention
  backend at it; cross-attention stays on ``CUDNN``.
* Attention share: CUDA events around every self-attention ``USP`` call (N GPUs: the Ulysses
  all-to-alls or the ring exchange included; 1 GPU: the kernel).

CPU (``--device cpu --tiny``, the test): xfuser does not import on a CPU-only torch; :func:`import_xfuser`
imports it while ``torch.version.cuda`` reads as set, then restores it, and makes up for the three places
where xfuser keys off a CUDA device (yunchang's Ulysses / ring groups are created and handed to ``USP``,
and the ``CUDNN`` slot gets torch's CPU flash attention, which returns an LSE). Everything else is
xfuser's own code.

Run: ``python -m fsattn_diffusers.measure.xdit_scaling --device cuda --world 2 --json out.json --md out.md``
(needs the ``xfuser``, ``yunchang`` and ``distvae`` packages).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
import types
from typing import Dict, List

import torch

from . import e2e
from . import cp_scaling as scaling
from .cp_scaling import _barrier, _check_identical
from .cp_scaling_report import Recorder, _log, model_facts, report_head, run_meta, table_lines, timing_note
from .scaling_policies import PolicyKind, policy_kind, processor_policy

#: xDiT slot of the stock bf16 kernel (self- and cross-attention).
STOCK_SLOT = "CUDNN"
#: xDiT slot fsattn occupies for the quantized policies.
FSATTN_SLOT = "SDPA_FLASH"
#: Attention-backend policy -> xDiT's own slot for it (self- and cross-attention).
BACKEND_SLOTS = {"sage": "SAGE"}


# ------------------------------------------------------------------------------------------------- xfuser

def _cpu_flash_kernel(query, key, value, dropout_p=0.0, is_causal=False, attention_kwargs=None):
    """xDiT kernel contract on the CPU (stands in for the CUDNN slot): (B, H, S, D) -> (out, LSE (B, H, S))."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal)[:2]
    return out, lse.float()


def import_xfuser(cuda: bool) -> types.SimpleNamespace:
    """The xfuser objects this run uses (``import xfuser`` runs xfuser's whole package init)."""
    if cuda:
        importlib.import_module("xfuser")
    else:
        saved = torch.version.cuda
        torch.version.cuda = saved or "13.0"  # xfuser.envs reads the CUDA version at import
        try:
            importlib.import_module("xfuser")
        finally:
            torch.version.cuda = saved
    from xfuser.config import xFuserArgs
    from xfuser.core.distributed import (get_runtime_state, get_sequence_parallel_world_size,
                                         init_distributed_environment, initialize_model_parallel,
                                         initialize_runtime_state)
    from xfuser.core.distributed import parallel_state, runtime_state
    from xfuser.core.distributed.attention_backend import ATTENTION_FUNCTION_REGISTRY, AttentionBackendType
    from xfuser.model_executor.layers import usp
    from xfuser.model_executor.models.runner_models.wan import _build_attention_kwargs
    from xfuser.model_executor.models.transformers.transformer_wan import (xFuserWanAttnProcessor,
                                                                          xFuserWanTransformer3DWrapper)

    if not cuda:
        # xfuser uses yunchang (its Ulysses / ring process groups) only when torch.cuda.is_available():
        # the flag every module read at import, and USP's handle on yunchang's groups.
        import yunchang.globals

        xf_envs = sys.modules["xfuser.envs"]
        xf_envs.PACKAGES_CHECKER.packages_info["has_long_ctx_attn"] = True
        for name, mod in list(sys.modules.items()):
            if name.startswith("xfuser.") and hasattr(mod, "HAS_LONG_CTX_ATTN"):
                mod.HAS_LONG_CTX_ATTN = True
        usp.PROCESS_GROUP = yunchang.globals.PROCESS_GROUP
        ATTENTION_FUNCTION_REGISTRY[AttentionBackendType[STOCK_SLOT]] = _cpu_flash_kernel  # cuDNN: no CPU kernel
    return types.SimpleNamespace(**{k: v for k, v in locals().items()
                                    if k not in ("cuda", "saved", "xf_envs", "name", "mod", "yunchang")})


def setting_degrees(setting: str, world: int) -> Dict[str, int]:
    """xDiT degrees of a setting: ``1gpu`` = data parallel (one GPU per sequence), else the mode's degree."""
    return dict(data_parallel_degree=world if setting == "1gpu" else 1,
                ulysses_degree=world if setting == "ulysses" else 1,
                ring_degree=world if setting == "ring" else 1)


@contextlib.contextmanager
def xdit_setting(xf, model, setting: str, world: int, cuda: bool, name: str):
    """xDiT's groups and runtime state for ``setting`` (as its runner creates them); torn down on exit."""
    degrees = setting_degrees(setting, world)
    args = xf.xFuserArgs(model=name, attention_backend=STOCK_SLOT, cross_attention_backend=STOCK_SLOT, **degrees)
    engine_config, _ = args.create_config()
    xf.initialize_model_parallel(**degrees, backend="nccl" if cuda else "gloo")
    try:
        xf.initialize_runtime_state(types.SimpleNamespace(transformer=model), engine_config)
        state = xf.get_runtime_state()
        assert state.attention_backend.name == STOCK_SLOT and state.get_cross_attention_backend().name == STOCK_SLOT
        assert xf.get_sequence_parallel_world_size() == (1 if setting == "1gpu" else world)
        yield state
    finally:
        xf.parallel_state.destroy_model_parallel()
        xf.runtime_state._RUNTIME = None


def slot_refusal(state, policy: str) -> str:
    """Why xDiT refuses the slot of an attention-backend policy in the current setting (one line), or ``""``."""
    enum = type(state.attention_backend)
    try:
        state._check_if_backend_compatible_with_current_configuration(enum[BACKEND_SLOTS[policy]])
    except (RuntimeError, ValueError) as exc:
        return f"not supported by xDiT's {BACKEND_SLOTS[policy]} backend: {str(exc).splitlines()[0]}"
    return ""


@contextlib.contextmanager
def xdit_policy(policy: str, backend: str, state=None):
    """``bf16``: xDiT's stock slots as configured; an attention-backend policy (``sage``): its slot of
    :data:`BACKEND_SLOTS` for self- and cross-attention on ``state`` (xDiT's runtime state), the stock slots restored
    on exit; otherwise fsattn installed in :data:`FSATTN_SLOT`."""
    kind = policy_kind(policy)
    if kind is PolicyKind.STOCK:
        yield None
        return
    if kind is PolicyKind.ATTENTION_BACKEND:
        saved = state.attention_backend, state.cross_attention_backend
        state.set_attention_backend(BACKEND_SLOTS[policy])
        state.set_cross_attention_backend(BACKEND_SLOTS[policy])
        try:
            yield None
        finally:
            state.set_attention_backend(saved[0])
            state.set_cross_attention_backend(saved[1])
        return
    from ..xdit import install

    handle = install(processor_policy(policy), slot=FSATTN_SLOT, cross_slot=STOCK_SLOT, backend=backend, record=False)
    try:
        state = handle.runtime_state
        assert state.attention_backend.name == FSATTN_SLOT and state.get_cross_attention_backend().name == STOCK_SLOT
        yield handle
    finally:
        handle.uninstall()


def self_attention_timing(model, xf):
    """``timing`` for :func:`.cp_scaling.measure`: every self-attention processor's ``USP`` call through the timer."""

    @contextlib.contextmanager
    def timing(timer: e2e.AttentionTimer):
        procs = [m.processor for m in model.modules() if isinstance(getattr(m, "processor", None),
                                                                     xf.xFuserWanAttnProcessor)]
        procs = [p for p in procs if not p.is_cross_attention]
        saved = [p.attention_function for p in procs]
        for p, fn in zip(procs, saved):
            p.attention_function = timer.wrap(fn)
        try:
            yield
        finally:
            for p, fn in zip(procs, saved):
                p.attention_function = fn

    return timing


# ---------------------------------------------------------------------------------------------- reporting

def to_markdown(doc: dict) -> str:
    m = doc["meta"]
    w = m["world"]
    notes = ["- xDiT set up per setting as its runner does (`xFuserArgs.create_config`, `initialize_model_parallel`, "
             "`initialize_runtime_state`); 1 GPU = `data_parallel_degree` = number of GPUs (each rank its own "
             f"sequence of one, policies split over the ranks); N GPUs = `ulysses_degree` = {w} or `ring_degree` = "
             f"{w}. The model shards the sequence and gathers the output itself; self-attention through xDiT's "
             "`USP`.",
             timing_note(m),
             f"- bf16 = stock xDiT attention, slot `{STOCK_SLOT}` (cuDNN SDPA), self- and cross-attention; sage = "
             f"xDiT's `{BACKEND_SLOTS['sage']}` slot (`sageattn`), self- and cross-attention; others = "
             f"fsattn (backend `{m['backend']}`) in xDiT's `{FSATTN_SLOT}` slot via `fsattn_diffusers.xdit.install` "
             f"for self-attention, cross-attention stays on `{STOCK_SLOT}`.",
             "- Attention share: CUDA events around every self-attention `USP` call (N GPUs: including the "
             "Ulysses all-to-alls / ring exchange)."]
    head = report_head(doc, "xDiT (xfuser) Ulysses / ring, fsattn as xDiT's attention kernel",
                       f"xfuser {m.get('xfuser')}, yunchang {m.get('yunchang')}, ",
                       f"xDiT's `xFuserWanTransformer3DWrapper` with the {model_facts(m)} transformer forwards (CFG), "
                       "called directly.", notes, "both under xDiT; ")
    return "\n".join(head + table_lines(doc))


# ------------------------------------------------------------------------------------------------- worker

def _run(rank: int, world: int, tmp: str, opts: dict, cuda: bool, device) -> None:
    """One rank of the xDiT run (inside :func:`.cp_scaling._worker`'s process group)."""
    t0 = time.perf_counter()
    xf = import_xfuser(cuda)
    xf.init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="nccl" if cuda else "gloo")
    _log(rank, f"xfuser imported and its world group set up in {time.perf_counter() - t0:.0f} s")
    try:
        _measure_all(xf, rank, world, tmp, opts, cuda, device)
    finally:
        if xf.parallel_state._WORLD is not None:
            xf.parallel_state._WORLD.destroy()
            xf.parallel_state._WORLD = None


def _measure_all(xf, rank: int, world: int, tmp: str, opts: dict, cuda: bool, device) -> None:
    spec = scaling.make_spec(opts["frames"], opts["height"], opts["width"], opts["tiny"])
    policies, modes, steps, warmup, backend = (opts[k] for k in ("policies", "modes", "steps", "warmup", "backend"))
    t0 = time.perf_counter()
    attention_kwargs = xf._build_attention_kwargs(xf.xFuserArgs(attention_backend=FSATTN_SLOT))
    wrapper = lambda **config: xf.xFuserWanTransformer3DWrapper(**config, attention_kwargs=attention_kwargs)
    model = e2e.build_transformer(spec, device, seed=opts["seed"], cls=wrapper)
    inputs = e2e.make_inputs(spec, device, seed=opts["seed"])
    _check_identical(model, inputs, world)
    timing = self_attention_timing(model, xf)
    _log(rank, f"built xFuserWanTransformer3DWrapper ({spec.name}, {e2e.image_tokens(spec)} tokens) in "
               f"{time.perf_counter() - t0:.0f} s; weights and inputs identical on all {world} ranks")
    rec = None
    if rank == 0:
        rec = Recorder(run_meta(opts, spec, world, cuda), opts["json"], opts["md"], render=to_markdown)
        rec.write()

    def one(policy: str, state):
        with xdit_policy(policy, backend, state):
            r, out = scaling.measure(model, inputs, spec, policy, steps, warmup, cuda, parallel=True, timing=timing)
        if policy in BACKEND_SLOTS:  # xDiT's own slot ran it, not the diffusers backend of the policy's name
            r["attention_backend"] = f"xdit:{BACKEND_SLOTS[policy]}"
        return r, out

    def refusal(policy: str, state) -> str:
        return slot_refusal(state, policy) if policy_kind(policy) is PolicyKind.ATTENTION_BACKEND else ""

    # 1 GPU: data parallel over the ranks, policies split, no communication.
    with xdit_setting(xf, model, "1gpu", world, cuda, spec.name) as state:
        for policy in policies[rank::world]:
            r, out = one(policy, state)
            scaling.save_single(rank, tmp, policy, r, out)
        _barrier(cuda, rank)
    single = scaling.gather_single(rank, tmp, policies, rec)

    # N GPUs: xDiT Ulysses, then ring.
    for mode in modes:
        e_cp_bf16 = None
        with xdit_setting(xf, model, mode, world, cuda, spec.name) as state:
            for policy in policies:
                why = refusal(policy, state)
                if why:
                    if rank == 0:
                        scaling.record_unsupported(rec, policy, mode, world, why)
                    continue
                r, out = one(policy, state)
                if rank == 0:
                    e_cp_bf16 = scaling.record_parallel_run(rec, r, out, single, e_cp_bf16, policy, mode, world)
    if rank == 0:
        rec.write("complete")
        print(to_markdown(rec.doc), flush=True)


def _package_versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("xfuser", "yunchang", "distvae"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def main(argv: List[str] = None) -> int:
    return scaling.main(argv, module="fsattn_diffusers.measure.xdit_scaling", body=_run,
                        description=__doc__.splitlines()[0],
                        extra_meta=dict(_package_versions(), framework="xdit", stock_slot=STOCK_SLOT,
                                        fsattn_slot=FSATTN_SLOT))


if __name__ == "__main__":
    sys.exit(main())
