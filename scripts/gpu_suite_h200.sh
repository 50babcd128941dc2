#!/usr/bin/env bash
# The kernels on one H200: GPU tests, the seeded kernel fuzz, and `fsattn bench` (our recipes against SDPA
# cuDNN/flash and, with the fa3-fwd wheel carried in .whl, FA3 bf16/FP8, in one process) at the paper, Wan2.1, Wan2.2 and HunyuanVideo shapes.
#   OUT=$OUT bash scripts/gpu_suite_h200.sh [tests|fuzz|bench|power|all ...] [-- flags for the one part's command]
# Parts (about):
#   tests  the GPU tests of both kernel families: tests/test_kernel_gpu.py, test_kernel_frozen_reference_gpu.py,
#          test_kernel_key_term_gpu.py, test_kernel_prepass_gpu.py, test_kernel_promotion_gpu.py, test_bench_gpu.py,
#          test_kernel_int8_gpu.py and test_prepass_int8_kernel.py (every GPU kernel test file but the fuzz's;
#          TEST_FILES overrides the list; -s: one line per case), one pytest process
#          per file side by side on the GPU (each cut at LIMIT, default 560 s) -> gpu_tests_h200.txt, file by
#          file (~5 min). The CPU tests are CI's (.ci/run); the device lacks the package's CPU-side dependencies
#          (imageio, ...), so they are not run here.
#   fuzz   tests/test_kernel_fuzz_gpu.py -> kernel_fuzz_h200.txt (the case log, slice by slice, then the total;
#          pytest's output in kernel_fuzz_slice<j>.log). A case takes ~1-30 s, mostly Triton compiling the
#          specialization its shapes and strides ask for, so FSATTN_FUZZ_JOBS (default 6) processes share the GPU,
#          each running one slice of the same seeded list (300 cases: ~5 min with 8 on the H200, 2026-12-03; a slice
#          still running at LIMIT, default 560 s, is cut and its unfinished case not counted). Knobs:
#          FSATTN_FUZZ_CASES (default 300), FSATTN_FUZZ_SEED, FSATTN_FUZZ_MAX_WORK; FSATTN_FUZZ_SLICE=a:b runs cases
#          a..b-1 in one process instead. Failed cases then run again through each kernel path
#          (scripts/kernel_fuzz_triage.py, TRIAGE_LIMIT s) -> kernel_fuzz_triage.txt.
#   bench  fsattn bench --shapes paper,wan21,wan22,hunyuan -> bench_h200.{json,md}, ~5 min; e.g. `-- --recipes mxfp8`;
#          `-- --rounds 4` times the methods in 4 interleaved rounds (A B C, C B A, ...; median of the pair means),
#          for differences of a few percent.
#   power  not in `all`: SM clock, power and throttle reasons (nvidia-smi every 100 ms) while SDPA-cuDNN, mxfp8
#          and an FP8 GEMM (torch._scaled_mm 8192^3) run back to back -> power_h200.txt; then Nsight Compute on one
#          launch of the attention kernel at (1, 24, 8192, 128) -> ncu_details_h200.txt, ncu_sass_h200.csv and
#          its stall summary ncu_stalls_h200.md (python -m fsattn_diffusers.measure.ncu_stalls) (~1-4 min).
# FSATTN_KERNEL_VARIANT=gluon_pingpong|triton forces one kernel for every part (default: gluon_pingpong for mxfp8,
# triton for mxfp6/mxfp4). Logs and results land in $OUT; the environment in $OUT/env.txt.
PARTS_ALL="tests fuzz bench" PARTS_MORE="power"
source "$(dirname "$0")/device_env.sh"

