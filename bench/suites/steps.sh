#!/usr/bin/env bash
# The training step, W0–W3 (bench/README.md): every implementation of bench/step_benchmark.cpp — remat plain and
# under each checkpoint variant, hand-written Eigen + OpenBLAS backprop, LibTorch 1.13 — at 1 and 2 threads in
# randomly interleaved repetitions, then the PyTorch 1.13 peers (W0–W2: peers/pytorch_checkpoint.py; W3:
# peers/gpt_pytorch.py). Writes bench/results/steps.{json,txt,uptime}, steps_pytorch_threads{1,2}.json,
# steps_gpt_pytorch_threads{1,2}.json, the table bench/results/steps_table.md and bench/w2_memory_vs_time.png.
#
#   bench/suites/steps.sh [build-dir] [repetitions] [min-time-seconds]     (defaults: build-bench 5 1)
# Build first: cmake --build build-bench --target step_benchmark (Release; LibTorch's rows need libtorch-dev).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
repetitions=${2:-5}
min_time=${3:-1}
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned (the C++ run's environment)
[[ -x $build/bench/step_benchmark ]] || { echo "steps.sh: $build/bench/step_benchmark is missing; build it first" >&2; exit 1; }
# The PyTorch peers load Debian's default OpenBLAS (the pthreads build, through libblas.so.3), for which
# the passive wait policy is the tuning.
peer_tuned=("${tuned[@]}" OMP_WAIT_POLICY=PASSIVE)

wait_for_idle
uptime > "$results/steps.uptime"
"${tuned[@]}" "$build/bench/step_benchmark" --benchmark_repetitions="$repetitions" \
  --benchmark_enable_random_interleaving=true --benchmark_min_time="$min_time" \
  --benchmark_out="$results/steps.json" --benchmark_out_format=json > "$results/steps.txt"
uptime >> "$results/steps.uptime"

for threads in 1 2; do
  wait_for_idle
  "${peer_tuned[@]}" /usr/bin/python3 bench/peers/pytorch_checkpoint.py --threads "$threads" --repeats "$repetitions" \
    --json "$results/steps_pytorch_threads$threads.json" > /dev/null
  # W3's peer: plain, block and selective checkpointing, each variant once per repetition in shuffled order,
  # plus one untimed step for its saved and peak bytes.
  wait_for_idle
  "${peer_tuned[@]}" /usr/bin/python3 bench/peers/gpt_pytorch.py --threads "$threads" --repeats "$repetitions" \
    --json "$results/steps_gpt_pytorch_threads$threads.json" > /dev/null
done
uptime >> "$results/steps.uptime"

/usr/bin/python3 bench/plot_results.py "$results/steps.json" \
  --pytorch "$results/steps_pytorch_threads1.json" "$results/steps_pytorch_threads2.json" \
  --pytorch-w3 "$results/steps_gpt_pytorch_threads1.json" "$results/steps_gpt_pytorch_threads2.json" \
  --csv "$results/steps.csv" --markdown "$results/steps_table.md" --png bench/w2_memory_vs_time.png
