#!/usr/bin/env bash
# Where a step's time goes (bench/probes/README.md): for each workload, implementation and
# thread count, records the timed steps of step_benchmark with `perf record` (only the timed loop: perf's
# --control window, opened and closed by the benchmark when REMAT_PERF_CONTROL names the control fifo) and
# splits the calling thread's samples into GEMM (OpenBLAS), waits (libgomp, kernel) and other work
# (bench/probes/time_split.py). Waits for an idle machine like bench/run.sh; one configuration at a time.
#
#   bench/probes/profile.sh [build-dir] [min-time-seconds]      (defaults: build-bench 5)
#
# Writes bench/results/profile.jsonl (one JSON object per configuration) and prints it.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
min_time=${2:-5}
results=bench/results
mkdir -p "$results"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out="$results/profile.jsonl"
# REMAT_PROFILE_ROWS="W2:RematPlain W2:LibTorch ..." profiles only those rows and appends to profile.jsonl;
# REMAT_BENCH_NO_WAIT=1 runs them back to back (each JSON line records the load at its start).
rows=${REMAT_PROFILE_ROWS:-"W1:RematPlain W1:LibTorch W1:HandWritten W2:RematPlain W2:LibTorch W2:HandWritten
                              W3:RematNone W3:LibTorch"}
[[ -n ${REMAT_PROFILE_ROWS:-} ]] || : > "$out"

source bench/common.sh  # wait_for_idle, tuned
if [[ ${REMAT_BENCH_NO_WAIT:-0} == 1 ]]; then
  wait_for_idle() { :; }
fi

for row in $rows; do
  workload=${row%%:*}
  impl=${row##*:}
  {
    for threads in 1 2; do
      wait_for_idle
      mkfifo "$work/control"
      load=$(cut -d' ' -f1 /proc/loadavg)
      perf record -q -F 499 -o "$work/perf.data" --control "fifo:$work/control" -D -1 -- \
        "${tuned[@]}" REMAT_PERF_CONTROL="$work/control" "$build/bench/step_benchmark" \
        --benchmark_filter="^Step<$workload, $impl>/threads:$threads/" --benchmark_min_time="$min_time" \
        --benchmark_repetitions=3 --benchmark_out="$work/result.json" --benchmark_out_format=json > /dev/null
      perf script -i "$work/perf.data" -F pid,tid,ip,dso 2> /dev/null > "$work/samples.txt"
      split=$(/usr/bin/python3 bench/probes/time_split.py "$work/samples.txt" "$work/result.json")
      echo "{\"workload\": \"$workload\", \"impl\": \"$impl\", \"threads\": $threads, \"load_at_start\": $load, \"split\": $split}" |
        tee -a "$out"
      rm -f "$work/control" "$work/perf.data"
    done
  }
done
