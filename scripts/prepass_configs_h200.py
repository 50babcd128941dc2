"""The Q/K pre-pass kernel under other launch configurations (warps, software-pipeline stages, programs per SM),
the V pre-pass under other warp counts, and the public mxfp8 call against FA3 bf16 and its own pre-pass and kernel,
interleaved twice; paper and Wan2.2 720p shapes. Run on the H200 from the repository root:
    source scripts/device_env.sh; python3 scripts/prepass_configs_h200.py
(Output of 2026-12-01 at commit 14a8452's kernels: benchmarks/results/prepass_configs_h200.txt.)"""
import time
import torch
import fsattn_diffusers as fa
from fsattn_diffusers.measure.kernel_bench import timed, fa3_fns
from fsattn_diffusers.kernels import ops as kops
from fsattn_diffusers.kernels import prepass as pp
from fsattn_diffusers.kernels.plan import plan_for
from fsattn_diffusers.kernels.token_mean import token_mean
from fsattn_diffusers.recipe import get_recipe
from fsattn_diffusers.exponent import LOG2E
W, R = 30, 150
for shape in [(1, 24, 32768, 128), (1, 40, 75600, 128)]:
    b, h, s, d = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = d ** -0.5
    res = {}
    f3 = fa3_fns(q, k, v, scale)
    fa3 = f3["fa3"] if not isinstance(f3, str) else None
    plan = plan_for(get_recipe("mxfp8"))
    flags = torch.zeros((b * h,), dtype=torch.int32, device="cuda")
    km = token_mean(k)
    ref_k = pp.prepare_qk(k, plan, 1.0, tile_ref=True, nan_pad=True, mean=km, flags=flags)
    ref_q = pp.prepare_qk(q, plan, scale * LOG2E, tile_ref=True, flags=flags)
    for warps, stages, per_sm in [(8, 2, 2), (8, 1, 2), (16, 1, 1), (16, 1, 2), (16, 2, 1), (4, 1, 4), (4, 2, 4)]:
        pp.QK_WARPS, pp.QK_STAGES, pp.QK_PROGRAMS_PER_SM = warps, stages, per_sm
        kk = pp.prepare_qk(k, plan, 1.0, tile_ref=True, nan_pad=True, mean=km, flags=flags)
        qq = pp.prepare_qk(q, plan, scale * LOG2E, tile_ref=True, flags=flags)
        same = all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a, b_.view(torch.uint8) if b_.dtype == torch.float8_e4m3fn else b_) for a, b_ in zip(kk[:2] + qq[:2], ref_k[:2] + ref_q[:2]))
        tk = timed(lambda: pp.prepare_qk(k, plan, 1.0, tile_ref=True, nan_pad=True, mean=km, flags=flags), W, R)
        tq = timed(lambda: pp.prepare_qk(q, plan, scale * LOG2E, tile_ref=True, flags=flags), W, R)
        res[f"qk warps {warps} stages {stages} per_sm {per_sm}: K(mean,flags) / Q(flags) same={same}"] = (tk, tq)
    pp.QK_WARPS, pp.QK_STAGES, pp.QK_PROGRAMS_PER_SM = 8, 2, 2
    for vw in (4, 8, 16):
        pp.V_WARPS = vw
        res[f"prepare_v(flags) warps {vw}"] = (timed(lambda: pp.prepare_v(v, plan, None, perm=True, flags=flags), W, R),)
    pp.V_WARPS = 8
    # public call against FA3 bf16 and the kernel alone, interleaved twice
    ops = kops.prepass(q, k, v, plan, scale, None)
    out = torch.empty_like(q)
    for rep in range(2):
        if fa3 is not None:
            res[f"fa3-bf16 #{rep}"] = (timed(fa3, W, R),)
        res[f"mxfp8 attention() #{rep}"] = (timed(lambda: fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="triton"), W, R),)
        res[f"mxfp8 prepass(flags) #{rep}"] = (timed(lambda: kops.prepass(q, k, v, plan, scale, None, flags=flags), W, R),)
        res[f"mxfp8 kernel #{rep}"] = (timed(lambda: kops.attention_from_operands(ops, out, plan, s, s, None, None, None), W, R),)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="triton")
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"== {shape}")
    for key, val in res.items():
        print(f"  {key:<75} " + " / ".join(f"{x:8.3f}" for x in val) + " ms")
    print(f"  5 public calls: host returns after {(t1 - t0) * 1e3:.1f} ms, GPU done after {(t2 - t0) * 1e3:.1f} ms")
    del q, k, v, out, ops, f3, fa3
    torch.cuda.empty_cache()
