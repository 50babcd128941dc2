#!/usr/bin/env bash
# Sixth session, gluonpp with the per-warp gate vote and one K/V mbarrier as the default mxfp8 kernel: `fsattn bench` at
# the four issue shapes (every recipe against SDPA cuDNN/flash in one process), after the GPU test suite (the persistent
# Q/K pre-pass came after the kernel changes, so the suite runs again here).
# Run from the repository root:  OUT=$OUT bash scripts/session6_final_h200.sh
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/env.txt" 2>&1
timeout 250 python -m pytest -q -s tests/test_kernel_gpu.py > "$OUT/gpu_tests.txt" 2>&1
echo "pytest rc=$?" >> "$OUT/gpu_tests.txt"; tail -2 "$OUT/gpu_tests.txt"; grep -E "FAILED|Error" "$OUT/gpu_tests.txt" | head -5
timeout 300 python -m fsattn_diffusers.cli bench --shapes paper,wan21,wan22,hunyuan --warmup 50 --rep 300 \
  --json "$OUT/bench.json" --markdown "$OUT/bench.md" > "$OUT/bench_log.txt" 2>&1
echo "bench rc=$?" >> "$OUT/bench_log.txt"; grep "^|" "$OUT/bench.md" | cut -c1-150; tail -2 "$OUT/bench_log.txt"
