#!/usr/bin/env python3
"""Splits a profiled benchmark's wall-clock time into GEMM and non-GEMM time (bench/probes/profile.sh).

Reads `perf script -F pid,tid,ip,dso` of a recording that holds only the timed steps (perf's --control window,
step_benchmark's REMAT_PERF_CONTROL) and the benchmark's JSON, and classifies the **calling thread's**
samples: that thread runs every step from start to end (a product's or kernel's first share of the work, the
tape's bookkeeping, the waits for the other threads), so its samples split the step's wall-clock time.
  gemm   — in OpenBLAS (the matrix products and their packing),
  wait   — in libgomp or the kernel (waiting at a team's barrier, waking threads),
  other  — everything else: remat's, Eigen's or ATen's elementwise, reduction and normalization kernels,
           the tapes' bookkeeping, the allocator.
Prints one JSON object: wall-clock median per step (ms), the shares, and ms per step of each class.
"""
import json
import re
import statistics
import sys


def classify(dso):
    if "openblas" in dso or "libblas" in dso:
        return "gemm"
    if "libgomp" in dso or "kernel.kallsyms" in dso or dso == "[unknown]":
        return "wait"
    return "other"


def main():
    script, result_json = sys.argv[1], sys.argv[2]
    counts = {"gemm": 0, "wait": 0, "other": 0}
    threads = {}
    line_re = re.compile(r"^\s*(\d+)/(\d+)\s+[0-9a-f]+\s+\((.*)\)\s*$")
    for line in open(script):
        m = line_re.match(line)
        if not m:
            continue
        pid, tid, dso = int(m.group(1)), int(m.group(2)), m.group(3)
        threads[tid] = threads.get(tid, 0) + 1
        if pid == tid:
            counts[classify(dso)] += 1
    runs = json.load(open(result_json))["benchmarks"]
    times = [b["real_time"] for b in runs if b.get("run_type") == "iteration"]
    wall = statistics.median(times)
    total = sum(counts.values()) or 1
    out = {"wall_ms": wall, "main_thread_samples": total, "samples_per_thread": sorted(threads.values(), reverse=True)}
    for k, v in counts.items():
        out[k + "_share"] = v / total
        out[k + "_ms"] = wall * v / total
    print(json.dumps(out))


if __name__ == "__main__":
    main()
