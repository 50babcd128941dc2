"""Sharded versus one-process fsattn attention, in N processes (gloo on CPU, NCCL on GPUs).

Every rank builds the same seeded q, k, v of the whole sequence, keeps its sequence shard and runs
three sequence-parallel schemes with fsattn as the local kernel:

* ``ring``: diffusers' ``TemplatedRingAttention`` (``ContextParallelConfig(ring_degree=N)``), merging
  per-K/V-shard results by their LSE;
* ``ulysses``: diffusers' ``TemplatedUlyssesAttention`` (``ulysses_degree=N``): all-to-all to the
  full sequence over H/N heads, no LSE;
* ``xdit_ring``: torch's ``_templated_ring_attention``, the ring that xDiT's ``USP`` runs, with
  :class:`~fsattn_diffusers.parallel.XDiTAttention` as the kernel (the xDiT contract).

The gathered outputs are compared with one process's call over the whole sequence, both measured
against exact float64 attention (:func:`compare`). A tiny Wan transformer with fsattn's processors also
runs whole under ring and Ulysses, wired as ``enable_parallelism`` wires it (that method itself needs an
accelerator: it takes the device as ``rank % torch.accelerator.device_count()``), and is compared with
one process (:func:`compare_wan`). Run: ``python -m fsattn_diffusers.measure.parallel_check``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from typing import Dict, List, Sequence

import torch

from ..testing import SPLIT_FLOOR, SPLIT_RELATIVE, error_and_cosine, errors_agree, exact_attention
from ..api import attention

MODES = ("ring", "ulysses", "xdit_ring")
#: Sharded error may differ from the one-process error by this fraction of it, plus an absolute floor (fp32
#: rounding of the merge, visible only for the ``exact`` recipe): the shared split rule of :mod:`..testing`.
RELATIVE_TOLERANCE, ABSOLUTE_FLOOR = SPLIT_RELATIVE, SPLIT_FLOOR
#: (B, S, H, D): tiny, two 128-key tiles per shard with two shards, heads divisible by the shards.
DEFAULT_SHAPE = (1, 512, 4, 64)
SEED = 7
#: Environment for the spawned CPU ranks: gloo over loopback (set only where the caller has not).
GLOO_LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo"}


def make_inputs(shape: Sequence[int] = DEFAULT_SHAPE, seed: int = SEED, device="cpu"):
    """Seeded standard-normal q, k, v (B, S, H, D) float32; identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(device) for _ in range(3))


def _parallel_config(ring: int, ulysses: int, rank: int, world: int, device: torch.device):
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    cp = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses)
    mesh = init_device_mesh(device.type, cp.mesh_shape, mesh_dim_names=cp.mesh_dim_names)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(rank, world, device, mesh=mesh)
    return config


def _xdit_ring(q, k, v, recipe, backend):
    """torch's templated ring over the WORLD group with the xDiT kernel contract, as xDiT's USP calls it."""
    import torch.distributed as dist
    from torch.distributed.tensor.experimental._attention import _cp_options, _templated_ring_attention

    from ..parallel.xdit_adapter import XDiTAttention

    _cp_options.enable_load_balance = False  # as xDiT sets it
    fn = XDiTAttention(recipe, fallback=lambda *a, **kw: None, backend=backend)
    qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))  # xDiT's (B, H, S, D)
    out, *_ = _templated_ring_attention(dist.group.WORLD, 1, fn, qb, kb, vb, dropout_p=0.0, is_causal=False,
                                        attention_kwargs=None)
    return out.transpose(1, 2)


def wan_inputs(device="cpu"):
    """Latents (1, 16, 5, 16, 16) = 320 tokens, timestep, text (1, 24, 32) for the tiny Wan transformer."""
    g = torch.Generator().manual_seed(SEED)
    x, ctx = torch.randn(1, 16, 5, 16, 16, generator=g), torch.randn(1, 24, 32, generator=g)
    return x.to(device), torch.tensor([700.0], device=device), ctx.to(device)


