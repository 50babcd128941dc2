#!/usr/bin/env bash
# One nvidia-h200-x2 call (< 10 min): 2-GPU sharded check (issue 8), then in parallel the full GPU suites on
# GPU 1 (default and fast variant) and the classic-vs-fast kernel timings on GPU 0 (issue 4).
# Run from the repository root with diffusers wheels carried in .whl:  OUT=$OUT bash scripts/device_x2_kernel_and_check.sh
# Everything lands in $OUT/w and is packed into $OUT/results.tar after each stage (the tool returns <= 8 files).
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{ date; nvidia-smi --query-gpu=index,name,driver_version --format=csv; git log -1 --format='commit %H %s'; } > "$W/env.txt"
timeout 150 python -m fsattn_diffusers.parallel.check --device cuda --world 2 --backend triton \
  --recipes mxfp8,mxfp6,mxfp4 --shape 1,2048,8,128 > "$W/cp_check.txt" 2>&1; echo "cp_check rc=$?" | tee -a "$W/cp_check.txt"
tail -12 "$W/cp_check.txt" | cut -c1-200; pack
( export CUDA_VISIBLE_DEVICES=1
  timeout 200 python -m pytest -q -s tests/test_kernel_gpu.py tests/test_parallel_xdit.py > "$W/gpu_tests_classic.txt" 2>&1
  echo "rc=$?" >> "$W/gpu_tests_classic.txt"
  FSATTN_KERNEL_VARIANT=fast timeout 150 python -m pytest -q -s tests/test_kernel_gpu.py > "$W/gpu_tests_fast.txt" 2>&1
  echo "rc=$?" >> "$W/gpu_tests_fast.txt" ) &
CUDA_VISIBLE_DEVICES=0 OUT=$W/kf timeout 420 bash scripts/kernel_fast_h200.sh; pack
wait; pack
tail -2 "$W/gpu_tests_classic.txt" "$W/gpu_tests_fast.txt"
