#!/usr/bin/env bash
# The MLP example's --checkpoint modes on 784-1024×8-10 ReLU, batch 128 (docs/mlp.md "What each mode costs"):
# seconds per epoch and saved bytes per step of none, layer, sqrt and dots. Waits for an idle machine
# (1-minute load < 0.5), records uptime before and after, then runs `rounds` rounds, each running every
# (mode, threads) pair once in a shuffled order, one epoch of --limit 10000 with a constant learning rate;
# writes one JSON line per run to bench/results/checkpoint_modes.jsonl and prints the medians and each mode's
# ratio to none at the same thread count (within each round, then the median).
#
#   bench/suites/checkpoint_modes.sh [build-dir] [rounds] [threads...]   (defaults: build-bench 5 1 2)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-bench}
rounds=${2:-5}
shift $(($# < 2 ? $# : 2))
threads=("$@")
[[ ${#threads[@]} -gt 0 ]] || threads=(1 2)
results=bench/results
mkdir -p "$results"
out="$results/checkpoint_modes.jsonl"
: > "$out"

source bench/common.sh
wait_for_idle
uptime > "$results/checkpoint_modes.uptime"

hidden=1024,1024,1024,1024,1024,1024,1024,1024
configs=()
for mode in none layer sqrt dots; do
  for t in "${threads[@]}"; do configs+=("$mode:$t"); done
done
for round in $(seq "$rounds"); do
  for config in $(printf '%s\n' "${configs[@]}" | shuf); do
    mode=${config%%:*} t=${config##*:}
    echo "round $round: $config" >&2
    line=$("${tuned[@]}" "$build/examples/mlp/mlp" --epochs 1 --limit 10000 --hidden "$hidden" --schedule constant \
             --checkpoint "$mode" --threads "$t" --json | tail -1)
    echo "{\"round\": $round, \"mode\": \"$mode\", \"threads\": $t, \"result\": $line}" >> "$out"
  done
done
uptime >> "$results/checkpoint_modes.uptime"

/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
time = {(r["round"], r["mode"], r["threads"]): r["result"]["seconds_per_epoch"] for r in runs}
saved = {(r["mode"], r["threads"]): r["result"]["saved_bytes_per_step"] for r in runs}
rounds = sorted({r["round"] for r in runs})
print("| mode | threads | seconds per epoch, median (min–max) | ÷ none, median of rounds (min–max) | saved bytes per step |")
print("|---|---|---|---|---|")
for mode in ("none", "layer", "sqrt", "dots"):
    for t in sorted({r["threads"] for r in runs}):
        s = [time[(k, mode, t)] for k in rounds if (k, mode, t) in time]
        q = [time[(k, mode, t)] / time[(k, "none", t)] for k in rounds if (k, mode, t) in time and (k, "none", t) in time]
        if not s:
            continue
        print(f"| {mode} | {t} | {statistics.median(s):.2f} ({min(s):.2f}–{max(s):.2f}) "
              f"| {statistics.median(q):.3f} ({min(q):.3f}–{max(q):.3f}) | {saved[(mode, t)]:,} |")
PY
