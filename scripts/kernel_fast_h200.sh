#!/usr/bin/env bash
# One device call: GPU tests of the fast variant and of padded keys, then classic vs fast timings at the paper
# and Wan2.2 shapes (kernel-only and with the pre-pass, next to SDPA-cuDNN), SASS loop counts for the record.
# Run from the repository root:  bash scripts/kernel_fast_h200.sh   (writes under ${OUT:-/tmp/out})
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
# 1. correctness on the GPU (fast vs classic vs sm90 reference; padded keys x1e4); a hang is cut at 240 s
timeout 240 python -m pytest -q -s tests/test_kernel_gpu.py -k "fast_variant or padded_keys or matches_reference" \
  > "$OUT/gpu_tests_fast.txt" 2>&1; echo "pytest rc=$?" | tee -a "$OUT/gpu_tests_fast.txt"
tail -3 "$OUT/gpu_tests_fast.txt"
# 2. timings, classic vs fast, one process per shape (a hang is cut; the other shape still runs)
timeout 200 python scripts/kernel_fast_bench.py --shapes paper --json "$OUT/fast_paper.json" 2>&1 | tee "$OUT/fast_paper.txt" | tail -12
timeout 240 python scripts/kernel_fast_bench.py --shapes wan22 --json "$OUT/fast_wan22.json" 2>&1 | tee "$OUT/fast_wan22.txt" | tail -10
# 3. SASS loop counts (offline compile; same numbers as benchmarks/NOTES.md predicts from)
timeout 100 python scripts/kernel_sass_loop.py > "$OUT/sass_loop.txt" 2>&1; tail -7 "$OUT/sass_loop.txt"
