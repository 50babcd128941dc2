#!/usr/bin/env bash
# Softmax interventions on the Wan2.2-T2V-A14B-size transformer (random weights, one forward) on one H200: per-call
# diagnostics and the attention-output error of each intervention -> $OUT/attention.{md,json}, log sensitivity_h200.txt.
#   OUT=$OUT bash scripts/sensitivity_h200.sh [-- more flags for fsattn sensitivity]   (diffusers wheel carried in .whl)
# FRAMES/HEIGHT/WIDTH set the token count (default 81 x 480x832 = 32760 tokens; 81 x 720x1280 = 75600), ROWS the
# sampled query rows per call (default 256).
PARTS_ALL="attention"
source "$(dirname "$0")/device_env.sh"

run_logged sensitivity_h200.txt timeout "${LIMIT:-570}" fsattn sensitivity --attention-only --model-size wan22 \
  --frames "${FRAMES:-81}" --height "${HEIGHT:-480}" --width "${WIDTH:-832}" --rows "${ROWS:-256}" --out "$OUT" "${EXTRA[@]}"
finish
