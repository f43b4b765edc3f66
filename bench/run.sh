#!/usr/bin/env bash
# Runs the benchmark suites on an idle machine and regenerates bench/RESULTS.md from their results:
#
#   bench/run.sh [build-dir] [repetitions] [suite...]         (defaults: build-bench 5, every suite)
#
# Suites (bench/suites/<suite>.sh, each usable alone with the same two arguments):
#   steps             W0–W3 training step: remat plain and checkpointed, hand-written Eigen, LibTorch, PyTorch
#   batched_matmul    [64,128,64] × [64,64,128] in remat and LibTorch
#   resnet            W4, the ResNet-14 step, every checkpoint mode, LibTorch and PyTorch
#   budget            W1–W3 under a memory budget: DTR, checkpoint_sequential, the planner
#   lstm              W5, an unrolled LSTM under a memory budget, and PyTorch's per-step checkpoint
#   compression       W2–W4 with residuals kept in bf16 or int8, beside the recompute policies
#   mlp_epochs        the Fashion-MNIST example's epoch against PyTorch's
#   checkpoint_modes  the Fashion-MNIST example's --checkpoint modes
#   distributed       W1 and the MLP example on 1 and 2 MPI ranks
# Every suite waits for a 1-minute load below 0.5 before each program it times; nothing else may run meanwhile
# (a compile on one of two cores doubles wall-clock medians). Before each suite this records the commit, the
# time and the load in bench/results/<suite>.meta, which bench/summarize.py puts in RESULTS.md's header.
# Build first, Release with LibTorch (Debian's libtorch-dev) and MPI:
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-bench --target bench
# All suites at 5 repetitions take about 90 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-bench}
repetitions=${2:-5}
shift $(($# < 2 ? $# : 2))
suites=("$@")
all=(steps batched_matmul resnet budget lstm compression mlp_epochs checkpoint_modes distributed)
[[ ${#suites[@]} -gt 0 ]] || suites=("${all[@]}")
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
failed=()
for suite in "${suites[@]}"; do
  [[ -x bench/suites/$suite.sh ]] || { echo "run.sh: no suite '$suite' (bench/suites/)" >&2; exit 2; }
done
/usr/bin/python3 bench/summarize.py --environment "$build" > "$results/environment.md"
for suite in "${suites[@]}"; do
  echo "== $suite ==" >&2
  {
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- include examples bench ':!bench/results' ':!bench/RESULTS.md' ':!bench/*.png' \
      || echo ' (modified)')"
    echo "started $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "repetitions $repetitions"
  } > "$results/$suite.meta"
  # A suite that fails leaves its section out of date; the others still run.
  bench/suites/"$suite".sh "$build" "$repetitions" || { echo "run.sh: suite $suite failed" >&2; failed+=("$suite"); }
  echo "ended $(date -u '+%Y-%m-%d %H:%M UTC')" >> "$results/$suite.meta"
done
/usr/bin/python3 bench/summarize.py "$results" > bench/RESULTS.md
echo "wrote bench/RESULTS.md" >&2
[[ ${#failed[@]} -eq 0 ]] || { echo "run.sh: failed suites: ${failed[*]}" >&2; exit 1; }
