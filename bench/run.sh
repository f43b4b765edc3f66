#!/usr/bin/env bash
# Runs the benchmarks of bench/RESULTS.md §2 on an idle machine and writes bench/results/<name>.*:
# waits until the 1-minute load average is below 0.5, records `uptime` before and after each run, runs
# step_benchmark (remat, hand-written Eigen, LibTorch; W0 … W3; 1 and 2 threads; randomly interleaved
# repetitions) and the PyTorch peers (W0 … W2: peers/pytorch_checkpoint.py; W3: peers/gpt_pytorch.py), then
# makes the CSV and Markdown tables (W3 in a table of its own).
#
#   bench/run.sh [build-dir] [repetitions] [min-time-seconds]     (defaults: build-bench 10 1)
#
# Time nothing else on the machine meanwhile: a compile on one of two cores doubles wall-clock medians.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
repetitions=${2:-10}
min_time=${3:-1}
results=bench/results
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned (the C++ run's environment)
# The PyTorch peers load Debian's default OpenBLAS (the pthreads build, through libblas.so.3), for which
# the passive wait policy is the tuning.
peer_tuned=("${tuned[@]}" OMP_WAIT_POLICY=PASSIVE)

wait_for_idle
uptime > "$results/run_tuned.uptime"
"${tuned[@]}" "$build/bench/step_benchmark" --benchmark_repetitions="$repetitions" \
  --benchmark_enable_random_interleaving=true --benchmark_min_time="$min_time" \
  --benchmark_out="$results/run_tuned.json" --benchmark_out_format=json > "$results/run_tuned.txt"
uptime >> "$results/run_tuned.uptime"

# The 2-thread W1, W2 and W3 rows of remat and LibTorch again with OMP_WAIT_POLICY=PASSIVE.
wait_for_idle
uptime > "$results/run_passive.uptime"
"${tuned[@]}" OMP_WAIT_POLICY=PASSIVE "$build/bench/step_benchmark" --benchmark_repetitions="$repetitions" \
  --benchmark_filter='^Step<(W1|W2|W3), (RematPlain|RematNone|LibTorch)>/threads:2/' \
  --benchmark_enable_random_interleaving=true --benchmark_min_time="$min_time" \
  --benchmark_out="$results/run_passive.json" --benchmark_out_format=json > "$results/run_passive.txt"
uptime >> "$results/run_passive.uptime"

for threads in 1 2; do
  wait_for_idle
  uptime > "$results/pytorch_threads$threads.uptime"
  "${peer_tuned[@]}" /usr/bin/python3 bench/peers/pytorch_checkpoint.py --threads "$threads" --repeats "$repetitions" \
    --json "$results/pytorch_threads$threads.json" > "$results/pytorch_threads$threads.txt"
  uptime >> "$results/pytorch_threads$threads.uptime"
done

# W3's peer: plain, block and selective checkpointing (sdpa only on torch >= 2.0), each variant once per
# repetition in shuffled order, plus one untimed step for its saved and peak bytes.
for threads in 1 2; do
  wait_for_idle
  uptime > "$results/gpt_pytorch_threads$threads.uptime"
  "${peer_tuned[@]}" /usr/bin/python3 bench/peers/gpt_pytorch.py --threads "$threads" --repeats "$repetitions" \
    --json "$results/gpt_pytorch_threads$threads.json" > "$results/gpt_pytorch_threads$threads.txt"
  uptime >> "$results/gpt_pytorch_threads$threads.uptime"
done

/usr/bin/python3 bench/plot_results.py "$results/run_tuned.json" \
  --pytorch "$results/pytorch_threads1.json" "$results/pytorch_threads2.json" \
  --pytorch-w3 "$results/gpt_pytorch_threads1.json" "$results/gpt_pytorch_threads2.json" \
  --csv "$results/run_tuned.csv" --markdown "$results/table.md" --png bench/w2_memory_vs_time.png
cat "$results"/*.uptime
