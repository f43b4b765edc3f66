#!/usr/bin/env bash
# A batched matrix product C [64,128,128] = A [64,128,64] × B [64,64,128], float32, at 1 and 2 threads: remat's
# matmul beside LibTorch's torch::matmul and hand-written loops over the batch (bench/batched_matmul.cpp), forward
# and forward + backward, randomly interleaved. Writes bench/results/batched_matmul.{json,uptime}.
#
#   bench/suites/batched_matmul.sh [build-dir] [repetitions]     (defaults: build-bench 5)
# Build first: cmake --build build-bench --target batched_matmul (Release; needs libtorch-dev).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
repetitions=${2:-5}
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned
[[ -x $build/bench/batched_matmul ]] || { echo "batched_matmul.sh: $build/bench/batched_matmul is missing; build it first" >&2; exit 1; }
wait_for_idle
uptime > "$results/batched_matmul.uptime"
"${tuned[@]}" "$build/bench/batched_matmul" --benchmark_repetitions="$repetitions" \
  --benchmark_enable_random_interleaving=true --benchmark_color=false \
  --benchmark_out="$results/batched_matmul.json" --benchmark_out_format=json > /dev/null
uptime >> "$results/batched_matmul.uptime"
