#!/usr/bin/env python3
"""Summarises bench/memory_bandwidth's JSON files (bench/probes/README.md): per row the median and interquartile
range of the repetitions (µs) and the bytes moved per second at the median, then the 2-thread ÷ 1-thread
ratio of the medians per kernel and residence.

  bench/probes/memory_bandwidth_summary.py bench/results/memory_bandwidth_*.json
"""
import json
import statistics
import sys
from collections import defaultdict

BYTES = 3 * 2048 * 1024 * 4  # two [2048,1024] float32 tensors read, one written
KERNELS = {0: "triad", 1: "gelu_backward", 2: "gelu_backward_in_place"}
RESIDENCE = {0: "warm", 1: "cold"}


def rows(path):
    times = defaultdict(list)
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") == "iteration":
            args = dict(part.split(":") for part in b["run_name"].split("/")[1:4])
            times[(int(args["kernel"]), int(args["cold"]), int(args["threads"]))].append(b["real_time"])
    return times


def main():
    for path in sys.argv[1:]:
        times = rows(path)
        print(f"{path} ({len(next(iter(times.values())))} repetitions a row)")
        print("| kernel | residence | 1 thread µs (IQR), GB/s | 2 threads µs (IQR), GB/s | 2 ÷ 1 |")
        print("|---|---|---|---|---|")
        for kernel in KERNELS:
            for cold in RESIDENCE:
                cells = []
                medians = []
                for threads in (1, 2):
                    v = sorted(times[(kernel, cold, threads)])
                    q = statistics.quantiles(v, n=4)
                    m = statistics.median(v)
                    medians.append(m)
                    cells.append(f"{m:.0f} ({q[0]:.0f}–{q[2]:.0f}), {BYTES / (m * 1e-6) / 1e9:.1f}")
                print(f"| {KERNELS[kernel]} | {RESIDENCE[cold]} | {cells[0]} | {cells[1]} | {medians[1] / medians[0]:.3f} |")
        print()


if __name__ == "__main__":
    main()
