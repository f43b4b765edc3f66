#!/usr/bin/env python3
"""docs/schedules.md's budget table from bench/budget_step's Google Benchmark JSON (bench/run_budget.sh).

usage: budget_summary.py budget_step.json > budget_table.md

One table per workload and thread count: each means (plain, DTR per heuristic, checkpoint_sequential, the
planner) at each budget, with the median wall time and interquartile range over the repetitions, the ratio
to the plain step's median in the same run (median and IQR computed here from the repetitions' times), the measured peak and the ops recomputed per step. A means that
cannot meet a budget shows its error. Standard library only.
"""
import json
import re
import sys

runs = json.load(open(sys.argv[1]))["benchmarks"]
NAME = re.compile(r"budget_step/(W\d)/([^/]+)/budget_([^/]+)/threads:(\d+)")

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


for (workload, threads), entries in sorted(rows.items()):
    plain = entries.get(("plain", "none"), {}).get("median")
    print(f"\n### {workload}, {threads} thread{'s' if threads > 1 else ''}\n")
    print(f"| means | budget | measured peak | median ms ({len(entries[('plain', 'none')]['times'])} repetitions) | IQR ms | × plain | recomputed ops / N | evictions |")
    print("|---|---|---|---|---|---|---|---|")
    order = ["plain", "dtr_h_DTR", "dtr_h_DTR_eq", "dtr_h_local", "checkpoint_sequential", "checkpoint_sequential_auto"]
    for (means, budget), e in sorted(entries.items(), key=lambda kv: (kv[0][1] != "none", kv[0][1], order.index(kv[0][0]))):
        label = means + (f" ({int(e['counters']['segments'])} segments)" if "counters" in e and "segments" in e["counters"] else "")
        if "error" in e:
            print(f"| {label} | {budget.replace('pct', ' %')} | — | — | — | — | — | {e['error'][:110]}… |")
            continue
        c = e["counters"]
        budget_text = "none" if budget == "none" else f"{budget.replace('pct', ' %')}: {mb(c['budget_bytes'])}"
        ratio = f"{e['median'] / plain:.2f}" if plain else "—"
        within = "" if budget == "none" else (" ≤ budget" if c["within_budget"] else " (over)")
        print(f"| {label} | {budget_text} | {mb(c['peak_bytes'])}{within} | {e['median']:.1f} | {e.get('iqr', 0):.1f} | "
              f"{ratio} | {int(c['recomputed_ops'])} / {int(c['N'])} = {c['recomputed_per_N']:.2f} | "
              f"{int(c['evictions'])} |")
