#!/usr/bin/env bash
# Issue 11's run (bench/RESULTS.md §7): the rows its targets name, 1 and 2 threads, on an idle machine —
# W0, W1, W2 plain against hand-written and LibTorch, W3 in four modes against LibTorch, then the 2-thread
# rows again with OMP_WAIT_POLICY=PASSIVE, then W3's PyTorch peer (plain). Same environment and method as
# bench/run.sh (which runs every row: about 45 minutes); this one takes about 15.
#
#   bench/run_threads.sh [build-dir] [repetitions] [min-time-seconds]     (defaults: build-bench 10 1)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
repetitions=${2:-10}
min_time=${3:-1}
results=bench/results
mkdir -p "$results"

source bench/common.sh  # wait_for_idle, tuned (the C++ run's environment)
rows='^Step<(W0|W1|W2), (HandWritten|LibTorch|RematPlain)>/|^Step<W0, RematCaptured>/|^Step<W3, (RematNone|RematBlock|RematAttention|RematNoneFused|LibTorch)>/'

wait_for_idle
uptime > "$results/run_threads.uptime"
"${tuned[@]}" "$build/bench/step_benchmark" --benchmark_filter="$rows" --benchmark_repetitions="$repetitions" \
  --benchmark_enable_random_interleaving=true --benchmark_min_time="$min_time" \
  --benchmark_out="$results/run_threads.json" --benchmark_out_format=json > "$results/run_threads.txt"
uptime >> "$results/run_threads.uptime"

wait_for_idle
uptime > "$results/run_threads_passive.uptime"
"${tuned[@]}" OMP_WAIT_POLICY=PASSIVE "$build/bench/step_benchmark" --benchmark_repetitions="$repetitions" \
  --benchmark_filter='^Step<(W1|W2|W3), (RematPlain|RematNone|LibTorch)>/threads:2/' \
  --benchmark_enable_random_interleaving=true --benchmark_min_time="$min_time" \
  --benchmark_out="$results/run_threads_passive.json" --benchmark_out_format=json > "$results/run_threads_passive.txt"
uptime >> "$results/run_threads_passive.uptime"

for threads in 1 2; do
  wait_for_idle
  uptime > "$results/threads_gpt_pytorch$threads.uptime"
  "${tuned[@]}" OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/peers/gpt_pytorch.py --threads "$threads" \
    --repeats "$repetitions" --variants plain --no-peak --json "$results/threads_gpt_pytorch$threads.json" \
    > "$results/threads_gpt_pytorch$threads.txt"
  uptime >> "$results/threads_gpt_pytorch$threads.uptime"
done

/usr/bin/python3 bench/issue11_targets.py "$results/run_threads.json" \
  --pytorch-w3 "$results/threads_gpt_pytorch1.json" "$results/threads_gpt_pytorch2.json"
cat "$results"/run_threads*.uptime "$results"/threads_gpt_pytorch*.uptime
