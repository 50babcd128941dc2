#!/usr/bin/env bash
# Fifth session, gluonpp with the FP16 proxy and the tensor-core row sum as the default mxfp8 kernel: the whole GPU
# test suite, then `fsattn bench` at the four issue shapes (kernel vs SDPA cuDNN/flash in one process).
# Run from the repository root:  OUT=$OUT bash scripts/session5_final_h200.sh ; logs packed into $OUT/results.tar
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$W/env.txt" 2>&1
timeout 200 python -m pytest -q -s tests/test_kernel_gpu.py > "$W/gpu_tests.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests.txt"; pack; tail -3 "$W/gpu_tests.txt"
grep -E "FAILED|Error" "$W/gpu_tests.txt" | head -5
timeout 300 python -m fsattn_diffusers.cli bench --shapes paper,wan21,wan22,hunyuan --warmup 50 --rep 300 \
  --json "$W/bench.json" --markdown "$W/bench.md" > "$W/bench_log.txt" 2>&1
echo "bench rc=$?" >> "$W/bench_log.txt"; pack; grep "^|" "$W/bench.md" | cut -c1-170; tail -2 "$W/bench_log.txt"
