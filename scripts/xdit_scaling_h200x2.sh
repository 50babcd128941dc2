#!/usr/bin/env bash
# Issue 8, xDiT half: Wan2.2-A14B-size transformer (random weights) at 720p x 81 frames on 2 H200s under xDiT
# (xfuser 0.7): 1 GPU vs Ulysses=2 vs Ring=2, policies bf16 (stock xDiT CUDNN slot), mxfp8, hybrid (= mxfp6 +
# mxfp4 timed, 20-step projection) with fsattn in xDiT's SDPA_FLASH slot; per-step latency, speedup over bf16,
# 1->2 GPU scaling, 2-GPU vs 1-GPU output match.
# One nvidia-h200-x2 call, expected ~5-6 min (xfuser import + build ~1 min, 1-GPU phase ~1.5 min, 2-GPU ~2.5-3).
# Needs in .whl (carry it): diffusers 0.42.1, importlib_metadata, xfuser 0.7.0, yunchang 0.6.4, distvae 0.1.0
# (the image has xfuser's other imports: einops, pyyaml, peft, sentencepiece, transformers, accelerate).
# Run from the repository root:
#   OUT=$OUT bash scripts/xdit_scaling_h200x2.sh          (extra flags go to the module, e.g. --modes ulysses)
# Writes $OUT/xdit_scaling_h200x2.{json,md,txt} (JSON/markdown rewritten after every measurement), env, stderr.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv; nvidia-smi topo -m
  git log -1 --format='commit %H %s' 2>/dev/null
  python3 -m pip list 2>/dev/null | grep -iE '^(torch|triton|diffusers|xfuser|yunchang|distvae|einops|peft) '; } \
  > "$OUT/xdit_scaling_env.txt" 2>&1
timeout "${LIMIT:-560}" python3 -m fsattn_diffusers.parallel.xdit_scaling --device cuda --world 2 \
  --policies "${POLICIES:-bf16,mxfp8,hybrid}" --steps "${STEPS:-1}" --warmup 1 \
  --json "$OUT/xdit_scaling_h200x2.json" --md "$OUT/xdit_scaling_h200x2.md" --wrapper "scripts/xdit_scaling_h200x2.sh" \
  "$@" 2>"$OUT/xdit_scaling_stderr.txt" | tee "$OUT/xdit_scaling_h200x2.txt"
rc=${PIPESTATUS[0]}; echo "rc=$rc" | tee -a "$OUT/xdit_scaling_h200x2.txt"
grep -v "split will not be applied\|Using .* as \(cross-\)\?attention backend" "$OUT/xdit_scaling_stderr.txt" | tail -25
exit "$rc"
