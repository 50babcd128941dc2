#!/usr/bin/env bash
# Next device call for the Gluon variant (one nvidia-h200 call, < 10 min): the whole GPU suite with
# FSATTN_KERNEL_VARIANT=gluon as the default (custom op, torch.compile, layouts, LSE merge, memory, poisoned
# buffers), then a configuration sweep (3/4 stages; BM 64 with one warpgroup per program, two programs per SM).
# Run from the repository root:  OUT=$OUT bash scripts/gluon_next_h200.sh ; logs packed into $OUT/results.tar
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$W/env.txt" 2>&1
FSATTN_KERNEL_VARIANT=gluon timeout 300 python -m pytest -q -s tests/test_kernel_gpu.py > "$W/gpu_tests_gluon_default.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests_gluon_default.txt"; pack; tail -3 "$W/gpu_tests_gluon_default.txt"
timeout 220 python scripts/kernel_fast_bench.py --shapes paper,wan22 --recipes mxfp8 \
  --variants fast,gluon,gluon:128x8x4,gluon:64x4x3,gluon:64x4x2 --json "$W/gluon_sweep.json" > "$W/gluon_sweep.txt" 2>&1
echo "sweep rc=$?" >> "$W/gluon_sweep.txt"; pack; grep "^|" "$W/gluon_sweep.txt"
