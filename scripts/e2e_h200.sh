#!/usr/bin/env bash
# End to end on one H200: per-step latency of Wan2.2-T2V-A14B (720p x 81 frames) and HunyuanVideo (720p x 129)
# transformers with random weights, per attention policy, against stock SDPA bf16 and FlashAttention-3 (BF16, FP8).
#   OUT=$OUT bash scripts/e2e_h200.sh [check|wan-policies|wan-bf16|wan-fp8|wan-compile|hunyuan|profile|rope|all ...]
#        [-- flags for the one part's `fsattn e2e`]
# Wheels carried in .whl: diffusers 0.42.1; for the FA3 policies fa3-fwd 0.0.3 and einops; for wan-fp8 torchao 0.18
# (needs torch >= 2.11).
# One part per 10-minute call (times: Wan2.2 bf16 step ~24 s; per policy 1 warm-up forward, STEPS=2 timed steps):
#   check         FA3 baselines vs FP32 SDPA (dense and varlen, LSE), graph breaks of one Wan / HunyuanVideo block
#                 per policy with the backend probes cached and cold -> e2e_check_h200.{json,txt}, ~2 min
#   wan-policies  Wan2.2, BF16 GEMMs, policies bf16,mxfp8,mxfp6,mxfp4 -> e2e_wan-policies_h200.{json,md,txt}, ~7 min
#   wan-bf16      Wan2.2, BF16 GEMMs, eager: bf16,fa3,fa3-fp8,mxfp8, ~6.5 min      wan-fp8  the same, --gemms fp8, ~6 min
#   wan-compile   the same as wan-bf16 with --compile (inductor per policy), ~7.5 min (STEPS=1 if close to the limit)
#   hunyuan       HunyuanVideo, 64 of 256 text tokens valid (varlen): bf16,fa3,mxfp8, ~5 min
#   wan-hybrid    not in `all`: Wan2.2, one real 20-step hybrid run (mxfp6 on the first and last 3 steps, mxfp4
#                 between) against one bf16 step, ~9.5 min (SCHEDULE_STEPS=10 halves it)
#   wan-hopper    not in `all`: Wan2.2, BF16 GEMMs, eager: bf16,fa3,fa3-fp8,sage,mxfp8,int8-fp8,int8-bf16, ~6.5 min
#                 with the SageAttention 2 build (sage needs .sage/ carried: scripts/device_env.sh builds it)
#                 -> e2e_wan-hopper_h200.{json,md,txt} (README: e2e_wan22_hopper_<device>); HOPPER_SCHEDULE=1 adds one
#                 real SCHEDULE_STEPS-step run of hybrid-int8-mxfp8 (use SCHEDULE_STEPS=10 to stay in one call)
#   profile       not in `all`: torch.profiler of one Wan2.2 forward under POLICY (default mxfp8): top 30 CUDA kernels
#                 -> e2e_profile_h200.txt, ~2 min
#   rope          not in `all`: Wan's RoPE on one 75600 x 40 x 128 operand: the processors' torch version, diffusers'
#                 arithmetic and the fused kernel (kernels/rope.py), equality and ms -> rope_h200.txt, < 1 min
PARTS_ALL="check wan-policies wan-bf16 wan-fp8 wan-compile hunyuan" PARTS_MORE="wan-hybrid wan-hopper profile rope"
source "$(dirname "$0")/device_env.sh"

baselines_check() {
  timeout 300 python3 - "$OUT/e2e_check_h200.json" <<'PY'
import json, sys, time
import torch
import torch.nn.functional as F
import fsattn_diffusers
from fsattn_diffusers import backends
from fsattn_diffusers.integration.policy import get_policy
from fsattn_diffusers.measure import e2e, e2e_config, provenance

dev = torch.device("cuda")
bounds = {"fa3": 1e-2, "fa3-fp8": 0.08}  # FP8 E4M3 Q/K/V with per-head scales on N(0,1): a few percent
g = torch.Generator().manual_seed(0)
b, s, h, d = 2, 4096, 8, 128
q, k, v = (torch.randn(b, s, h, d, generator=g).to(dev, torch.bfloat16) for _ in range(3))
lens = torch.tensor([s, 3000], device=dev)
mask = (torch.arange(s, device=dev)[None, :] < lens[:, None])[:, None, None, :]
qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
scores = qf @ kf.transpose(-1, -2) * d ** -0.5
ref = {False: (F.scaled_dot_product_attention(qf, kf, vf).transpose(1, 2), torch.logsumexp(scores, -1)),
       True: (F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask).transpose(1, 2),
              torch.logsumexp(scores.masked_fill(~mask, float("-inf")), -1))}
