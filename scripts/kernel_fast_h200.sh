#!/usr/bin/env bash
# One device call (< 10 min): GPU tests of the fast variant and of padded keys, then classic vs fast timings at
# the paper and Wan2.2 shapes (kernel-only and with the pre-pass, next to SDPA-cuDNN, same process).
# Run from the repository root:  OUT=$OUT bash scripts/kernel_fast_h200.sh      (logs and JSON under $OUT)
# SASS counts need no GPU: PYTHONPATH=$PWD python scripts/kernel_sass_loop.py (numbers in benchmarks/NOTES.md).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
git log -1 --format='commit %H %s' | tee -a "$OUT/gpu.txt"
# 1. correctness on the GPU: fast vs classic vs the sm90 reference, padded keys x1e4, the classic suite's core
timeout 200 python -m pytest -q -s tests/test_kernel_gpu.py -k "fast_variant or padded_keys or matches_reference" \
  > "$OUT/gpu_tests_fast.txt" 2>&1; echo "pytest rc=$? (124 = timed out)" | tee -a "$OUT/gpu_tests_fast.txt"
grep -E "fast-vs-classic|padded|passed|failed|Error" "$OUT/gpu_tests_fast.txt" | cut -c1-160 | tail -16
# 2. timings (a hang is cut by timeout; the other shape still runs). fast:64x4x2 = BM 64, 4 warps, 2 stages
#    (2 CTAs per SM fit: 106 KB shared memory and 252 registers per thread each).
timeout 220 python scripts/kernel_fast_bench.py --shapes paper --variants classic,fast,fast:64x4x2 \
  --json "$OUT/fast_paper.json" > "$OUT/fast_paper.txt" 2>&1; echo "paper rc=$?"
timeout 150 python scripts/kernel_fast_bench.py --shapes wan22 --variants classic,fast \
  --json "$OUT/fast_wan22.json" > "$OUT/fast_wan22.txt" 2>&1; echo "wan22 rc=$?"
grep -E "sdpa-cudnn|Error|error" "$OUT/fast_paper.txt" "$OUT/fast_wan22.txt" | cut -c1-200
grep "^|" "$OUT/fast_paper.txt"; grep "^| wan22" "$OUT/fast_wan22.txt"
