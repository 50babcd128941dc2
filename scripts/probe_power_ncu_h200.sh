#!/usr/bin/env bash
# One nvidia-h200 call: why the mxfp8 kernel's softmax does not hide under its GEMMs.
# 1. clocks and power while SDPA-cuDNN, our kernel and an FP8 GEMM run (scripts/probe_power.py);
# 2. Nsight Compute on one launch of the kernel (small shape): scheduler, warp state, pipes, per-SASS stall samples.
# Run from the repository root:  OUT=$OUT bash scripts/probe_power_ncu_h200.sh ; logs packed into $OUT/results.tar
set -u
OUT=${OUT:-/tmp/out}; W=$OUT/w; mkdir -p "$W"
pack() { tar cf "$OUT/results.tar" -C "$W" . ; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
{ date -u; nvidia-smi -q -d POWER,CLOCK,PERFORMANCE; which ncu; ncu --version; } > "$W/env.txt" 2>&1
timeout 100 python scripts/probe_power.py --seconds 3 > "$W/power.txt" 2>&1; echo "rc=$?" >> "$W/power.txt"
pack; cat "$W/power.txt" | tail -12
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats"
SEC="$SEC --section InstructionStats --section Occupancy --section LaunchStats --section SourceCounters"
timeout 240 ncu --clock-control none -k regex:fsattn_fwd --launch-skip 1 --launch-count 1 $SEC --import-source no \
  -o "$W/rep" python scripts/probe_power.py --shape small --once > "$W/ncu_run.txt" 2>&1
echo "ncu rc=$?" >> "$W/ncu_run.txt"; tail -5 "$W/ncu_run.txt"
ncu --import "$W/rep.ncu-rep" --page details > "$W/ncu_details.txt" 2>&1
ncu --import "$W/rep.ncu-rep" --page source --csv --print-source sass > "$W/ncu_sass.csv" 2>&1 || \
  ncu --import "$W/rep.ncu-rep" --page source --csv > "$W/ncu_sass.csv" 2>&1
ncu --import "$W/rep.ncu-rep" --page raw --csv > "$W/ncu_raw.csv" 2>&1
rm -f "$W/rep.ncu-rep"; pack; ls -la "$W"; grep -E "Issue Slots Busy|Issued Ipc|No Eligible|Warp Cycles Per Issued|Pipe|SM Frequency|Duration" "$W/ncu_details.txt" | head -30
