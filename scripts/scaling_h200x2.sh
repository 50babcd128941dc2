#!/usr/bin/env bash
# Two H200s of one host (nvidia-h200-x2): sharded attention against one process, and the per-step latency of a
# Wan2.2-A14B-size transformer (random weights, 720p x 81) on 1 GPU vs Ulysses=2 vs Ring=2, under diffusers' context
# parallelism and under xDiT; speedup over bf16, 1 -> 2 GPU scaling, 2-GPU vs 1-GPU output match.
#   OUT=$OUT bash scripts/scaling_h200x2.sh [PART ...] [-- flags for the one part's module, e.g. --steps 2]
# One part per 10-minute call (the device tool: carry [".whl", ".sage"]). Wheels carried in .whl: diffusers 0.42.1;
# for xdit-* also importlib_metadata, xfuser 0.7.0, yunchang 0.6.4, distvae 0.1.0 (einops, pyyaml, peft,
# sentencepiece, transformers, accelerate come with the image). .sage/ = shared/baselines/sageattention (the sage
# policy: device_env.sh builds SageAttention 2 once per machine, ~85 s of the first call).
# POLICIES (default: the module's, bf16,mxfp8,int8-bf16,int8-bf16+exponential=exact,hybrid-int8-mxfp8,sage:
# hybrid-int8-mxfp8 = its recipes int8-bf16 and mxfp8 timed, projected over 20 steps), STEPS (default 1).
# Times from the 2026-11-29 run (1 CFG step: ~24 s on 1 GPU, ~12.5 s on 2; a first forward 6-17 s; 1-GPU policies
# split over both GPUs) for the 5 policies the default list times: 1 GPU ~2 min, each 2-GPU mode ~1.5-2 min, model
# build and start ~2.5 min; both modes in one call (~8 min + the SageAttention build) would pass the limit, so:
#   check         measure.parallel_check: ring, Ulysses and xDiT ring with mxfp8, the INT8 tiers, mxfp6, mxfp4
#                 through the Triton kernels at (B, S, H, D) = (1, 2048, 8, 128) vs one process, plus tiny-Wan runs
#                 (exact, mxfp8, hybrid-int8-mxfp8) -> parallel_check_h200x2.txt, ~2 min
#   cp-ulysses    measure.cp_scaling --modes ulysses (diffusers context parallelism) -> cp_scaling_ulysses_h200x2.
#                 {json,md,txt}, ~6 min
#   cp-ring       the same, --modes ring -> cp_scaling_ring_h200x2.{json,md,txt}, ~6 min
#   xdit-ulysses  measure.xdit_scaling --modes ulysses (xDiT 0.7: bf16 = its CUDNN slot, sage = its SAGE slot, fsattn in
#                 its SDPA_FLASH slot) -> xdit_scaling_ulysses_h200x2.{json,md,txt}, ~6-7 min
#   xdit-ring     the same, --modes ring -> xdit_scaling_ring_h200x2.{json,md,txt}, ~6-7 min
#   cp, xdit      not in `all`: both modes in one call (cp_scaling_h200x2.*, xdit_scaling_h200x2.*): only for a short
#                 POLICIES list (e.g. bf16,mxfp8: ~5 min)
# JSON and markdown are rewritten after every measurement, so a run cut by LIMIT keeps what it measured. Commit the
# JSON/markdown under benchmarks/results/ (drop the superseded both-modes files) and re-render the README table:
# python -m fsattn_diffusers.measure.results_tables --write.
PARTS_ALL="check cp-ulysses cp-ring xdit-ulysses xdit-ring" PARTS_MORE="cp xdit"
source "$(dirname "$0")/device_env.sh"
# NVLink multicast off (NCCL NVLS, symmetric memory, NVSHMEM): not available on these machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
command -v nvidia-smi >/dev/null && nvidia-smi topo -m >> "$OUT/env.txt" 2>&1

for part in "${PARTS[@]}"; do
  case $part in
    check)
      run_logged parallel_check_h200x2.txt timeout "${LIMIT:-300}" python3 -m fsattn_diffusers.measure.parallel_check \
        --device cuda --world 2 --backend triton --shape 1,2048,8,128 \
        --recipes mxfp8,int8-bf16,int8-bf16+exponential=exact,mxfp6,mxfp4 \
        --wan-policies exact,mxfp8,hybrid-int8-mxfp8 "${EXTRA[@]}" ;;
    cp|xdit|cp-*|xdit-*)
      module=cp_scaling modes=() name=
      [[ $part == xdit* ]] && module=xdit_scaling
      if [[ $part == *-* ]]; then modes=(--modes "${part#*-}") name=_${part#*-}; fi
      name=$module${name}_h200x2
      run_logged "$name.txt" timeout "${LIMIT:-560}" python3 -m "fsattn_diffusers.measure.$module" \
        --device cuda --world 2 ${POLICIES:+--policies "$POLICIES"} --steps "${STEPS:-1}" --warmup 1 "${modes[@]}" \
        --json "$OUT/$name.json" --md "$OUT/$name.md" --wrapper "scripts/scaling_h200x2.sh $part" "${EXTRA[@]}" ;;
  esac
done
finish
