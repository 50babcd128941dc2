#!/usr/bin/env bash
# Softmax interventions on the Wan2.2-T2V-A14B-size transformer (random weights, one forward) on one H200:
# per-call diagnostics and attention-output error of each intervention, attention.md / attention.json in $OUT.
# Needs diffusers on the device (carry the wheels in .whl and install them to /tmp/site first, as for e2e_h200.sh).
# FRAMES/HEIGHT/WIDTH set the token count (default 81 x 480x832 = 32760 tokens; 81 x 720x1280 = 75600 tokens).
set -euo pipefail
OUT=${OUT:-./out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python -m fsattn_diffusers sensitivity --attention-only --model-size wan22 \
  --frames ${FRAMES:-81} --height ${HEIGHT:-480} --width ${WIDTH:-832} --rows ${ROWS:-256} \
  --out "$OUT" 2>"$OUT/sensitivity_stderr.txt" | tee "$OUT/sensitivity_stdout.txt"
