#!/usr/bin/env python3
"""Markdown tables of bench/suites/distributed.sh's results (bench/RESULTS.md §9, docs/distributed.md §Performance).

usage: distributed_summary.py RESULTS_DIR > distributed_summary.md

Reads distributed_w1_<config>.json (Google Benchmark: the median and interquartile range over the
repetitions) and the --json lines of distributed_mlp_<config>_<round>.txt (the MLP example's first epoch with
--timing; medians over the rounds). Standard library only.
"""
import glob
import json
import os
import sys

RESULTS = sys.argv[1]
CONFIGS = {"r1t1": "1 rank × 1 thread", "r1t2": "1 rank × 2 threads", "r2t1": "2 ranks × 1 thread",
           "r2t1_ring": "2 ranks × 1 thread, ring forced"}


def fmt(value, scale=1.0, digits=2):
    return "–" if value is None else f"{value * scale:.{digits}f}"


def w1_rows():
    rows = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "distributed_w1_*.json"))):
        config = os.path.basename(path)[len("distributed_w1_"):-len(".json")]
        aggregates = {}
        for b in json.load(open(path))["benchmarks"]:
            if b.get("run_type") == "aggregate":
                aggregates.setdefault(b["run_name"], {})[b["aggregate_name"]] = b
        for run_name, a in sorted(aggregates.items()):
            median, iqr = a.get("median", {}), a.get("iqr", {})
            variant = "reducer" if "/reducer" in run_name else "plain"
            rows.append(f"| {CONFIGS.get(config, config)} | {variant} | {fmt(median.get('real_time'))} | "
                        f"{fmt(iqr.get('real_time'))} | {median.get('repetitions', '–')} | "
                        f"{fmt(median.get('backward_ms'))} | {fmt(median.get('busy_ms'))} | "
                        f"{fmt(median.get('hidden_fraction'), 100, 1)} | {fmt(median.get('exposed_wait_ms'))} | "
                        f"{fmt(median.get('resolution_ms'))} | {fmt(median.get('bytes_per_step'), 1e-6)} |")
    return rows


def median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def mlp_rows():
    """One row per configuration: medians over the rounds (distributed_mlp_<config>_<round>.txt)."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "distributed_mlp_*.txt"))):
        config = os.path.basename(path)[len("distributed_mlp_"):-len(".txt")].rsplit("_", 1)[0]
        lines = [line for line in open(path) if line.startswith('{"epochs"')]
        if not lines:
            raise SystemExit(f"{path}: no --json line (the run failed; see the file)")
        runs.setdefault(config, []).append(json.loads(lines[-1]))
    rows = []
    for config, ds in sorted(runs.items()):
        timings = [(d.get("timing") or [{}])[0] for d in ds]
        base = config.replace("_plain", "")
        label = CONFIGS.get(base, base) + (", no MPI" if config.endswith("_plain") else ", --distributed")
        reduced = timings[0].get("reduced_steps", 0) > 0

        def med(key, scale=1.0, digits=2, when=True):
            return fmt(median(t.get(key) for t in timings), scale, digits) if when else "–"

        epochs = [d["seconds_per_epoch"] for d in ds]
        accuracies = sorted({f"{100 * d.get('test_accuracy', 0):.2f}" for d in ds})
        rows.append(f"| {label} | {len(ds)} | {fmt(median(epochs))} | {fmt(min(epochs))}–{fmt(max(epochs))} | "
                    f"{med('step_seconds', 1e3)} | {med('backward_seconds', 1e3)} | "
                    f"{med('busy_seconds', 1e3, when=reduced)} | {med('hidden_fraction', 100, 1, reduced)} | "
                    f"{med('exposed_wait_seconds', 1e3, when=reduced)} | {med('bytes_per_step', 1e-6, when=reduced)} | "
                    f"{', '.join(accuracies)} |")
    return rows


print("## W1 step (bench/distributed_step.cpp), global batch 512\n")
print("| configuration | reducer | median ms/step | IQR ms | repetitions | backward ms | all-reduce busy ms | "
      "hidden % | exposed wait ms | completion resolution ms | MB reduced/step |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(w1_rows()))
print("\n## MLP example, first epoch (--timing), medians over the rounds\n")
print("| configuration | rounds | s/epoch | range s | ms/step | backward ms | all-reduce busy ms | hidden % | "
      "exposed wait ms | MB reduced/step | test accuracy % |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
print("\n".join(mlp_rows()))
