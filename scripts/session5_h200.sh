#!/usr/bin/env bash
# Fifth session, first device call: validate/time the fused Wan RoPE on the GPU, run the tensor-core row-sum probe,
# profile one mxfp8 Wan2.2 forward with the fused RoPE, and time the e2e step (mxfp8 vs bf16) with it.
# Needs the diffusers wheels carried in .whl.  Run from the repository root:  OUT=$OUT bash scripts/session5_h200.sh
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > "$W/gpu.txt" 2>&1
timeout 150 python -m pytest -q -s tests/test_kernel_gpu.py -k "rope or prepass_operands" > "$W/gpu_tests_rope.txt" 2>&1
echo "pytest rc=$?" >> "$W/gpu_tests_rope.txt"; pack; tail -3 "$W/gpu_tests_rope.txt"
timeout 60 python scripts/rowsum_probe.py > "$W/rowsum_probe.txt" 2>&1; echo "rc=$?" >> "$W/rowsum_probe.txt"; pack
tail -12 "$W/rowsum_probe.txt"
timeout 60 python scripts/rope_bench.py > "$W/rope_bench.txt" 2>&1; pack; cat "$W/rope_bench.txt"
FSATTN_FUSED_ROPE=1 timeout 150 python scripts/e2e_profile.py --policy mxfp8 > "$W/e2e_profile_fused_rope.txt" 2>&1
pack; head -45 "$W/e2e_profile_fused_rope.txt" | cut -c1-150
FSATTN_FUSED_ROPE=1 timeout 200 python -m fsattn_diffusers e2e --model wan22 --steps 2 --warmup 1 --policies mxfp8 \
  --json "$W/e2e_fused_rope.json" > "$W/e2e_fused_rope.txt" 2>&1; pack; tail -8 "$W/e2e_fused_rope.txt"
