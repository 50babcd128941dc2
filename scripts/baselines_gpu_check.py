"""GPU checks before the end-to-end baseline runs (one H200, ~1-2 min).

1. The FA3 baselines against torch SDPA in FP32 at a Wan-like shape: ``fa3`` and ``fa3-fp8`` through
   ``fsattn_diffusers.attention(..., backend="fa3")``, dense and with ``kv_lens`` (FA3's varlen entry), and
   the LSE; relative L2 errors printed, a failure exits 1.
2. Graph breaks: ``torch._dynamo.explain`` of one real-width Wan2.2-A14B block (40 heads x 128, 9 frames of
   720p = 10800 tokens) and one HunyuanVideo dual-stream block with padded text, per policy (stock bf16,
   fa3, fa3-fp8, mxfp8 on the Triton kernel), with the backend probes cached (as ``fsattn e2e --compile``
   runs) and cold (first call traced).

    python scripts/baselines_gpu_check.py --json out/baselines_gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

import fsattn_diffusers
from fsattn_diffusers import backends, e2e, e2e_config
from fsattn_diffusers.integration.policy import get_policy

# FP8 E4M3 Q/K/V (per-head scales) on N(0,1) operands: a few percent; BF16: rounding only.
BOUNDS = {"fa3": 1e-2, "fa3-fp8": 0.08}


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check_fa3(device) -> list:
    g = torch.Generator(device="cpu").manual_seed(0)
    b, s, h, d = 2, 4096, 8, 128
    q, k, v = (torch.randn(b, s, h, d, generator=g).to(device, torch.bfloat16) for _ in range(3))
    lens = torch.tensor([s, 3000], device=device)
    mask = (torch.arange(s, device=device)[None, :] < lens[:, None])[:, None, None, :]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    ref = {None: F.scaled_dot_product_attention(qf, kf, vf).transpose(1, 2),
           "lens": F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask).transpose(1, 2)}
    scores = qf @ kf.transpose(-1, -2) * d ** -0.5
    ref_lse = {None: torch.logsumexp(scores, -1),
               "lens": torch.logsumexp(scores.masked_fill(~mask, float("-inf")), -1)}
    rows = []
    for name in ("fa3", "fa3-fp8"):
        recipe = get_policy(name).entry
        for key in (None, "lens"):
            out, lse = fsattn_diffusers.attention(q, k, v, recipe, backend="fa3", return_lse=True,
                                                  kv_lens=lens if key else None)
            err, lse_err = _rel(out, ref[key]), (lse - ref_lse[key]).abs().max().item()
            ok = err < BOUNDS[name] and lse_err < 0.05 and out.dtype == torch.bfloat16
            rows.append({"policy": name, "kv_lens": bool(key), "rel_l2": err, "lse_max_abs": lse_err, "ok": ok})
            print(f"  {name:8} {'varlen' if key else 'dense ':6} rel L2 {err:.3e}  LSE max|diff| {lse_err:.2e}  "
                  f"{'ok' if ok else 'FAIL'}", flush=True)
    return rows


def _cold() -> None:
    for be in backends.registered().values():
        be._seen.clear()


def graph_breaks(device) -> list:
    rows = []
    shapes = {"wan2.2-a14b": (e2e.wan22_spec(frames=9, scale={"num_layers": 1}), "blocks"),
              "hunyuanvideo": (e2e.hunyuan_spec(frames=9, scale={"num_layers": 1, "num_single_layers": 1}),
                               "transformer_blocks")}
    for model_name, (spec, blocks) in shapes.items():
        model = e2e.build_transformer(spec, device)
        inputs = e2e.make_inputs(spec, device)
        kw = inputs(500.0)
        if "encoder_attention_mask" in kw:  # padded text: 200 of 256 tokens valid
            kw["encoder_attention_mask"] = kw["encoder_attention_mask"].clone()
            kw["encoder_attention_mask"][:, 200:] = False
        block = getattr(model, blocks)[0]
        for policy in ("bf16", "fa3", "fa3-fp8", "mxfp8"):
            fsattn_diffusers.apply(model, policy=policy, record=False)
            try:
                args, kwargs = e2e_config.block_inputs(model, block, lambda: model(**kw))
                for probes in ("cached", "cold"):
                    if probes == "cold":
                        _cold()
                    t0 = time.perf_counter()
                    rep = e2e_config.explain_block(block, args, kwargs)
                    rows.append({"model": model_name, "policy": policy, "probes": probes, **rep,
                                 "seconds": time.perf_counter() - t0})
                    print(f"  {model_name:13} {policy:8} probes {probes:6} graphs {rep['graphs']} "
                          f"breaks {rep['graph_breaks']}" + (f"  first: {rep['reasons'][0]}" if rep["reasons"] else ""),
                          flush=True)
            finally:
                fsattn_diffusers.remove(model)
        del model
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}", flush=True)
    print("FA3 baselines vs FP32 SDPA:", flush=True)
    fa3 = check_fa3(device)
    print("graph breaks (torch._dynamo.explain of one block):", flush=True)
    breaks = graph_breaks(device)
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": torch.cuda.get_device_name(device),
           "torch": torch.__version__, "fa3": fa3, "graph_breaks": breaks}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    return 0 if all(r["ok"] for r in fa3) else 1


if __name__ == "__main__":
    sys.exit(main())
