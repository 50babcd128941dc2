#!/usr/bin/env bash
# Structured-input accuracy suite on one H200: every input family (fp16 and bf16, D 64 and 128) at
# (B, H, S) = (1, 8, 8192), every mxfp* preset through the Triton kernel, the conventional softmax on the
# same quantized operands (emulator on the GPU), FlashAttention-3 BF16 and FP8 (per-head scales) from the
# carried fa3-fwd wheel, against float64 exact attention on all query rows; bar checks printed.
# Run from the repository root with the fa3-fwd and einops wheels carried in .whl:
#   OUT=$OUT bash scripts/structured_suite_h200.sh      (extra flags go to the command, e.g. --seeds 2)
# Writes $OUT/structured_h200.{json,md,txt}, structured_env.txt, structured_stderr.txt; the JSON and markdown are
# rewritten after every case, so a run stopped by LIMIT keeps the cases done.
# Expected time (estimate, not yet measured): 60 cases x (~0.3 s input generation on the CPU, float64 exact ~0.05 s,
# 6 conventional-softmax emulator columns ~0.1 s each, kernel and FA3 columns a few ms) ~ 1-1.5 min, plus Triton
# compilation of the kernel specializations (recipes x head dims x dtypes) on a cold cache, ~1-2 min.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import fa3_fwd_interface; print('fa3_fwd_interface importable')"
  git log -1 --format='commit %H %s' 2>/dev/null; } > "$OUT/structured_env.txt" 2>&1
cat "$OUT/structured_env.txt"
timeout "${LIMIT:-540}" python3 -m fsattn_diffusers accuracy --suite structured --device cuda --shape 1,8,8192 \
  --head-dims 64,128 --json "$OUT/structured_h200.json" --markdown "$OUT/structured_h200.md" "$@" \
  2> "$OUT/structured_stderr.txt" | tee "$OUT/structured_h200.txt"
rc=${PIPESTATUS[0]}; echo "rc=$rc" | tee -a "$OUT/structured_h200.txt"
grep -v "cell/s\]" "$OUT/structured_stderr.txt" | tail -15
exit "$rc"
