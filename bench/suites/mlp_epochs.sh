#!/usr/bin/env bash
# The MLP example (784-512-512-10, batch 128, Adam, constant learning rate) against the same model in
# PyTorch (bench/peers/mlp_pytorch.py), seconds per epoch at 1 and 2 threads (docs/mlp.md "Speed against
# PyTorch"). Waits for an idle machine (1-minute load < 0.5), records uptime before and after, then runs
# `rounds` rounds, each of the four configurations once in a shuffled order, 2 epochs each; writes one JSON
# line per run to bench/results/mlp_epochs.jsonl and prints the medians.
#
#   bench/suites/mlp_epochs.sh [build-dir] [rounds]        (defaults: build-bench 5; the build holds examples/mlp)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
rounds=${2:-5}
results=bench/results
mkdir -p "$results"
out="$results/mlp_epochs.jsonl"
: > "$out"

source bench/common.sh
wait_for_idle
uptime > "$results/mlp_epochs.uptime"

base=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)  # and the kernels bench/common.sh chose
[[ -z $openblas_coretype ]] || base+=(OPENBLAS_CORETYPE="$openblas_coretype")
malloc=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736
run() {  # run <name> <threads>
  local line
  case "$1" in
    remat) line=$("${base[@]}" "$build/examples/mlp/mlp" --epochs 2 --schedule constant --threads "$2" --json | tail -1) ;;
    pytorch) line=$("${base[@]}" "$malloc" OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/peers/mlp_pytorch.py \
                      --epochs 2 --threads "$2" --json | tail -1) ;;
  esac
  echo "{\"impl\": \"$1\", \"threads\": $2, \"result\": $line}" >> "$out"
}
for round in $(seq "$rounds"); do
  for config in $(printf '%s\n' remat:1 pytorch:1 remat:2 pytorch:2 | shuf); do
    echo "round $round: $config" >&2
    run "${config%%:*}" "${config##*:}"
  done
done
uptime >> "$results/mlp_epochs.uptime"

/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault((r["impl"], r["threads"]), []).append(r["result"])
print("| | seconds per epoch, median (min–max) | CPU s per epoch, median | runs |")
print("|---|---|---|---|")
for (impl, t), rs in sorted(by.items()):
    s = [x["seconds_per_epoch"] for x in rs]
    c = [x["cpu_seconds_per_epoch"] for x in rs]
    print(f"| {impl}, {t} thread{'s' if t > 1 else ''} | {statistics.median(s):.2f} ({min(s):.2f}–{max(s):.2f}) "
          f"| {statistics.median(c):.2f} | {len(rs)} |")
for t in (1, 2):
    r, p = by.get(("remat", t)), by.get(("pytorch", t))
    if r and p:
        print(f"remat / PyTorch at {t} thread(s): "
              f"{statistics.median(x['seconds_per_epoch'] for x in r) / statistics.median(x['seconds_per_epoch'] for x in p):.3f}")
PY
