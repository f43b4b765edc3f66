#!/usr/bin/env python3
"""docs/schedules.md's budget table and bench/RESULTS.md §4 from bench/budget_step's Google Benchmark JSON
(bench/suites/budget.sh), and bench/RESULTS.md §5 from bench/lstm_step's (bench/suites/lstm.sh).

usage: budget_summary.py budget_step.json [--pytorch lstm_pytorch_threads1.json ...] > budget_table.md

One table per workload and thread count: each means (plain, DTR per heuristic, checkpoint_sequential, the
planner) at each budget, with the median wall time and interquartile range over the repetitions, the ratio
to the plain step's median in the same run (median and IQR computed here from the repetitions' times), the measured peak and the ops recomputed per step (and, where the
benchmark counts them, the FLOPs recomputed). A means that cannot meet a budget shows its error. --pytorch adds the
rows of bench/peers/lstm_pytorch.py's JSON files to the tables of their workload and thread count. Standard
library only.
"""
import json
import re
import sys

args = sys.argv[1:]
pytorch_files = []
if "--pytorch" in args:
    pytorch_files = args[args.index("--pytorch") + 1:]
    args = args[:args.index("--pytorch")]
runs = json.load(open(args[0]))["benchmarks"]
NAME = re.compile(r"budget_step/(W\d[\w-]*)/([^/]+)/budget_([^/]+)/threads:(\d+)")

rows = {}  # (workload, threads) -> {(means, budget): entry}
for b in runs:
    m = NAME.match(b["name"] if b.get("run_type") != "aggregate" else b["run_name"])
    if not m:
        continue
    workload, means, budget, threads = m.groups()
    entry = rows.setdefault((workload, int(threads)), {}).setdefault((means, budget), {"times": []})
    if b.get("error_occurred"):
        entry["error"] = b.get("error_message", "error")
    elif b.get("run_type") == "aggregate":
        entry[b["aggregate_name"]] = b["real_time"]
    else:
        entry["times"].append(b["real_time"])
        entry["counters"] = b


def quantile(values, q):
    """Linear interpolation between order statistics (numpy's default)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


for entries in rows.values():
    for e in entries.values():
        if e["times"] and "error" not in e:
            e["median"] = quantile(e["times"], 0.5)
            e["iqr"] = quantile(e["times"], 0.75) - quantile(e["times"], 0.25)


def mb(x):
    return f"{x / 1e6:.1f} MB"


peers = {}  # (workload, threads) -> rows of the PyTorch peer
for path in pytorch_files:
    for row in json.load(open(path)):
        peers.setdefault((row["workload"], int(row["threads"])), []).append(row)

for (workload, threads), entries in sorted(rows.items()):
    plain = entries.get(("plain", "none"), {}).get("median")
    flops = any("recomputed_flops" in e.get("counters", {}) for e in entries.values())
    print(f"\n### {workload}, {threads} thread{'s' if threads > 1 else ''}\n")
    print(f"| means | budget | measured peak | median ms ({len(entries[('plain', 'none')]['times'])} repetitions) | IQR ms | × plain | recomputed ops / N | "
          + ("recomputed GFLOP | " if flops else "") + "evictions |")
    print("|---|---|---|---|---|---|---|" + ("---|" if flops else "") + "---|")
    order = ["plain", "checkpoint_per_step", "dtr_h_DTR", "dtr_h_DTR_eq", "dtr_h_local", "checkpoint_sequential",
             "checkpoint_sequential_auto"]
    for (means, budget), e in sorted(entries.items(), key=lambda kv: (kv[0][1] != "none", kv[0][1], order.index(kv[0][0]))):
        label = means + (f" ({int(e['counters']['segments'])} segments)" if "counters" in e and "segments" in e["counters"] else "")
        if "error" in e:
            print(f"| {label} | {budget.replace('pct', ' %')} | — | — | — | — | — | " + ("— | " if flops else "")
                  + f"{e['error'][:110]}… |")
            continue
        c = e["counters"]
        budget_text = "none" if budget == "none" else f"{budget.replace('pct', ' %')}: {mb(c['budget_bytes'])}"
        ratio = f"{e['median'] / plain:.2f}" if plain else "—"
        within = "" if budget == "none" else (" ≤ budget" if c["within_budget"] else " (over)")
        recomputed_flops = f"{c['recomputed_flops'] / 1e9:.3f} | " if flops else ""
        print(f"| {label} | {budget_text} | {mb(c['peak_bytes'])}{within} | {e['median']:.2f} | {e.get('iqr', 0):.2f} | "
              f"{ratio} | {int(c['recomputed_ops'])} / {int(c['N'])} = {c['recomputed_per_N']:.2f} | "
              f"{recomputed_flops}{int(c['evictions'])} |")
    for row in peers.get((workload, threads), []):
        ratio = f"{row['ratio_to_plain']:.2f} (× remat plain {row['median_ms'] / plain:.2f})" if plain else "—"
        print(f"| PyTorch {row['variant']} | none | — ({row['saved_bytes'] / 1e6:.1f} MB saved after forward) | "
              f"{row['median_ms']:.2f} | {row['iqr_ms']:.2f} | {ratio} | — | " + ("— | " if flops else "") + "— |")