def wan_model(policy: str, backend: str, device="cpu"):
    """The tiny Wan transformer (2 heads of dim 64) with fsattn on its self-attention (``bf16``: stock)."""
    import fsattn_diffusers
    from ..integration.tiny import tiny_wan_transformer

    model = tiny_wan_transformer().to(device)
    if policy != "bf16":
        fsattn_diffusers.apply(model, policy=policy, backend=backend, record=False)
    return model


def _wire_context_parallel(model, config) -> None:
    """What ``model.enable_parallelism(config)`` does once the mesh exists: processors get the config,
    the model's ``_cp_plan`` hooks split the sequence and gather the output."""
    from diffusers.hooks.context_parallel import apply_context_parallel

    model._parallel_config = config
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_parallel_config"):
            processor._parallel_config = config
    apply_context_parallel(model, config.context_parallel_config, model._cp_plan)


def _worker(rank: int, world: int, init_file: str, out_file: str, recipes: List[str], shape, device_type: str,
            backend: str, wan_policies: List[str]) -> None:
    import warnings

    import torch.distributed as dist

    from ..integration.context_parallel import context_parallel_attention
    from ..recipe import get_recipe

    warnings.filterwarnings("ignore", category=FutureWarning)  # diffusers' all_gather_tensor deprecation
    warnings.filterwarnings("ignore", message="fsattn: using the 'emulator' backend")
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", init_method=f"file://{init_file}",
                            rank=rank, world_size=world)
    try:
        ring_cfg = _parallel_config(world, 1, rank, world, device)
        uly_cfg = _parallel_config(1, world, rank, world, device)
        q, k, v = make_inputs(shape, device=device)
        local = shape[1] // world
        shard = [t[:, rank * local:(rank + 1) * local].contiguous() for t in (q, k, v)]
        results: Dict[str, Dict[str, torch.Tensor]] = {}
        with torch.no_grad():
            for name in recipes:
                recipe = get_recipe(name)
                outs = {"ring": context_parallel_attention(*shard, recipe, ring_cfg, backend=backend),
                        "ulysses": context_parallel_attention(*shard, recipe, uly_cfg, backend=backend),
                        "xdit_ring": _xdit_ring(*shard, recipe, backend)}
                for mode, out in outs.items():
                    parts = [torch.empty_like(out) for _ in range(world)]
                    dist.all_gather(parts, out.contiguous())
                    results.setdefault(name, {})[mode] = torch.cat(parts, dim=1).cpu()
            for policy in wan_policies:
                for mode, config in (("ring", ring_cfg), ("ulysses", uly_cfg)):
                    model = wan_model(policy, backend, device)
                    _wire_context_parallel(model, config)
                    out = model(*wan_inputs(device), return_dict=False)[0]  # gathered by the _cp_plan
                    results.setdefault(f"wan:{policy}", {})[mode] = out.cpu()
        if rank == 0:
            torch.save(results, out_file)
        # Both ranks leave together: a rank that tears its gloo pairs down while the other still has
        # collectives in flight makes the other's gloo thread throw, which aborts that process.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_sharded(recipes: Sequence[str], *, world: int = 2, shape=DEFAULT_SHAPE, device: str = "cpu",
                backend: str = "auto", wan_policies: Sequence[str] = ()) -> Dict[str, Dict[str, torch.Tensor]]:
    """Run every mode for every recipe in ``world`` spawned processes.

    Returns ``{recipe: {mode: out (B, S, H, D)}}`` and, for each of ``wan_policies``,
    ``{"wan:" + policy: {"ring" | "ulysses": tiny Wan transformer output}}``.
    """
    import torch.multiprocessing as mp

    if shape[1] % world or shape[2] % world:
        raise ValueError(f"shape {tuple(shape)}: sequence and heads must divide by {world} processes")
    with gloo_loopback(device), tempfile.TemporaryDirectory() as tmp:
        init_file, out_file = os.path.join(tmp, "init"), os.path.join(tmp, "out.pt")
        mp.spawn(_worker, args=(world, init_file, out_file, list(recipes), tuple(shape), device, backend,
                                list(wan_policies)), nprocs=world, join=True)
        return torch.load(out_file, weights_only=False)  # this run's own file (records hold Recipe modes)


