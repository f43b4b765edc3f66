#!/usr/bin/env bash
# OpenBLAS's kernel sets on this machine (bench/probes/README.md): W0, W1 and W2 plain against hand-written at
# 1 thread with each OPENBLAS_CORETYPE (Prescott: what OpenBLAS 0.3.21 picks by itself on a CPU it does not
# know). `rounds` rounds, each running every set once in a shuffled order (one repetition of >= 0.5 s per
# row, the rows randomly interleaved), so that the machine's drift spreads over all sets alike. Waits for an
# idle machine once, at the start; one JSON file per set and round.
#
#   bench/probes/run_kernels.sh [build-dir] [rounds] [kernel sets...]  (defaults: build-bench 5 Prescott Haswell SkylakeX Cooperlake)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
rounds=${2:-5}
shift 2 || shift $#
kernels=("$@")
[ ${#kernels[@]} -gt 0 ] || kernels=(Prescott Haswell SkylakeX Cooperlake)
results=bench/results
mkdir -p "$results"
rm -f "$results"/kernels_*.json "$results"/kernels_*.txt "$results"/kernels_*.uptime
source bench/common.sh
wait_for_idle
uptime > "$results/kernels.uptime"
for round in $(seq "$rounds"); do
  for k in $(printf '%s\n' "${kernels[@]}" | shuf); do
    "${tuned[@]}" OPENBLAS_CORETYPE="$k" OMP_NUM_THREADS=1 "$build/bench/step_benchmark" \
      --benchmark_filter='^Step<(W0|W1|W2), (HandWritten|RematPlain)>/threads:1/' --benchmark_repetitions=1 \
      --benchmark_enable_random_interleaving=true --benchmark_min_time=0.5 \
      --benchmark_out="$results/kernels_${k}_$round.json" --benchmark_out_format=json > /dev/null
  done
done
uptime >> "$results/kernels.uptime"
/usr/bin/python3 - "$results" "${kernels[@]}" <<'PY'
import glob, json, statistics, sys
results, kernels = sys.argv[1], sys.argv[2:]
print("| kernels | " + " | ".join(["W0 hand", "W0 remat", "W1 hand", "W1 remat", "W2 hand", "W2 remat"]) + " |")
for k in kernels:
    times = {}
    for f in sorted(glob.glob(f"{results}/kernels_{k}_*.json")):
        for b in json.load(open(f))["benchmarks"]:
            if b.get("run_type") == "iteration":
                times.setdefault(b["run_name"], []).append(b["real_time"])
    cells = []
    for w in ("W0", "W1", "W2"):
        for impl in ("HandWritten", "RematPlain"):
            v = sorted(times[f"Step<{w}, {impl}>/threads:1/real_time"])
            q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
            cells.append(f"{statistics.median(v):.4g} ({q[0]:.4g}–{q[2]:.4g})")
    print(f"| {k} | " + " | ".join(cells) + " |")
PY