power_probe() {  # clocks and power per workload; the nvidia-smi sampler runs beside it
  timeout 120 python3 - "$@" <<'PY'
import subprocess, sys, time
import torch
import fsattn_diffusers as fa

b, h, s, d = 1, 24, 32768, 128
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn((b, h, s, d), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
x = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
y = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
one = torch.ones((), device="cuda")
from torch.nn.attention import SDPBackend, sdpa_kernel

def cudnn():
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        torch.nn.functional.scaled_dot_product_attention(q, k, v)

attn = 4.0 * b * h * s * s * d
work = [("sdpa-cudnn", cudnn, attn), ("fsattn mxfp8 (with pre-pass)", lambda: fa.attention(q, k, v, "mxfp8", layout="bhsd"), attn),
        ("fp8 gemm 8192^3", lambda: torch._scaled_mm(x, y, one, one, out_dtype=torch.bfloat16), 2.0 * 8192 ** 3)]
query = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active"
smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", "100"],
                       stdout=subprocess.PIPE, text=True)
time.sleep(1.0)
phases = []
for name, fn, flops in work:
    fn(); torch.cuda.synchronize()
    n, t0 = 0, time.time()
    while time.time() - t0 < seconds:
        fn(); n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    t1 = time.time()
    phases.append((name, t0, t1, (t1 - t0) / n * 1e3, flops))
    time.sleep(1.0)
smi.terminate()
rows = []
for line in smi.stdout.read().splitlines():
    f = [x.strip() for x in line.split(",")]
    try:
        stamp, frac = f[0].split(".")
        rows.append((time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + frac), float(f[1]), float(f[2]), f[3]))
    except (ValueError, IndexError):
        continue
print(f"shape {(b, h, s, d)}, {len(rows)} nvidia-smi samples, {seconds} s per workload")
print("| workload | ms/call | TFLOP/s | median SM MHz | min MHz | median W | max W | throttle reasons |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name, t0, t1, ms, flops in phases:
    sel = [r for r in rows if t0 + 0.5 <= r[0] <= t1]
    mhz, watt = sorted(r[1] for r in sel), sorted(r[2] for r in sel)
    stats = (f"{mhz[len(mhz) // 2]:.0f} | {mhz[0]:.0f} | {watt[len(watt) // 2]:.0f} | {watt[-1]:.0f} | "
             f"{' '.join(sorted({r[3] for r in sel}))}") if sel else "- | - | - | - | no samples"
    print(f"| {name} | {ms:.3f} | {flops / ms * 1e-9:.0f} | {stats} |")
PY
}

