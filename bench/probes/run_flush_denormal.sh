#!/usr/bin/env bash
# Subnormals in the optimizer (remat::set_flush_denormal): the MLP example trained with and without
# --flush-denormal, and the same model in PyTorch (bench/peers/mlp_pytorch.py) with and without
# torch.set_flush_denormal, per-epoch seconds. Waits for an idle machine (1-minute load < 0.5), records uptime
# before and after, then runs `rounds` rounds, each configuration once in a shuffled order, `epochs` epochs
# each (constant learning rate, as the peer has no schedule); writes one JSON line per run to
# bench/results/flush_denormal.jsonl and prints the median of each epoch's seconds per configuration.
#
#   bench/probes/run_flush_denormal.sh [build-dir] [rounds] [epochs]        (defaults: build 4 4)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
rounds=${2:-4}
epochs=${3:-4}
results=bench/results
mkdir -p "$results"
out="$results/flush_denormal.jsonl"
: > "$out"

source bench/common.sh
wait_for_idle
uptime > "$results/flush_denormal.uptime"

base=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
[[ -z $openblas_coretype ]] || base+=(OPENBLAS_CORETYPE="$openblas_coretype")
malloc=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736
run() {  # run <impl> <threads> <flush|no-flush>
  local line
  case "$1" in
    remat) line=$("${base[@]}" "$build/examples/mlp/mlp" --epochs "$epochs" --schedule constant --threads "$2" \
                    --"$3"-denormal --json | tail -1) ;;
    pytorch) line=$("${base[@]}" "$malloc" OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/peers/mlp_pytorch.py \
                      --epochs "$epochs" --threads "$2" --"$3"-denormal --json | tail -1) ;;
  esac
  echo "{\"impl\": \"$1\", \"threads\": $2, \"mode\": \"$3\", \"result\": $line}" >> "$out"
}
configs=(remat:1:flush remat:1:no-flush remat:2:flush remat:2:no-flush)
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c "import torch" 2>/dev/null &&
  configs+=(pytorch:1:flush pytorch:1:no-flush)
for round in $(seq "$rounds"); do
  for config in $(printf '%s\n' "${configs[@]}" | shuf); do
    echo "round $round: $config" >&2
    IFS=: read -r impl threads mode <<< "$config"
    run "$impl" "$threads" "$mode"
  done
done
uptime >> "$results/flush_denormal.uptime"

/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault((r["impl"], r["threads"], r["mode"]), []).append(r["result"])
epochs = max(len(x.get("epoch_seconds", [])) for rs in by.values() for x in rs)
print("| | " + " | ".join(f"epoch {e + 1}" for e in range(epochs)) + " | mean | test accuracy | runs |")
print("|---|" + "---|" * (epochs + 3))
for (impl, t, mode), rs in sorted(by.items()):
    cells = [f"{statistics.median(x['epoch_seconds'][e] for x in rs):.2f}" for e in range(epochs)]
    mean = statistics.median(x["seconds_per_epoch"] for x in rs)
    acc = statistics.median(x["test_accuracy"] for x in rs)
    acc = acc * 100 if acc <= 1 else acc
    print(f"| {impl}, {t} thread{'s' if t > 1 else ''}, {mode} | " + " | ".join(cells) +
          f" | {mean:.2f} | {acc:.2f}% | {len(rs)} |")
PY