fa3 = []
for name in bounds:
    for varlen in (False, True):
        out, lse = fsattn_diffusers.attention(q, k, v, get_policy(name).entry, backend="fa3", return_lse=True,
                                              kv_lens=lens if varlen else None)
        err = ((out.float() - ref[varlen][0]).norm() / ref[varlen][0].norm()).item()
        lse_err = (lse - ref[varlen][1]).abs().max().item()
        ok = err < bounds[name] and lse_err < 0.05 and out.dtype == torch.bfloat16
        fa3.append(dict(policy=name, kv_lens=varlen, rel_l2=err, lse_max_abs=lse_err, ok=ok,
                        **provenance.policy_record(name)))
        print(f"{name:8} {'varlen' if varlen else 'dense':6} rel L2 {err:.3e} LSE max|diff| {lse_err:.2e} {'ok' if ok else 'FAIL'}")
breaks = []
models = {"wan2.2-a14b": (e2e.wan22_spec(frames=9, scale={"num_layers": 1}), "blocks"),
          "hunyuanvideo": (e2e.hunyuan_spec(frames=9, scale={"num_layers": 1, "num_single_layers": 1}), "transformer_blocks")}
for model_name, (spec, blocks) in models.items():
    model = e2e.build_transformer(spec, dev)
    kw = e2e.make_inputs(spec, dev)(500.0)
    if "encoder_attention_mask" in kw:  # padded text: 200 of 256 tokens valid
        kw["encoder_attention_mask"] = kw["encoder_attention_mask"].clone()
        kw["encoder_attention_mask"][:, 200:] = False
    block = getattr(model, blocks)[0]
    for policy in ("bf16", "fa3", "fa3-fp8", "mxfp8"):
        fsattn_diffusers.apply(model, policy=policy, record=False)
        try:
            args, kwargs = e2e_config.block_inputs(model, block, lambda: model(**kw))
            for probes in ("cached", "cold"):
                if probes == "cold":  # first call traced: the backends' availability probes run inside the graph
                    for backend in backends.registered().values():
                        backend._seen.clear()
                rep = e2e_config.explain_block(block, args, kwargs)
                breaks.append(dict(model=model_name, policy=policy, probes=probes, **rep,
                                   **provenance.policy_record(policy)))
                print(f"{model_name:13} {policy:8} probes {probes:6} graphs {rep['graphs']} breaks {rep['graph_breaks']}"
                      + (f"  first: {rep['reasons'][0]}" if rep["reasons"] else ""))
        finally:
            fsattn_diffusers.remove(model)
    del model
    torch.cuda.empty_cache()
doc = dict(meta=provenance.header("OUT=$OUT bash scripts/e2e_h200.sh check"), fa3=fa3, graph_breaks=breaks)
json.dump(doc, open(sys.argv[1], "w"), indent=1, default=str)
sys.exit(0 if all(r["ok"] for r in fa3) else 1)
PY
}

e2e_profile() {
  POLICY=${POLICY:-mxfp8} timeout 400 python3 - <<'PY'
import os
import torch
import fsattn_diffusers
from fsattn_diffusers.measure import e2e

policy = os.environ["POLICY"]
spec = e2e.wan22_spec()
model = e2e.build_transformer(spec, "cuda")
inputs = e2e.make_inputs(spec, "cuda")
if policy != "bf16":
    fsattn_diffusers.apply(model, policy=policy, record=False)
from torch.nn.attention import SDPBackend, sdpa_kernel
with torch.no_grad(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
    model(**inputs(999.0))  # warm-up: compiles and autotunes
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model(**inputs(962.0))
        torch.cuda.synchronize()
print(f"one Wan2.2-A14B 720p x 81 forward, policy {policy}, top kernels by CUDA time")
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))
PY
}

