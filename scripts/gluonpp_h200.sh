#!/usr/bin/env bash
# One nvidia-h200 call (< 10 min) for the ping-pong Gluon kernel (kernels/fused_attention_gluon_pp.py, mxfp8):
# 1. the Gluon GPU tests (gluon and gluonpp against fast, the sm90 reference and exact attention);
# 2. kernel timings fast / gluon / gluonpp (2, 3, 4 stages) at the paper and Wan2.2 shapes, next to SDPA-cuDNN;
# 3. the whole GPU suite with FSATTN_KERNEL_VARIANT=gluonpp as the default (custom op, compile, layouts, memory).
# Every step runs under `timeout`, so a hang costs its step, not the call.
# Run from the repository root:  OUT=$OUT bash scripts/gluonpp_h200.sh ; logs packed into $OUT/results.tar
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$W/env.txt" 2>&1
timeout 200 python -m pytest -q -s tests/test_kernel_gpu.py -k "gluon" > "$W/gpu_tests_gluon.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests_gluon.txt"; pack
grep -E "^gluon|passed|failed|Error|rc=" "$W/gpu_tests_gluon.txt" | cut -c1-240 | tail -30
timeout 230 python scripts/kernel_fast_bench.py --shapes paper,wan22 --recipes mxfp8 \
  --variants ${SWEEP:-fast,gluon:128x8x4,gluonpp:128x8x2,gluonpp:128x8x3,gluonpp:128x8x4} \
  --json "$W/gluonpp_sweep.json" > "$W/gluonpp_sweep.txt" 2>&1
echo "sweep rc=$?" >> "$W/gluonpp_sweep.txt"; pack; grep "^|\|rc=\|Error" "$W/gluonpp_sweep.txt" | cut -c1-200
FSATTN_KERNEL_VARIANT=gluonpp timeout 150 python -m pytest -q -s tests/test_kernel_gpu.py \
  > "$W/gpu_tests_gluonpp_default.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests_gluonpp_default.txt"; pack; tail -3 "$W/gpu_tests_gluonpp_default.txt"
