#!/usr/bin/env bash
# Where W0's step time goes, remat against the hand-written code (bench/probes/README.md): `perf record -e
# cpu-clock` of `bench/step_count W0 remat|hand <steps> 1` in the benchmarks' environment (bench/common.sh),
# `rounds` rounds alternating the two, each started on an idle machine (1-minute load < 0.5, recorded).
# Keeps each run's `perf report` by symbol in bench/results/w0_split/ and prints microseconds per step per
# category (bench/probes/w0_split.py): matrix products (OpenBLAS and Eigen's call into it), zero fills, the
# elementwise kernels, the tape's bookkeeping, the step driver (the model's step inlined into step_count's
# loop), other.
#
#   bench/probes/w0_split.sh [build-dir] [rounds] [steps]      (defaults: build-bench 3 40000; needs bench/step_count)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
rounds=${2:-3}
steps=${3:-40000}
out=bench/results/w0_split
mkdir -p "$out"
rm -f "$out"/*.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

source bench/common.sh  # wait_for_idle, tuned
for round in $(seq "$rounds"); do
  for impl in remat hand; do
    wait_for_idle
    load=$(cut -d' ' -f1 /proc/loadavg)
    start=$(date -u +%H:%M:%S)
    perf record -q -e cpu-clock -F 4999 -o "$work/perf.data" -- \
      "${tuned[@]}" "$build/bench/step_count" W0 "$impl" "$steps" 1 > /dev/null
    {
      echo "# W0 $impl, $steps steps, round $round, started $start UTC at load $load"
      perf report -i "$work/perf.data" --no-children --sort symbol -F sample,symbol --stdio 2> /dev/null |
        grep -v '^#' | grep -v '^$'
    } > "$out/$impl-$round.txt"
  done
done
/usr/bin/python3 bench/probes/w0_split.py "$steps" "$out"/*.txt
