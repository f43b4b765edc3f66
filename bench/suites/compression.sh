#!/usr/bin/env bash
# Where compressed residuals pay (docs/compression.md): W2, W3 and W4 under nothing_saveable, dots_saveable and
# every residual kept in bf16 or int8 (bench/compression_step.cpp), beside the plain step, at 1 and 2 threads.
# Waits for an idle machine (1-minute load < 0.5), records uptime before and after, runs `repetitions` randomly
# interleaved repetitions of at least 1 s each; writes bench/results/compression_step.{json,uptime}, the table
# (bench/compression_summary.py) to bench/results/compression_table.md and the plot to
# bench/compression_memory_vs_time.png.
#
#   bench/suites/compression.sh [build-dir] [repetitions]        (defaults: build-bench 5)
# Build first: cmake --build build --target compression_step (Release; needs Google Benchmark). About 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
repetitions=${2:-5}
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned
[[ -x $build/bench/compression_step ]] ||
  { echo "compression.sh: $build/bench/compression_step is missing; build it first" >&2; exit 1; }
wait_for_idle
uptime > "$results/compression_step.uptime"
"${tuned[@]}" "$build/bench/compression_step" --benchmark_repetitions="$repetitions" --benchmark_min_time=1 \
  --benchmark_enable_random_interleaving=true --benchmark_display_aggregates_only=true --benchmark_color=false \
  --benchmark_out="$results/compression_step.json" --benchmark_out_format=json
uptime >> "$results/compression_step.uptime"
/usr/bin/python3 bench/compression_summary.py "$results/compression_step.json" \
  --png bench/compression_memory_vs_time.png > "$results/compression_table.md"
cat "$results/compression_table.md" "$results/compression_step.uptime"
