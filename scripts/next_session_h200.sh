#!/usr/bin/env bash
# Prepared at the end of the fourth session (no device time left): one nvidia-h200 call to validate and time the
# fused Wan RoPE (kernels/rope.py, opt-in FSATTN_FUSED_ROPE=1), then the e2e step with and without it.
# Needs the diffusers wheels carried in .whl (see scripts/e2e_h200.sh).
# Run from the repository root:  OUT=$OUT bash scripts/next_session_h200.sh ; logs packed into $OUT/results.tar
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 120 python -m pytest -q -s tests/test_kernel_gpu.py -k "rope or prepass_operands" > "$W/gpu_tests_rope.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests_rope.txt"; pack; tail -3 "$W/gpu_tests_rope.txt"
timeout 60 python scripts/rope_bench.py > "$W/rope_bench.txt" 2>&1; pack; cat "$W/rope_bench.txt"
FSATTN_FUSED_ROPE=1 timeout 300 python -m fsattn_diffusers e2e --model wan22 --steps 2 --warmup 1 --policies mxfp8 \
  --json "$W/e2e_fused_rope.json" > "$W/e2e_fused_rope.txt" 2>&1; pack; tail -6 "$W/e2e_fused_rope.txt"
