#!/usr/bin/env bash
# bench/RESULTS.md §5: W5, an unrolled LSTM, and W5-large (bench/workloads.hpp) — plain, one checkpoint per
# timestep, the runtime budget (Tape::set_memory_budget) at 50 % and 35 % of the plain step's peak with each heuristic,
# and checkpoint_sequential_auto's plan — at 1 and 2 threads (bench/lstm_step.cpp); then the PyTorch peer
# (bench/peers/lstm_pytorch.py: plain and torch.utils.checkpoint per timestep) at 1 and 2 threads. Waits for an idle
# machine (1-minute load < 0.5) before each program, records uptime before and after, and runs `repetitions`
# randomly interleaved repetitions of at least 1 s each; writes bench/results/lstm_step.{json,txt,uptime},
# bench/results/lstm_pytorch_threads{1,2}.{json,uptime} and the table (bench/budget_summary.py) to
# bench/results/lstm_table.md.
#
#   bench/suites/lstm.sh [build-dir] [repetitions]        (defaults: build-bench 10)
# Build first: cmake --build build --target lstm_step (Release; needs Google Benchmark). About 15 minutes.
# Deterministic figures (peaks, recomputed ops and FLOPs, evictions) without timing, on a busy machine too:
#   build/bench/lstm_step --count W5 dtr_h_DTR 0.5 3        (any means of the table, any fraction)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
repetitions=${2:-10}
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned
[[ -x $build/bench/lstm_step ]] || { echo "lstm.sh: $build/bench/lstm_step is missing; build it first" >&2; exit 1; }
wait_for_idle
uptime > "$results/lstm_step.uptime"
"${tuned[@]}" "$build/bench/lstm_step" --benchmark_repetitions="$repetitions" --benchmark_min_time=1 \
  --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=false \
  --benchmark_counters_tabular=true --benchmark_color=false \
  --benchmark_out="$results/lstm_step.json" --benchmark_out_format=json > "$results/lstm_step.txt" 2>&1
uptime >> "$results/lstm_step.uptime"
# The PyTorch peer: Debian's interpreter (another python3 may come first on PATH), the peers' environment (passive
# waits for the pthreads OpenBLAS it loads: bench/README.md, Environment).
for threads in 1 2; do
  wait_for_idle
  uptime > "$results/lstm_pytorch_threads$threads.uptime"
  "${tuned[@]}" OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/peers/lstm_pytorch.py --threads "$threads" \
    --rounds "$repetitions" --repeats 20 --workloads W5,W5-large --json "$results/lstm_pytorch_threads$threads.json"
  uptime >> "$results/lstm_pytorch_threads$threads.uptime"
done
python3 bench/budget_summary.py "$results/lstm_step.json" \
  --pytorch "$results/lstm_pytorch_threads1.json" "$results/lstm_pytorch_threads2.json" > "$results/lstm_table.md"
cat "$results/lstm_table.md" "$results/lstm_step.uptime"
