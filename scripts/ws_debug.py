"""Isolate a failing kernel configuration: each case runs in its own process (CUDA_LAUNCH_BLOCKING=1)."""
import os, subprocess, sys

CASES = {
    "ws_plain": "1,2,256,256,128,0,0,0,ws",
    "ws_tail": "1,2,300,200,128,0,0,0,ws",
    "ws_d64": "1,2,256,256,64,0,0,0,ws",
    "ws_kvl": "2,2,256,256,128,1,0,0,ws",
    "ws_lse": "1,2,256,256,128,0,1,0,ws",
    "ws_stats": "1,2,256,256,128,0,0,1,ws",
    "classic_all": "2,3,300,200,64,1,1,1,classic",
}


def one(spec):
    import torch
    from fsattn_diffusers.backends.triton_backend import kernels_package
    kernels_package()
    from fsattn_diffusers.kernels.ops import fused_attention
    from fsattn_diffusers.kernels.plan import plan_for
    from fsattn_diffusers.recipe import PRESETS
    from fsattn_diffusers.emulator import emulate_attention
    b, h, sq, sk, d, kvl, lse, st, var = spec.split(",")
    b, h, sq, sk, d = map(int, (b, h, sq, sk, d))
    os.environ["FSATTN_KERNEL_VARIANT"] = var
    import fsattn_diffusers.kernels.ops as ops
    ops.VARIANT = var
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for s in (sq, sk, sk))
    lens = torch.tensor([sk, sk // 2 + 1][:b], device="cuda") if kvl == "1" else None
    out, l_, stt = fused_attention(q, k, v, plan_for(PRESETS["mxfp8"]), scale=d ** -0.5, kv_lens=lens,
                                   return_lse=lse == "1", return_stats=st == "1")
    torch.cuda.synchronize()
    emu, _, _ = emulate_attention(q, k, v, PRESETS["mxfp8"], scale=d ** -0.5, kv_lens=lens)
    err = ((out.float() - emu.float()).norm() / emu.float().norm()).item()
    print(f"OK {spec} k-vs-emu {err:.4f} nan {torch.isnan(out).any().item()} stats {stt}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        one(sys.argv[1])
    else:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        for name, spec in CASES.items():
            r = subprocess.run([sys.executable, __file__, spec], env=env, capture_output=True, text=True, timeout=300)
            tail = (r.stdout + r.stderr).strip().splitlines()
            msg = [l for l in tail if l.startswith("OK") or "Error" in l or "error" in l][-2:]
            print(name, "rc", r.returncode, "|", " / ".join(msg)[:400], flush=True)
