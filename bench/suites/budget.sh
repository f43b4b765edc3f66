#!/usr/bin/env bash
# docs/schedules.md's budget table (issue 13): W1, W2 and W3 under a memory budget of 50 % and 25 % of the plain
# step's measured peak — DTR (Tape::set_memory_budget) with each heuristic, checkpoint_sequential, the planner
# (checkpoint_sequential_auto) — and the plain step, at 1 and 2 threads (bench/budget_step.cpp). Waits for an
# idle machine (1-minute load < 0.5), records uptime before and after, and runs `repetitions` randomly
# interleaved repetitions of at least 1 s each; writes bench/results/budget_step.{json,txt,uptime} and the
# table (bench/budget_summary.py) to bench/results/budget_table.md.
#
#   bench/suites/budget.sh [build-dir] [repetitions]        (defaults: build-bench 10)
# Build first: cmake --build build --target budget_step (Release; needs Google Benchmark).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
repetitions=${2:-10}
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned
[[ -x $build/bench/budget_step ]] || { echo "budget.sh: $build/bench/budget_step is missing; build it first" >&2; exit 1; }
wait_for_idle
uptime > "$results/budget_step.uptime"
"${tuned[@]}" "$build/bench/budget_step" --benchmark_repetitions="$repetitions" --benchmark_min_time=1 \
  --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=false \
  --benchmark_counters_tabular=true --benchmark_color=false \
  --benchmark_out="$results/budget_step.json" --benchmark_out_format=json > "$results/budget_step.txt" 2>&1
uptime >> "$results/budget_step.uptime"
python3 bench/budget_summary.py "$results/budget_step.json" > "$results/budget_table.md"
cat "$results/budget_table.md" "$results/budget_step.uptime"
