"""Probe: the row sum of an FP8 P tile on the tensor cores (P8 @ ones by one m64nNk32 wgmma chain), standalone.

The third session put this in the gluonpp kernel and its sums came out wrong (LSE 3.4-4.5 nats high, i.e. about 64x
too large); this isolates it. Variants: the ones tile written from registers (as there) or loaded by TMA, N = 8 / 16,
P as a register A operand (as there) or from shared memory.

Usage:  PYTHONPATH=$PWD python scripts/rowsum_probe.py            (GPU: prints the error of each variant)
        PYTHONPATH=$PWD python scripts/rowsum_probe.py --ptx DIR  (no GPU: writes each variant's PTX and SASS)
"""
import argparse
import os
import subprocess
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_wait

BM = gl.constexpr(64)  # one warpgroup's rows


@gluon.jit
def _probe(P, OUT, ones_desc, N: gl.constexpr, BN: gl.constexpr, ONES_TMA: gl.constexpr, A_SMEM: gl.constexpr):
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    pl_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=l_layout, k_width=4)
    blk: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, blk))
    c = gl.arange(0, BN, layout=gl.SliceLayout(0, blk))
    p = gl.load(P + r[:, None] * BN + c[None, :])  # (64, BN) fp8
    if ONES_TMA:
        ones = gl.allocate_shared_memory(gl.float8e4nv, [N, BN], ones_desc.layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(bar, count=1)
        mbarrier.expect(bar, ones_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(ones_desc, [0, 0], bar, ones)
        mbarrier.wait(bar, 0)
    else:
        ones_blk: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        ones = gl.allocate_shared_memory(gl.float8e4nv, [N, BN], gl.NVMMASharedLayout(128, 8, rank=2),
                                         gl.full([N, BN], 1.0, gl.float32, ones_blk).to(gl.float8e4nv))
        fence_async_shared()
        gl.thread_barrier()
    acc = gl.zeros([BM, N], gl.float32, l_layout)
    if A_SMEM:
        a = gl.allocate_shared_memory(gl.float8e4nv, [BM, BN], gl.NVMMASharedLayout(128, 8, rank=2), p)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(a, ones.permute((1, 0)), acc, is_async=True)
    else:
        acc = warpgroup_mma(gl.convert_layout(p, pl_layout), ones.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc,))
    ro = gl.arange(0, BM, layout=gl.SliceLayout(1, l_layout))
    co = gl.arange(0, N, layout=gl.SliceLayout(0, l_layout))
    gl.store(OUT + ro[:, None] * N + co[None, :], acc)


VARIANTS = [dict(N=n, ONES_TMA=t, A_SMEM=s) for n in (8, 16) for t in (False, True) for s in (False, True)]


def ones_desc(n, bn, device):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    ones = torch.ones((n, bn), device=device).to(torch.float8_e4m3fn)
    layout = gl.NVMMASharedLayout.get_default_for([n, bn], gl.float8e4nv)
    return TensorDescriptor(ones, [n, bn], [bn, 1], [n, bn], layout), ones


def run_gpu(bn=128):
    g = torch.Generator(device="cuda").manual_seed(0)
    p = (torch.rand((BM.value, bn), generator=g, device="cuda") * 16).to(torch.float8_e4m3fn)
    want = p.float().sum(1, keepdim=True)
    for v in VARIANTS:
        out = torch.full((BM.value, v["N"]), float("nan"), device="cuda")
        desc, keep = ones_desc(v["N"], bn, "cuda")
        _probe[(1,)](p, out, desc, BN=bn, num_warps=4, **v)
        torch.cuda.synchronize()
        err = (out - want).abs().max().item()
        ratio = (out[:, 0] / want[:, 0]).mean().item()
        print(f"{v}: max |sum - exact| {err:.3e}, mean ratio {ratio:.4f}, columns equal "
              f"{bool((out == out[:, :1]).all())}")


def dump_ptx(outdir, bn=128):
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    os.makedirs(outdir, exist_ok=True)
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for v in VARIANTS:
        n = v["N"]
        layout = gl.NVMMASharedLayout.get_default_for([n, bn], gl.float8e4nv)
        sig = {"P": "*fp8e4nv", "OUT": "*fp32", "ones_desc": f"tensordesc<fp8e4nv[{n}, {bn}],{layout!r}>",
               "N": "constexpr", "BN": "constexpr", "ONES_TMA": "constexpr", "A_SMEM": "constexpr"}
        src = GluonASTSource(fn=_probe, signature=sig, constexprs=dict(v, BN=bn), attrs={})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
        tag = f"n{n}_{'tma' if v['ONES_TMA'] else 'regs'}_{'asmem' if v['A_SMEM'] else 'areg'}"
        open(os.path.join(outdir, tag + ".ptx"), "w").write(k.asm["ptx"])
        open("/tmp/_probe.cubin", "wb").write(k.asm["cubin"])
        sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", "/tmp/_probe.cubin"], capture_output=True,
                              text=True).stdout
        open(os.path.join(outdir, tag + ".sass"), "w").write(sass)
        print(tag, "compiled")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--ptx", default=None)
    a = ap.parse_args()
    if a.ptx:
        dump_ptx(a.ptx)
    else:
        run_gpu()