rope_bench() {
  timeout 200 python3 - <<'PY'
import torch, triton
from fsattn_diffusers.integration.processors import _rope_interleaved
from fsattn_diffusers.kernels.rope import rope_interleaved

def diffusers_rope(x, cos, sin):  # the arithmetic of diffusers 0.42 WanAttnProcessor's apply_rotary_emb
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)

s, h, d = 75600, 40, 128
x = torch.randn((1, s, h * d), device="cuda", dtype=torch.bfloat16).unflatten(2, (h, d))
ang = torch.rand((1, s, 1, d // 2), device="cuda") * 100
cos, sin = torch.cos(ang).repeat_interleave(2, -1), torch.sin(ang).repeat_interleave(2, -1)
ref = _rope_interleaved(x, cos, sin)
print("fused == torch:", torch.equal(rope_interleaved(x, cos, sin), ref),
      " diffusers == torch:", torch.equal(diffusers_rope(x, cos, sin), ref))
for name, fn in (("torch (processors)", _rope_interleaved), ("diffusers", diffusers_rope), ("fused kernel", rope_interleaved)):
    ms = triton.testing.do_bench(lambda: fn(x, cos, sin), warmup=50, rep=500, return_mode="median")
    print(f"{name:<20} {ms:.3f} ms per operand ({2 * x.numel() * 2 / ms * 1e-6:.0f} GB/s of bf16 in+out)")
PY
}

STEPS=${STEPS:-2}
WAN=(fsattn e2e --model wan22 --steps "$STEPS" --warmup 1)
BASELINES=(--policies bf16,fa3,fa3-fp8,mxfp8)
for part in "${PARTS[@]}"; do
  files=(--json "$OUT/e2e_${part}_h200.json" --md "$OUT/e2e_${part}_h200.md")
  case $part in
    check)        run_logged e2e_check_h200.txt baselines_check ;;
    wan-policies) run_logged e2e_${part}_h200.txt timeout "${LIMIT:-570}" "${WAN[@]}" "${files[@]}" "${EXTRA[@]}" ;;
    wan-hybrid)   run_logged e2e_${part}_h200.txt timeout "${LIMIT:-590}" fsattn e2e --model wan22 --steps 1 --warmup 1 \
                    --policies bf16,hybrid --schedule-steps "${SCHEDULE_STEPS:-20}" "${files[@]}" "${EXTRA[@]}" ;;
    wan-hopper)   hopper=(--policies bf16,fa3,fa3-fp8,sage,mxfp8,int8-fp8,int8-bf16)
                  [[ ${HOPPER_SCHEDULE:-0} == 1 ]] && hopper=(--policies bf16,fa3,fa3-fp8,sage,mxfp8,int8-fp8,int8-bf16,hybrid-int8-mxfp8
                                                           --schedule-steps "${SCHEDULE_STEPS:-10}")
                  run_logged e2e_${part}_h200.txt timeout "${LIMIT:-590}" "${WAN[@]}" "${hopper[@]}" --gemms bf16 \
                    "${files[@]}" "${EXTRA[@]}" ;;
    wan-bf16)     run_logged e2e_${part}_h200.txt timeout "${LIMIT:-570}" "${WAN[@]}" "${BASELINES[@]}" --gemms bf16 \
                    "${files[@]}" "${EXTRA[@]}" ;;
    wan-fp8)      run_logged e2e_${part}_h200.txt timeout "${LIMIT:-570}" "${WAN[@]}" "${BASELINES[@]}" --gemms fp8 \
                    "${files[@]}" "${EXTRA[@]}" ;;
    wan-compile)  run_logged e2e_${part}_h200.txt timeout "${LIMIT:-570}" "${WAN[@]}" "${BASELINES[@]}" --gemms bf16 \
                    --compile "${files[@]}" "${EXTRA[@]}" ;;
    hunyuan)      run_logged e2e_${part}_h200.txt timeout "${LIMIT:-570}" fsattn e2e --model hunyuan --steps "$STEPS" \
                    --warmup 1 --policies bf16,fa3,mxfp8 --text-valid 64 "${files[@]}" "${EXTRA[@]}" ;;
    profile)      run_logged e2e_profile_h200.txt e2e_profile ;;
    rope)         run_logged rope_h200.txt rope_bench ;;
  esac
done
finish
