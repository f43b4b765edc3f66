#!/usr/bin/env bash
# bench/RESULTS.md §3: W4, one training step of examples/resnet's ResNet-14 (width 16, batch 128,
# 28×28), in remat under each checkpoint mode with conv2d on oneDNN and on im2col, and in LibTorch
# (bench/resnet_step.cpp), at 1 and 2 threads; then the PyTorch peer (bench/peers/resnet_step.py: plain and
# torch.utils.checkpoint per block) at 1 and 2 threads. Waits for an idle machine (1-minute load < 0.5) before each
# program, records uptime before and after, runs `repetitions` randomly interleaved repetitions of at least 2 s
# each; writes bench/results/resnet_step.{json,uptime}, bench/results/resnet_pytorch_threads{1,2}.{json,uptime} and
# the table (bench/resnet_summary.py) to bench/results/resnet_table.md.
#
#   bench/suites/resnet.sh [build-dir] [repetitions]        (defaults: build-bench 7)
# Build first: cmake --build build --target resnet_step (Release; needs Google Benchmark; LibTorch's row needs
# Debian's libtorch-dev). About 10 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
repetitions=${2:-7}
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned
[[ -x $build/bench/resnet_step ]] || { echo "resnet.sh: $build/bench/resnet_step is missing; build it first" >&2; exit 1; }
wait_for_idle
uptime > "$results/resnet_step.uptime"
"${tuned[@]}" "$build/bench/resnet_step" --benchmark_repetitions="$repetitions" --benchmark_min_time=2 \
  --benchmark_enable_random_interleaving=true --benchmark_display_aggregates_only=true --benchmark_color=false \
  --benchmark_out="$results/resnet_step.json" --benchmark_out_format=json
uptime >> "$results/resnet_step.uptime"
for threads in 1 2; do
  wait_for_idle
  uptime > "$results/resnet_pytorch_threads$threads.uptime"
  "${tuned[@]}" OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/peers/resnet_step.py --threads "$threads" \
    --repetitions "$repetitions" --json | tail -n 1 > "$results/resnet_pytorch_threads$threads.json"
  uptime >> "$results/resnet_pytorch_threads$threads.uptime"
done
python3 bench/resnet_summary.py "$results/resnet_step.json" "$results/resnet_pytorch_threads1.json" \
  "$results/resnet_pytorch_threads2.json" > "$results/resnet_table.md"
cat "$results/resnet_table.md" "$results/resnet_step.uptime"
