#!/usr/bin/env bash
# End to end against the baselines a user would pick (one H200): stock SDPA bf16, FlashAttention-3 bf16 and FP8
# (fa3-fwd), with BF16 or FP8 (torchao float8, per-row) linear layers, eager or with compiled blocks.
# One configuration per call (each < 10 min); run from the repository root:
#   OUT=$OUT bash scripts/e2e_baselines_h200.sh CONFIG
# CONFIG (estimated device time, Wan2.2 bf16 step ~24 s, 2 timed + 1 warm-up forward + 1 instrumented step):
#   check        FA3 baselines vs FP32 SDPA, graph breaks of one Wan / HunyuanVideo block per policy  ~2 min
#   wan-bf16     Wan2.2-A14B 720p x 81, BF16 GEMMs, eager: bf16,fa3,fa3-fp8,mxfp8                        ~6.5 min
#   wan-fp8      the same with --gemms fp8                                                               ~6 min
#   wan-compile  BF16 GEMMs, --compile (inductor, one compile per policy), no instrumented step           ~7.5 min
#   hunyuan      HunyuanVideo 720p x 129, 64 of 256 text tokens valid (varlen): bf16,fa3,mxfp8           ~5 min
# (per policy ~3.7 steps: 1 warm-up forward, 2 timed steps, 1 instrumented step; build ~1 min, wheels ~20 s)
# Wheels carried in .whl: diffusers-0.42.1, fa3_fwd-0.0.3 (cp39-abi3), einops, torchao-0.18.0 (needs torch >= 2.11).
# Writes $OUT/e2e_<CONFIG>.{json,md,txt} (JSON/markdown rewritten after every policy), env and stderr.
set -u
CONFIG=${1:?usage: OUT=out bash scripts/e2e_baselines_h200.sh check|wan-bf16|wan-fp8|wan-compile|hunyuan}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "import diffusers, torchao, fa3_fwd_interface; print('diffusers', diffusers.__version__, 'torchao', torchao.__version__, 'fa3_fwd ok')"
  git log -1 --format='commit %H %s' 2>/dev/null; } > "$OUT/env_$CONFIG.txt" 2>&1
cat "$OUT/env_$CONFIG.txt"
STEPS=${STEPS:-2}  # STEPS=1 if a configuration runs close to the 10-minute limit (wan-compile)
WAN="python3 -m fsattn_diffusers e2e --model wan22 --steps $STEPS --warmup 1 --policies bf16,fa3,fa3-fp8,mxfp8"
case "$CONFIG" in
  check)       CMD="python3 scripts/baselines_gpu_check.py --json $OUT/e2e_check.json" ;;
  wan-bf16)    CMD="$WAN --gemms bf16" ;;
  wan-fp8)     CMD="$WAN --gemms fp8" ;;
  wan-compile) CMD="$WAN --gemms bf16 --compile" ;;
  hunyuan)     CMD="python3 -m fsattn_diffusers e2e --model hunyuan --steps $STEPS --warmup 1 --policies bf16,fa3,mxfp8 --text-valid 64" ;;
  *) echo "unknown CONFIG $CONFIG; accepted: check, wan-bf16, wan-fp8, wan-compile, hunyuan"; exit 2 ;;
esac
[ "$CONFIG" != check ] && CMD="$CMD --json $OUT/e2e_$CONFIG.json --md $OUT/e2e_$CONFIG.md"
echo "command: $CMD" | tee "$OUT/e2e_$CONFIG.txt"
timeout "${LIMIT:-570}" $CMD 2>"$OUT/e2e_${CONFIG}_stderr.txt" | tee -a "$OUT/e2e_$CONFIG.txt"
rc=${PIPESTATUS[0]}; echo "rc=$rc" | tee -a "$OUT/e2e_$CONFIG.txt"
grep -v "split will not be applied" "$OUT/e2e_${CONFIG}_stderr.txt" | tail -15
exit "$rc"
