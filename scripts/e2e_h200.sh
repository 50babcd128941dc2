#!/usr/bin/env bash
# Issue 6: per-step latency of Wan2.2-T2V-A14B at 720p x 81 frames (random weights) per policy on the H200.
# Needs diffusers on the device: carry wheels in .whl (see shared notes) and install them to /tmp/site first.
set -euo pipefail
OUT=${OUT:-./out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python -m fsattn_diffusers e2e --model wan22 --steps ${STEPS:-1} --warmup 1 \
  --json "$OUT/e2e_wan22_h200.json" 2>"$OUT/e2e_stderr.txt" | tee "$OUT/e2e_wan22_h200.txt"
