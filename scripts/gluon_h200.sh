#!/usr/bin/env bash
# One nvidia-h200 call (< 10 min) for the Gluon kernel variant (kernels/fused_attention_gluon.py, mxfp8):
# 1. GPU tests of the variant (against fast, the sm90 reference, exact; awkward shapes, kv_lens, spiky);
# 2. only if they pass: fast vs gluon kernel timings (paper, Wan2.2), `fsattn bench --variant gluon`, and the
#    Wan2.2-A14B end-to-end step (needs the diffusers wheels carried in .whl).
# Run from the repository root:  OUT=$OUT bash scripts/gluon_h200.sh ; logs in $OUT/w, packed into $OUT/results.tar
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$W/env.txt" 2>&1
timeout 240 python -m pytest -q -s tests/test_kernel_gpu.py -k "gluon" > "$W/gpu_tests_gluon.txt" 2>&1
rc=$?; echo "pytest rc=$rc" >> "$W/gpu_tests_gluon.txt"; pack
grep -E "^gluon|passed|failed|Error|error" "$W/gpu_tests_gluon.txt" | cut -c1-220 | tail -14
[ $rc -eq 0 ] || exit 1
timeout 150 python scripts/kernel_fast_bench.py --shapes paper,wan22 --recipes mxfp8 \
  --variants fast,gluon,gluon:128x8x2,gluon:128x8x4 --json "$W/gluon_variants.json" > "$W/gluon_variants.txt" 2>&1
echo "variants rc=$?" >> "$W/gluon_variants.txt"; pack; grep "^|" "$W/gluon_variants.txt"
FSATTN_KERNEL_VARIANT=gluon timeout 150 python -m fsattn_diffusers.cli bench --shapes paper,wan22 --variant gluon \
  --warmup 50 --rep 300 --json "$W/bench_gluon.json" --markdown "$W/bench_gluon.md" > "$W/bench_gluon_log.txt" 2>&1
echo "bench rc=$?" >> "$W/bench_gluon_log.txt"; pack; grep "^|" "$W/bench_gluon.md" | cut -c1-150
FSATTN_KERNEL_VARIANT=gluon OUT=$W STEPS=1 timeout 280 bash scripts/e2e_h200.sh > "$W/e2e_log.txt" 2>&1
echo "e2e rc=$?" >> "$W/e2e_log.txt"; pack; tail -9 "$W/e2e_wan22_h200.txt" 2>/dev/null
