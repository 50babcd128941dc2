#!/usr/bin/env bash
# One nvidia-h200 call: where the ping-pong kernel's time goes (scripts/gluon_ablate.py at the paper shape), then the
# Gluon GPU tests and the whole GPU suite with FSATTN_KERNEL_VARIANT=gluonpp. Logs packed into $OUT/results.tar.
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$W/env.txt" 2>&1
timeout 300 python scripts/gluon_ablate.py --masks ${MASKS:-0,1,2,4,8,16,17,49,64,33} --json "$W/ablate.json" \
  > "$W/ablate.txt" 2>&1; echo "ablate rc=$?" >> "$W/ablate.txt"; pack; cat "$W/ablate.txt" | cut -c1-200
timeout 120 python -m pytest -q -s tests/test_kernel_gpu.py -k "gluon" > "$W/gpu_tests_gluon.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests_gluon.txt"; pack; tail -2 "$W/gpu_tests_gluon.txt"
FSATTN_KERNEL_VARIANT=gluonpp timeout 150 python -m pytest -q -s tests/test_kernel_gpu.py \
  > "$W/gpu_tests_gluonpp_default.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests_gluonpp_default.txt"; pack; tail -3 "$W/gpu_tests_gluonpp_default.txt"
