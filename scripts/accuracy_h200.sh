#!/usr/bin/env bash
# Accuracy on one H200 against float64 exact attention: the paper's Table 4, the structured-input suite, and
# the kernel-vs-reference diagnosis (the kernels' own numerics in PyTorch) on the attention-sink family.
#   OUT=$OUT bash scripts/accuracy_h200.sh [table4|structured|sink|all ...] [-- flags for the one part's command]
# Parts (about):
#   table4      one full-shape emulator call (time, peak memory), then fsattn accuracy --table 4 at (1, 24, 32768, 128),
#               10 seeds, 4096 query rows -> table4_h200.{json,txt}
#   structured  fsattn accuracy --suite structured at (1, 8, 8192), D 64 and 128, fp16 and bf16, every family, through
#               the Triton kernels, with FlashAttention-3 BF16/FP8 when fa3-fwd and einops are carried in .whl
#               -> structured_accuracy_h200.{json,md,txt}, ~2-3 min; e.g. `structured -- --recipes mxfp8,mxfp6`.
#               JSON and markdown are rewritten after every case, so a run cut by LIMIT keeps the cases done.
#   sink        per family (attention_sink at S 8192 and 2048, locality, gaussian): the kernels' reference's error and
#               each kernel's (gluon_pingpong, triton) error and distance to that reference -> sink_diagnosis_h200.txt,
#               ~1 min
PARTS_ALL="table4 structured sink"
source "$(dirname "$0")/device_env.sh"

emulator_full_shape() {
  timeout 300 python3 - <<'PY'
import time, torch, fsattn_diffusers as fa
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 24, 32768, 128, generator=g).cuda() for _ in range(3))
torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
out, st = fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="emulator", return_stats=True)
torch.cuda.synchronize()
print(f"emulator mxfp8 (1, 24, 32768, 128), one call: {time.perf_counter() - t0:.1f} s, peak GPU memory "
      f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, stats {st}")
PY
}

sink_diagnosis() {  # one process per kernel variant: the variant is read when the kernels are imported
  local variant
  for variant in gluon_pingpong triton; do
    FSATTN_KERNEL_VARIANT=$variant timeout 200 python3 - "$variant" <<'PY' || return $?
import sys, torch
import fsattn_diffusers as fa
from fsattn_diffusers.backends import reference_attention
from fsattn_diffusers.measure import KERNEL_BACKEND
from fsattn_diffusers.recipe import PRESETS
from fsattn_diffusers.measure.structured_inputs import FAMILIES
from fsattn_diffusers.testing import exact_attention, relative_error

variant = sys.argv[1]
print(f"# {variant}: relative error % vs float64 exact attention; (vs ref X): kernel vs its PyTorch reference, %")
recipes = ("mxfp8",) if variant == "gluon_pingpong" else ("mxfp8", "mxfp6")  # the Gluon kernel runs mxfp8 only
for family, s in (("attention_sink", 8192), ("attention_sink", 2048), ("locality", 8192), ("gaussian", 8192)):
    q, k, v = FAMILIES[family](1, 8, s, 128, torch.bfloat16, "cuda", 0)
    scale = 128 ** -0.5
    exact, _ = exact_attention(q, k, v, scale)
    cells = []
    for name in recipes:
        ref, _, _ = reference_attention(KERNEL_BACKEND, q, k, v, PRESETS[name], scale=scale)
        out = fa.attention(q, k, v, name, layout="bhsd", scale=scale, backend=KERNEL_BACKEND)
        cells.append(f"{name}: ref {100 * relative_error(ref, exact):.2f}, {variant} "
                     f"{100 * relative_error(out, exact):.2f} (vs ref {100 * relative_error(out, ref):.2f})")
    print(f"{family} S={s} | " + " | ".join(cells), flush=True)
PY
  done
}

for part in "${PARTS[@]}"; do
  case $part in
    table4)
      run_logged emulator_full_shape_h200.txt emulator_full_shape
      run_logged table4_h200.txt timeout "${LIMIT:-560}" fsattn accuracy --table 4 --shape 1,24,32768,128 --seeds 10 \
        --query-rows 4096 --device cuda --json "$OUT/table4_h200.json" "${EXTRA[@]}" ;;
    structured)
      run_logged structured_accuracy_h200.txt timeout "${LIMIT:-540}" fsattn accuracy --suite structured --device cuda \
        --shape 1,8,8192 --head-dims 64,128 --json "$OUT/structured_accuracy_h200.json" \
        --markdown "$OUT/structured_accuracy_h200.md" "${EXTRA[@]}" ;;
    sink)
      run_logged sink_diagnosis_h200.txt sink_diagnosis ;;
  esac
done
finish
