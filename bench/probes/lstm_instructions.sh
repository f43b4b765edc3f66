#!/usr/bin/env bash
# Instructions per steady W5 step (bench/probes/README.md), which a busy machine does not distort: runs
# bench/lstm_step --count under `valgrind --tool=callgrind` for 1 and 3 steps after its warm-up and prints
# (I(3) − I(1)) / 2 for each means, and its ratio to plain's. One thread; OpenBLAS's Haswell kernels, since valgrind
# 3.19 decodes no AVX-512 (and the build must not use -march=native for the same reason).
#
#   bench/probes/lstm_instructions.sh [build-dir] [workload] [fraction] [means...]
#     (defaults: build-cg W5 0.5 plain checkpoint_per_step dtr_h_DTR dtr_h_DTR_eq dtr_h_local checkpoint_sequential_auto)
#
# Build: cmake -S . -B build-cg -DCMAKE_BUILD_TYPE=Release -DREMAT_BENCH_NATIVE=OFF && cmake --build build-cg --target lstm_step
# Needs valgrind (Debian: apt-get install valgrind). About 10 minutes for the six means.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cg}
workload=${2:-W5}
fraction=${3:-0.5}
shift $(($# < 3 ? $# : 3))
means=("$@")
[[ ${#means[@]} -gt 0 ]] || means=(plain checkpoint_per_step dtr_h_DTR dtr_h_DTR_eq dtr_h_local checkpoint_sequential_auto)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plain=""
for m in "${means[@]}"; do
  for steps in 1 3; do
    OPENBLAS_CORETYPE=Haswell OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 valgrind --tool=callgrind \
      --callgrind-out-file="$work/$m.$steps" "$build/bench/lstm_step" --count "$workload" "$m" "$fraction" "$steps" \
      > "$work/$m.$steps.out" 2> "$work/$m.$steps.log"
  done
  short=$(grep -o 'Collected : [0-9]*' "$work/$m.1.log" | grep -o '[0-9]*$')
  long=$(grep -o 'Collected : [0-9]*' "$work/$m.3.log" | grep -o '[0-9]*$')
  per_step=$(((long - short) / 2))
  [[ $m == plain ]] && plain=$per_step
  ratio=""
  [[ -n $plain ]] && ratio=$(awk -v a="$per_step" -v b="$plain" 'BEGIN { printf " (%.3f x plain)", a / b }')
  echo "$workload $m $fraction: $per_step instructions per step$ratio"
  sed 's/^/  /' "$work/$m.3.out"
done
