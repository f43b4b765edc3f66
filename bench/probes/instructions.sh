#!/usr/bin/env bash
# Instructions per steady training step (bench/probes/README.md), which a busy machine does not distort:
# runs bench/step_count under `valgrind --tool=callgrind` for 10 and 110 steps (after one warm-up step) and
# prints (I(110) − I(10)) / 100 for each implementation. OpenBLAS and remat on one thread.
#
#   bench/probes/instructions.sh [build-dir] [workload] [implementations]   (defaults: build W0 "hand remat")
#
# Needs valgrind (Debian: apt-get install valgrind) and the step_count target of a build valgrind can decode
# (3.19 decodes no AVX-512, so not -march=native):
#   cmake -S . -B build-v3 -DCMAKE_BUILD_TYPE=Release -DREMAT_BENCH_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3
#   cmake --build build-v3 --target step_count && bench/probes/instructions.sh build-v3 W0
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
workload=${2:-W0}
impls=${3:-"hand remat"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for impl in $impls; do
  for steps in 10 110; do
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file="$work/$impl.$steps" \
      "$build/bench/step_count" "$workload" "$impl" "$steps" 1 > /dev/null 2> "$work/$impl.$steps.log"
  done
  short=$(grep -o 'Collected : [0-9]*' "$work/$impl.10.log" | grep -o '[0-9]*$')
  long=$(grep -o 'Collected : [0-9]*' "$work/$impl.110.log" | grep -o '[0-9]*$')
  echo "$workload $impl: $(((long - short) / 100)) instructions per step"
done
