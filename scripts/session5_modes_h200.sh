#!/usr/bin/env bash
# Fifth session: gluonpp under FSATTN_PP_MODE 0/1/2 (scripts/pp_mode_probe.py), outputs compared across modes.
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for m in ${MODES:-0 1 2}; do
  FSATTN_PP_MODE=$m timeout 150 python scripts/pp_mode_probe.py /tmp >> "$W/modes.txt" 2>&1; echo "mode $m rc=$?" >> "$W/modes.txt"
done
python - >> "$W/modes.txt" 2>&1 <<'PY'
import torch
for s in ("paper", "wan22"):
    try:
        o0 = torch.load(f"/tmp/out_{s}_m0.pt").double()
        for m in (1, 2, 3):
            if not __import__("os").path.exists(f"/tmp/out_{s}_m{m}.pt"):
                continue
            o = torch.load(f"/tmp/out_{s}_m{m}.pt").double()
            print(s, f"mode {m} vs 0: rel {float((o - o0).norm() / o0.norm()):.3e}, nan {bool(o.isnan().any())}")
    except Exception as e:
        print(s, "compare failed", e)
PY
cat "$W/modes.txt"
