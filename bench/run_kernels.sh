#!/usr/bin/env bash
# OpenBLAS's kernel sets on this machine (bench/RESULTS.md §9): W0, W1 and W2 plain against hand-written at
# 1 thread with each OPENBLAS_CORETYPE (Prescott: what OpenBLAS 0.3.21 picks by itself there). 5 interleaved
# repetitions of >= 0.5 s per row and kernel set; one JSON file per set.
#
#   bench/run_kernels.sh [build-dir] [kernel sets...]     (defaults: build-bench Prescott Haswell SkylakeX Cooperlake)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
shift || true
kernels=("$@")
[ ${#kernels[@]} -gt 0 ] || kernels=(Prescott Haswell SkylakeX Cooperlake)
results=bench/results
mkdir -p "$results"
source bench/common.sh
for k in "${kernels[@]}"; do
  wait_for_idle
  uptime > "$results/kernels_$k.uptime"
  "${tuned[@]}" OPENBLAS_CORETYPE="$k" OMP_NUM_THREADS=1 "$build/bench/step_benchmark" \
    --benchmark_filter='^Step<(W0|W1|W2), (HandWritten|RematPlain)>/threads:1/' --benchmark_repetitions=5 \
    --benchmark_enable_random_interleaving=true --benchmark_min_time=0.5 \
    --benchmark_out="$results/kernels_$k.json" --benchmark_out_format=json > "$results/kernels_$k.txt"
  uptime >> "$results/kernels_$k.uptime"
done