fuzz_slices() {  # FSATTN_FUZZ_JOBS pytest processes on the one GPU, slice j of the seeded list each; then one log
  local n=${FSATTN_FUZZ_CASES:-300} jobs=${FSATTN_FUZZ_JOBS:-6} j rc=0 pids=() line logged=0 failed=0 missing=()
  export FSATTN_FUZZ_CASES=$n
  for ((j = 0; j < jobs; j++)); do
    FSATTN_FUZZ_SLICE=$((n * j / jobs)):$((n * (j + 1) / jobs)) FSATTN_FUZZ_LOG=$OUT/kernel_fuzz_slice$j.txt \
      timeout "${LIMIT:-560}" python3 -m pytest -q -s tests/test_kernel_fuzz_gpu.py "${EXTRA[@]}" \
      > "$OUT/kernel_fuzz_slice$j.log" 2>&1 &
    pids+=($!)
  done
  for j in "${!pids[@]}"; do
    wait "${pids[$j]}" || { rc=$?; echo "slice $j: pytest rc=$rc (see kernel_fuzz_slice$j.log)"; }
  done
  : > "$OUT/kernel_fuzz_h200.txt"
  for ((j = 0; j < jobs; j++)); do
    cat "$OUT/kernel_fuzz_slice$j.txt" >> "$OUT/kernel_fuzz_h200.txt" 2>/dev/null || true
    line=$(grep -E '^[0-9]+ of [0-9]+ cases failed' "$OUT/kernel_fuzz_slice$j.txt" 2>/dev/null || true)
    if [[ -n $line ]]; then
      failed=$((failed + ${line%% *})); line=${line#* of }; logged=$((logged + ${line%% *}))
    else
      missing+=("$j")
    fi
  done
  rm -f "$OUT"/kernel_fuzz_slice*.txt
  line="total: $failed of $logged cases failed, $jobs slices of $n cases run side by side on one GPU"
  ((${#missing[@]})) && line+="; slices ${missing[*]} did not finish (their cases logged above are not counted)"
  echo "$line" | tee -a "$OUT/kernel_fuzz_h200.txt"
  if ((failed > 0)); then  # each failed case again through every kernel path and the public call
    timeout "${TRIAGE_LIMIT:-240}" python3 scripts/kernel_fuzz_triage.py --cases "$n" "$OUT/kernel_fuzz_h200.txt" \
      > "$OUT/kernel_fuzz_triage.txt" 2>&1 || echo "triage: rc=$? (see kernel_fuzz_triage.txt)"
  fi
  ((rc == 0 && failed == 0 && ${#missing[@]} == 0))
}

test_files_side_by_side() {  # one pytest process per test file, all on the one GPU at once; then one log, file by file
  local files=("$@") j frc rc=0 pids=()
  for j in "${!files[@]}"; do
    timeout "${LIMIT:-560}" python3 -m pytest -q -s -p no:cacheprovider "${files[$j]}" "${EXTRA[@]}" \
      > "$OUT/gpu_tests_file$j.log" 2>&1 &
    pids+=($!)
  done
  for j in "${!files[@]}"; do
    frc=0
    wait "${pids[$j]}" || frc=$?
    echo "-- ${files[$j]}: pytest rc=$frc$([[ $frc == 124 ]] && echo ' (timed out)')"
    cat "$OUT/gpu_tests_file$j.log"
    rm -f "$OUT/gpu_tests_file$j.log"
    ((frc == 0)) || rc=1
  done
  return $rc
}

ncu_profile() {  # one launch of the attention kernel under Nsight Compute (clocks not locked)
  local rep=/tmp/fsattn_ncu section sections=()
  for section in SpeedOfLight ComputeWorkloadAnalysis SchedulerStats WarpStateStats InstructionStats Occupancy \
                 LaunchStats SourceCounters; do sections+=(--section "$section"); done
  timeout 300 ncu --clock-control none -k regex:fsattn_fwd --launch-skip 1 --launch-count 1 "${sections[@]}" \
    --import-source no -f -o "$rep" python3 -c '
import torch, fsattn_diffusers as fa
q, k, v = (torch.randn((1, 24, 8192, 128), device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    fa.attention(q, k, v, "mxfp8", layout="bhsd")
torch.cuda.synchronize()' || return $?
  ncu --import "$rep.ncu-rep" --page details > "$OUT/ncu_details_h200.txt" || return $?
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_sass_h200.csv"
  python3 -m fsattn_diffusers.measure.ncu_stalls "$OUT/ncu_sass_h200.csv" > "$OUT/ncu_stalls_h200.md" || true
  grep -E "Issue Slots Busy|Issued Ipc|No Eligible|Warp Cycles Per Issued|Pipe|SM Frequency|Duration" \
    "$OUT/ncu_details_h200.txt" | head -30
}

for part in "${PARTS[@]}"; do
  case $part in
    tests)
      default="tests/test_kernel_gpu.py tests/test_kernel_frozen_reference_gpu.py tests/test_kernel_key_term_gpu.py
        tests/test_kernel_prepass_gpu.py tests/test_kernel_promotion_gpu.py tests/test_bench_gpu.py
        tests/test_kernel_int8_gpu.py tests/test_prepass_int8_kernel.py"
      read -ra files <<< "$(echo ${TEST_FILES:-$default})"
      run_logged gpu_tests_h200.txt test_files_side_by_side "${files[@]}" ;;
    fuzz)
      if [[ -n ${FSATTN_FUZZ_SLICE:-} ]]; then
        FSATTN_FUZZ_LOG=$OUT/kernel_fuzz_h200.txt run_logged kernel_fuzz_pytest timeout "${LIMIT:-560}" \
          python3 -m pytest -q -s tests/test_kernel_fuzz_gpu.py "${EXTRA[@]}"
      else
        run_logged kernel_fuzz_slices.log fuzz_slices
      fi ;;
    bench)
      run_logged bench_h200_log.txt timeout "${LIMIT:-400}" fsattn bench --shapes paper,wan21,wan22,hunyuan \
        --warmup 50 --rep 300 --json "$OUT/bench_h200.json" --markdown "$OUT/bench_h200.md" "${EXTRA[@]}" ;;
    power)
      run_logged power_h200.txt power_probe "${EXTRA[@]}"
      run_logged ncu_h200.log ncu_profile ;;
  esac
done
finish
