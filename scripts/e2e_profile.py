"""Where one Wan2.2-A14B 720p forward's GPU time goes under a policy (torch.profiler, CUDA kernel times).

Usage (H200, diffusers importable): PYTHONPATH=$PWD python scripts/e2e_profile.py [--policy mxfp8] [--layers 40]
Prints the top kernels by total CUDA time for one forward after one warm-up forward, with and without the
attention timer's per-call statistics (``return_stats``, which syncs the host once per call).
"""
import argparse
import sys

import torch

sys.path.insert(0, ".")
from fsattn_diffusers.e2e import (AttentionTimer, _is_self_attention, build_transformer, make_inputs,  # noqa: E402
                                  timed_attention, wan22_spec)
from fsattn_diffusers.integration.processors import WanFSAttnProcessor  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", default="mxfp8")
    a = ap.parse_args()
    spec = wan22_spec()
    model = build_transformer(spec, "cuda")
    inputs = make_inputs(spec, "cuda")
    saved = dict(model.attn_processors)
    procs = {k: (WanFSAttnProcessor(a.policy, layer=k) if _is_self_attention(k, spec) else v) for k, v in saved.items()}
    model.set_attn_processor(procs)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with torch.no_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        model(**inputs(999.0))
        for stats in (False, True):
            torch.cuda.synchronize()
            timer = AttentionTimer()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                if stats:
                    with timed_attention(timer, True):
                        model(**inputs(962.0))
                else:
                    model(**inputs(962.0))
                torch.cuda.synchronize()
            print(f"=== one forward, policy {a.policy}, attention timer with stats: {stats}"
                  + (f" (timer: {timer.seconds():.3f} s over {len(timer.events)} calls)" if stats else ""))
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))


if __name__ == "__main__":
    main()