@contextlib.contextmanager
def gloo_loopback(device: str):
    """While spawning CPU ranks: :data:`GLOO_LOOPBACK_ENV` where the caller has not set it, undone afterwards.

    gloo binds to the address the host name resolves to unless told otherwise; the ranks share one machine, so
    loopback is the one interface that always exists (the children inherit the setting). CUDA ranks (NCCL) are
    left alone."""
    added = {k: v for k, v in GLOO_LOOPBACK_ENV.items() if device == "cpu" and k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def exact_reference(q, k, v) -> torch.Tensor:
    """float64 softmax attention on (B, S, H, D) (:func:`fsattn_diffusers.testing.exact_attention`)."""
    return exact_attention(q, k, v, layout="bshd")[0]


def compare(recipe: str, sharded: Dict[str, torch.Tensor], q, k, v, backend: str = "auto") -> List[Dict]:
    """Rows ``{recipe, mode, e_single, e_sharded, max_abs_diff, ok}``; errors are global relative errors."""
    ref = exact_reference(q, k, v)
    single = attention(q, k, v, recipe, backend=backend)
    e_single, _ = error_and_cosine(single, ref)
    rows = []
    for mode, out in sharded.items():
        e_sharded, _ = error_and_cosine(out, ref)
        rows.append(dict(recipe=recipe, mode=mode, e_single=e_single, e_sharded=e_sharded,
                         max_abs_diff=(out.double().cpu() - single.double().cpu()).abs().max().item(),
                         ok=errors_agree(e_sharded, e_single)))
    return rows


def compare_wan(policy: str, sharded: Dict[str, torch.Tensor], backend: str = "auto") -> List[Dict]:
    """Tiny Wan transformer: error of the sharded and one-process fsattn outputs against stock attention."""
    with torch.no_grad():
        stock = wan_model("bf16", backend)(*wan_inputs(), return_dict=False)[0]
        single = wan_model(policy, backend)(*wan_inputs(), return_dict=False)[0]
    e_single, _ = error_and_cosine(single, stock)
    rows = []
    for mode, out in sharded.items():
        e_sharded, _ = error_and_cosine(out, stock)
        rows.append(dict(recipe=f"wan:{policy}", mode=mode, e_single=e_single, e_sharded=e_sharded,
                         max_abs_diff=(out.double() - single.double()).abs().max().item(),
                         ok=errors_agree(e_sharded, e_single)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="exact,bf16,mxfp8,mxfp6,mxfp4")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--shape", default=",".join(map(str, DEFAULT_SHAPE)), help="B,S,H,D")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--backend", default="auto", help="fsattn backend (auto, emulator, triton, ...)")
    parser.add_argument("--wan-policies", default="exact,mxfp8", help="tiny Wan transformer runs ('' for none)")
    args = parser.parse_args(argv)
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    shape = tuple(int(x) for x in args.shape.split(","))
    wan = [p.strip() for p in args.wan_policies.split(",") if p.strip()]
    results = run_sharded(recipes, world=args.world, shape=shape, device=args.device, backend=args.backend,
                          wan_policies=wan)
    q, k, v = make_inputs(shape, device=args.device)
    failed = 0
    print(f"{'recipe':10} {'mode':10} {'err one process':>15} {'err sharded':>12} {'max|diff|':>10}  ok")
    rows = [row for name in recipes for row in compare(name, results[name], q, k, v, backend=args.backend)]
    rows += [row for p in wan for row in compare_wan(p, results[f"wan:{p}"], backend=args.backend)]
    for row in rows:
        failed += not row["ok"]
        print(f"{row['recipe']:10} {row['mode']:10} {row['e_single']:15.3e} {row['e_sharded']:12.3e} "
              f"{row['max_abs_diff']:10.2e}  {'yes' if row['ok'] else 'NO'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
