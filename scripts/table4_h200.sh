#!/usr/bin/env bash
# Paper Table 4 on the H200 through the emulator, plus one full-shape emulator call.
# Usage (device machine, repo root): bash scripts/table4_h200.sh  -> writes under $OUT (or ./out)
set -euo pipefail
OUT=${OUT:-./out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python - <<'PY' 2>&1 | tee "$OUT/full_shape.txt"
import time, torch, fsattn_diffusers as fa
from fsattn_diffusers.accuracy import error_and_cosine
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 24, 32768, 128, generator=g).cuda() for _ in range(3))
torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
out, st = fa.attention(q, k, v, "mxfp8", layout="bhsd", backend="emulator", return_stats=True)
torch.cuda.synchronize()
print(f"emulator mxfp8 (1,24,32768,128) full call: {time.perf_counter() - t0:.1f} s, peak GPU memory "
      f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, stats {st}")
PY
python -m fsattn_diffusers accuracy --table 4 --shape 1,24,32768,128 --seeds 10 --query-rows 4096 \
  --device cuda --json "$OUT/table4_h200.json" 2> "$OUT/table4_stderr.txt" | tee "$OUT/table4_h200.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"
