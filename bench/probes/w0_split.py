#!/usr/bin/env python3
"""Sums bench/probes/w0_split.sh's `perf report` tables (samples by symbol, cpu-clock at 4999 Hz) into microseconds
per step per category, for each run and as the median over runs, remat beside the hand-written code.

  bench/probes/w0_split.py <steps> bench/results/w0_split/*.txt
"""
import re
import statistics
import sys
from collections import defaultdict

HZ = 4999
CATEGORIES = ("matrix products", "zero fills", "elementwise kernels", "tape bookkeeping", "step driver", "other")


def category(symbol):
    s = symbol
    if re.search(r"sgemm|gemm_|blas_memory|generic_product_impl|evaluateProductBlockingSizes|Product<", s):
        return "matrix products"
    if "memset" in s or "zero_for_product" in s:
        return "zero fills"
    if re.search(r"Op::(forward|backward)|Op>::(forward|backward)|assign_or_add|add_grad|column_sums|"
                 r"bench::HandChain|bench::HandMlp|cross_entropy_forward|cross_entropy_backward|"
                 r"__expf|__logf|expf@|logf@|tanh", s):
        return "elementwise kernels"
    if "remat::" in s:
        return "tape bookkeeping"
    if "run<bench::" in s:  # step_count's loop, with the model's step inlined (remat: its tape.variable() calls)
        return "step driver"
    return "other"


def read(path):
    header = open(path).readline()
    impl = header.split()[2].rstrip(",")
    totals = defaultdict(float)
    for line in open(path):
        if line.startswith("#"):
            continue
        m = re.match(r"\s*(\d+)\s+\[[.k]\]\s+(.*)", line)
        if m:
            totals[category(m.group(2))] += int(m.group(1))
    return impl, header.strip(), totals


def main():
    steps = int(sys.argv[1])
    runs = defaultdict(list)
    for path in sys.argv[2:]:
        impl, header, totals = read(path)
        us = {c: totals[c] / HZ / steps * 1e6 for c in CATEGORIES}
        us["step"] = sum(us.values())
        runs[impl].append(us)
        print(header)
    print()
    print("| category | remat µs per step, median (runs) | hand-written µs per step, median (runs) | remat − hand |")
    print("|---|---|---|---|")
    for c in CATEGORIES + ("step",):
        med = {i: statistics.median(r[c] for r in runs[i]) for i in ("remat", "hand")}
        each = {i: ", ".join(f"{r[c]:.1f}" for r in runs[i]) for i in ("remat", "hand")}
        print(f"| {c} | {med['remat']:.1f} ({each['remat']}) | {med['hand']:.1f} ({each['hand']}) "
              f"| {med['remat'] - med['hand']:+.1f} |")


if __name__ == "__main__":
    main()
