#!/usr/bin/env bash
# Two H200s of one host (nvidia-h200-x2): sharded attention against one process, and the per-step latency of a
# Wan2.2-A14B-size transformer (random weights, 720p x 81) on 1 GPU vs Ulysses=2 vs Ring=2, under diffusers' context
# parallelism and under xDiT; speedup over bf16, 1 -> 2 GPU scaling, 2-GPU vs 1-GPU output match.
#   OUT=$OUT bash scripts/scaling_h200x2.sh [check|cp|xdit|all ...] [-- flags for the one part's module, e.g. --modes ulysses]
# One part per 10-minute call. Wheels carried in .whl: diffusers 0.42.1; for xdit also importlib_metadata, xfuser 0.7.0,
# yunchang 0.6.4, distvae 0.1.0 (einops, pyyaml, peft, sentencepiece, transformers, accelerate come with the image).
#   check  measure.parallel_check: ring, Ulysses and xDiT ring with mxfp8/mxfp6/mxfp4 through the Triton kernels at
#          (B, S, H, D) = (1, 2048, 8, 128) vs one process, plus tiny-Wan runs -> parallel_check_h200x2.txt, ~2 min
#   cp     measure.cp_scaling (diffusers context parallelism), POLICIES (default bf16,mxfp8,hybrid: hybrid = mxfp6 +
#          mxfp4 timed, 20-step projection), STEPS (default 1) -> cp_scaling_h200x2.{json,md,txt}, ~6-7 min
#   xdit   measure.xdit_scaling (xDiT 0.7: bf16 = its CUDNN slot, fsattn in its SDPA_FLASH slot), same options
#          -> xdit_scaling_h200x2.{json,md,txt}, ~5-6 min
# JSON and markdown are rewritten after every measurement, so a run cut by LIMIT keeps what it measured.
PARTS_ALL="check cp xdit"
source "$(dirname "$0")/device_env.sh"
# NVLink multicast off (NCCL NVLS, symmetric memory, NVSHMEM): not available on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
command -v nvidia-smi >/dev/null && nvidia-smi topo -m >> "$OUT/env.txt" 2>&1

for part in "${PARTS[@]}"; do
  case $part in
    check)
      run_logged parallel_check_h200x2.txt timeout "${LIMIT:-300}" python3 -m fsattn_diffusers.measure.parallel_check \
        --device cuda --world 2 --backend triton --recipes mxfp8,mxfp6,mxfp4 --shape 1,2048,8,128 "${EXTRA[@]}" ;;
    cp|xdit)
      module=$([[ $part == cp ]] && echo cp_scaling || echo xdit_scaling)
      run_logged "${module}_h200x2.txt" timeout "${LIMIT:-560}" python3 -m "fsattn_diffusers.measure.$module" \
        --device cuda --world 2 --policies "${POLICIES:-bf16,mxfp8,hybrid}" --steps "${STEPS:-1}" --warmup 1 \
        --json "$OUT/${module}_h200x2.json" --md "$OUT/${module}_h200x2.md" --wrapper "scripts/scaling_h200x2.sh $part" \
        "${EXTRA[@]}" ;;
  esac
done
finish
