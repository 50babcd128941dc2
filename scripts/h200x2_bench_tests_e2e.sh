#!/usr/bin/env bash
# One nvidia-h200-x2 call (< 10 min), two independent jobs on the two GPUs of one host:
#   GPU 0: `fsattn bench` headline (paper, Wan2.1, Wan2.2, HunyuanVideo shapes; SDPA cuDNN/flash in the same
#          process), then a tile-config sweep of the default kernel at the paper shape (issue 4);
#   GPU 1: the GPU test suite (default kernel variant), then the Wan2.2-A14B end-to-end step timing (issue 6).
# Run from the repository root with the diffusers wheels carried in .whl:  OUT=$OUT bash scripts/h200x2_bench_tests_e2e.sh
# Logs land in $OUT/w, packed into $OUT/results.tar after each stage (the device tool returns <= 8 files).
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.max.sm --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__)"
  git log -1 --format='commit %H %s'; } > "$W/env.txt" 2>&1
( export CUDA_VISIBLE_DEVICES=1
  { date -u; echo "command: python -m pytest -q -s tests/test_kernel_gpu.py (CUDA_VISIBLE_DEVICES=1, default variant)"; } > "$W/gpu_tests.txt"
  timeout 200 python -m pytest -q -s tests/test_kernel_gpu.py >> "$W/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$W/gpu_tests.txt"; pack
  OUT=$W STEPS=1 timeout 330 bash scripts/e2e_h200.sh > "$W/e2e_log.txt" 2>&1; echo "e2e rc=$?" >> "$W/e2e_log.txt"; pack ) &
( export CUDA_VISIBLE_DEVICES=0
  timeout 330 python -m fsattn_diffusers.cli bench --shapes paper,wan21,wan22,hunyuan --warmup 50 --rep 300 \
    --json "$W/bench_h200.json" --markdown "$W/bench_h200.md" > "$W/bench_log.txt" 2>&1; echo "bench rc=$?" >> "$W/bench_log.txt"; pack
  timeout 200 python scripts/kernel_fast_bench.py --shapes paper --recipes mxfp8,mxfp6 \
    --variants classic,fast,fast:128x8x2,fast:128x8x4,fast:64x4x2 --json "$W/variants_paper.json" > "$W/variants_paper.txt" 2>&1
  echo "variants rc=$?" >> "$W/variants_paper.txt"; pack ) &
wait; pack
grep "^|" "$W/bench_h200.md" | cut -c1-160; grep "^|" "$W/variants_paper.txt"; tail -3 "$W/gpu_tests.txt"; tail -25 "$W/e2e_wan22_h200.txt" 2>/dev/null
