#!/usr/bin/env python3
"""Paired timing of bench/step_count builds: each round runs every (label, binary, implementation) once, in a
fresh random order, and the ratio of two labels is taken within each round before the median. On a shared
machine whose speed drifts by tens of percent over minutes (bench/probes/README.md), the medians of two labels
measured apart can disagree by more than the change being measured; the per-round ratio of runs seconds apart
does not share that drift.

  bench/step_pairs.py --workload W0 --steps 2000 --rounds 30 --threads 1 \\
      old=/tmp/old/build/bench/step_count:remat new=build-bench/bench/step_count:remat \\
      hand=build-bench/bench/step_count:hand --ratio new/old --ratio new/hand

Times are wall-clock microseconds per step of the whole process (its setup included: one warm-up step and
the data), so they are for comparing builds, not for quoting as step times (bench/step_benchmark is for those).
Prints the start and end load average, each label's median and interquartile range, and each requested ratio's
median and interquartile range over the rounds. Run it on an idle machine (bench/common.sh: wait_for_idle).
"""
import argparse
import os
import random
import statistics
import subprocess
import time


def quartiles(values):
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="label=path/to/step_count:implementation (remat or hand)")
    parser.add_argument("--workload", default="W0")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ratio", action="append", default=[], help="a/b: the per-round ratio of label a to b")
    args = parser.parse_args()

    runs = {}
    for spec in args.runs:
        label, rest = spec.split("=", 1)
        binary, implementation = rest.rsplit(":", 1)
        runs[label] = (binary, implementation)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    times = {label: [] for label in runs}
    print("start", time.strftime("%H:%M:%S UTC", time.gmtime()), "load", open("/proc/loadavg").read().strip())
    for _ in range(args.rounds):
        order = list(runs)
        random.shuffle(order)
        for label in order:
            binary, implementation = runs[label]
            command = [binary, args.workload, implementation, str(args.steps), str(args.threads)]
            start = time.perf_counter()
            subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
            times[label].append((time.perf_counter() - start) * 1e6 / args.steps)
    print("end", time.strftime("%H:%M:%S UTC", time.gmtime()), "load", open("/proc/loadavg").read().strip())
    print(f"{args.workload}, {args.threads} thread(s), {args.rounds} rounds of {args.steps} steps; us per step")
    for label, values in times.items():
        low, median, high = quartiles(values)
        print(f"  {label:8s} median {median:8.1f}  IQR {low:.1f}-{high:.1f}")
    for ratio in args.ratio:
        a, b = ratio.split("/")
        per_round = [x / y for x, y in zip(times[a], times[b])]
        low, median, high = quartiles(per_round)
        print(f"  {a}/{b}: median of per-round ratios {median:.3f} (IQR {low:.3f}-{high:.3f})")


if __name__ == "__main__":
    main()
