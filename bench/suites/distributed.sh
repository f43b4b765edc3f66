#!/usr/bin/env bash
# The data-parallel measurements of docs/distributed.md §Performance (issue 12 item 5), on an idle machine:
# W1's step (bench/distributed_step.cpp: forward + backward + all-reduce of a global batch of 512 rows) and
# one epoch of the MLP example with --timing, each as 1 rank × 1 thread, 1 rank × 2 threads and 2 ranks ×
# 1 thread. Before each run it waits until the 1-minute load average is below 0.5 and records `uptime`
# before and after; it writes bench/results/distributed_*.{txt,json,uptime} and distributed_summary.md.
#
#   bench/suites/distributed.sh [build-dir] [repetitions] [steps-per-repetition] [mlp-epochs] [mlp-rounds]
#                                                                    (defaults: build-bench 10 5 1 5)
# The MLP runs go in rounds: each round waits for an idle machine once, then runs the five MLP
# configurations back to back in a random order (distributed_mlp_<config>_<round>.txt); the summary gives
# the median and the range over the rounds. REMAT_BENCH_ONLY=w1 or =mlp runs one half.
# Build first (Release; the bench targets need Google Benchmark and MPI):
#   cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release && cmake --build build-bench --target distributed_step mlp
#
# Binding on this 2-core machine (mpirun's default for 2 or fewer ranks is --bind-to core, which would put
# the two threads of a 1-rank × 2-thread run on one core):
#   1 rank × 1 thread:  --bind-to core: the rank stays on one core, as each rank of the 2-rank run does;
#   1 rank × 2 threads: --bind-to none: the OS spreads the OpenMP and OpenBLAS threads over both cores;
#   2 ranks × 1 thread: --bind-to core --map-by core: one rank per core, never both on one, no migration.
# mpirun --report-bindings writes what it did into each .txt. W1 also runs 2 ranks × 1 thread with the ring
# algorithm forced (r2t1_ring): Open MPI 4.1's libnbc chooses a binomial tree for an in-place MPI_Iallreduce
# (the reducer's) and for fewer than 4 ranks (docs/distributed.md §Scaling model). Time nothing else on the
# machine meanwhile.
#
# For a smoke test of the script only (its figures then mean nothing; do not keep them):
#   REMAT_BENCH_RESULTS=/tmp/dist REMAT_BENCH_NO_WAIT=1 REMAT_BENCH_MLP_LIMIT=2000 bench/suites/distributed.sh build-bench 2 1
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
repetitions=${2:-10}
steps=${3:-5}
epochs=${4:-1}
rounds=${5:-5}
only=${REMAT_BENCH_ONLY:-all}
results=${REMAT_BENCH_RESULTS:-bench/results}
mkdir -p "$results"
source bench/common.sh  # wait_for_idle, tuned
if [[ ${REMAT_BENCH_NO_WAIT:-0} == 1 ]]; then
  wait_for_idle() { :; }
fi
for binary in "$build/bench/distributed_step" "$build/examples/mlp/mlp"; do
  [[ -x $binary ]] || { echo "distributed.sh: $binary is missing; build it first (see the comment at the top)" >&2; exit 1; }
done

mpirun=(mpirun --oversubscribe --allow-run-as-root --report-bindings)
# name ranks threads mpirun-flags
configurations=("r1t1 1 1 --bind-to core" "r1t2 1 2 --bind-to none" "r2t1 2 1 --bind-to core --map-by core")
ring="r2t1_ring 2 1 --bind-to core --map-by core --mca coll_libnbc_iallreduce_algorithm 1"
mlp_flags=(--epochs "$epochs" --timing --json)
if [[ -n ${REMAT_BENCH_MLP_LIMIT:-} ]]; then
  mlp_flags+=(--limit "$REMAT_BENCH_MLP_LIMIT")
fi

# run NAME COMMAND...: waits for an idle machine, then runs COMMAND with stdout and stderr into NAME.txt.
run() {
  local name=$1
  shift
  wait_for_idle
  uptime > "$results/$name.uptime"
  "${tuned[@]}" "$@" > "$results/$name.txt" 2>&1
  uptime >> "$results/$name.uptime"
}

if [[ $only != mlp ]]; then
  for configuration in "${configurations[@]}" "$ring"; do
    read -r name ranks threads flags <<< "$configuration"
    read -ra flags <<< "$flags"
    run "distributed_w1_$name" "${mpirun[@]}" -np "$ranks" "${flags[@]}" "$build/bench/distributed_step" \
      --threads "$threads" --repetitions "$repetitions" --steps "$steps" --benchmark_color=false \
      --benchmark_out="$results/distributed_w1_$name.json" --benchmark_out_format=json
  done
fi

# The MLP example: one process without MPI (the baseline), and under mpirun --distributed (its reducer's
# cost with one rank; data parallelism with two). Each round: one wait, then the five in a random order.
mlp_configurations=("r1t1_plain" "r1t2_plain" "${configurations[@]%% *}")
# mlp_run CONFIG ROUND: one epoch of the MLP example in that configuration, into distributed_mlp_CONFIG_ROUND.
mlp_run() {
  local config=$1 round=$2 name="distributed_mlp_$1_$2"
  uptime > "$results/$name.uptime"
  case $config in
    r1t1_plain | r1t2_plain)
      local threads=${config:3:1}
      "${tuned[@]}" "$build/examples/mlp/mlp" --threads "$threads" "${mlp_flags[@]}" > "$results/$name.txt" 2>&1
      ;;
    *)
      local configuration ranks threads flags
      for configuration in "${configurations[@]}"; do
        [[ ${configuration%% *} == "$config" ]] && read -r _ ranks threads flags <<< "$configuration"
      done
      read -ra flags <<< "$flags"
      "${tuned[@]}" "${mpirun[@]}" -np "$ranks" "${flags[@]}" "$build/examples/mlp/mlp" --distributed \
        --threads "$threads" "${mlp_flags[@]}" > "$results/$name.txt" 2>&1
      ;;
  esac
  uptime >> "$results/$name.uptime"
}
if [[ $only != w1 ]]; then
  rm -f "$results"/distributed_mlp_*
  for ((round = 1; round <= rounds; ++round)); do
    wait_for_idle
    for config in $(printf '%s\n' "${mlp_configurations[@]}" | shuf); do
      mlp_run "$config" "$round"
    done
  done
fi

python3 bench/distributed_summary.py "$results" > "$results/distributed_summary.md"
cat "$results/distributed_summary.md"
grep -H . "$results"/distributed_*.uptime
