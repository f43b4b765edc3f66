#!/usr/bin/env python3
"""The W4 tables of bench/RESULTS.md §3 from bench/suites/resnet.sh's results: per row and thread count, the median
step time in ms and its interquartile range over the repetitions, and remat's saved bytes and peak (MB); then the
ResNet-104 rows, with each mode's time and peak as a ratio of plain's.

  python3 bench/resnet_summary.py resnet_step.json resnet_pytorch_threads1.json resnet_pytorch_threads2.json
"""
import json
import statistics
import sys

ROWS = [  # (row label, Google Benchmark name or ("pytorch", mode))
    ("remat, none (conv2d on oneDNN)", "remat_step/none"),
    ("remat, none (conv2d on im2col)", "remat_step/none_im2col"),
    ("remat, block (each block, nothing_saveable)", "remat_step/block"),
    ("remat, dots (each block, dots_saveable)", "remat_step/dots"),
    ("remat, sqrt (segments of ⌈√6⌉ = 3 blocks)", "remat_step/sqrt"),
    ("LibTorch 1.13 (no checkpoint in C++)", "libtorch_step"),
    ("PyTorch 1.13, plain", ("pytorch", "none")),
    ("PyTorch 1.13, each block under torch.utils.checkpoint", ("pytorch", "block")),
]


DEEP_ROWS = [
    ("none", "deep_step/none"),
    ("block (each block, nothing_saveable)", "deep_step/block"),
    ("dots (each block, dots_saveable)", "deep_step/dots"),
    ("sqrt (segments of ⌈√51⌉ = 8 blocks)", "deep_step/sqrt"),
    ("DTR budget, 50 % of plain's peak", "deep_step/budget50"),
    ("DTR budget, 25 % of plain's peak", "deep_step/budget25"),
]


def iqr(values):
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def main(gbench, *pytorch):
    runs, counters = {}, {}
    for b in json.load(open(gbench))["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        name, threads = b["run_name"].split("/process_time")[0].rsplit("/", 1)
        runs.setdefault((name, int(threads)), []).append(b["real_time"])
        counters[(name, int(threads))] = (b.get("saved_MB"), b.get("peak_MB"))
    torch_runs = {}
    for path in pytorch:
        d = json.load(open(path))
        for r in d["results"]:
            torch_runs[(r["mode"], d["threads"])] = (r["median_ms"], r["iqr_ms"])
    print("| row | 1 thread: ms (IQR) | 2 threads: ms (IQR) | saved MB | peak MB, 1 / 2 threads |")
    print("|---|---|---|---|---|")
    for label, key in ROWS:
        cells, saved, peaks = [], None, []
        for threads in (1, 2):
            if isinstance(key, tuple):
                m = torch_runs.get((key[1], threads))
                cells.append(f"{m[0]:.1f} ({m[1]:.1f})" if m else "–")
            else:
                v = runs.get((key, threads))
                cells.append(f"{statistics.median(v):.1f} ({iqr(v):.1f})" if v else "–")
                s, peak = counters.get((key, threads), (None, None))
                if s is not None:
                    saved = s
                    peaks.append(f"{peak:.2f}")
        memory = f"| {saved:.2f} | {' / '.join(peaks)} |" if saved is not None else "| – | – |"
        print(f"| {label} | {cells[0]} | {cells[1]} {memory}")
    plain = {t: statistics.median(runs[("deep_step/none", t)]) for t in (1, 2) if ("deep_step/none", t) in runs}
    if not plain:
        return
    plain_peak = counters[("deep_step/none", 2)][1]
    print()
    print("ResNet-104 (17 blocks per stage), width 16, batch 128:")
    print()
    print("| mode | 1 thread: ms (IQR), × plain | 2 threads: ms (IQR), × plain | saved MB | peak MB (× plain) |")
    print("|---|---|---|---|---|")
    for label, key in DEEP_ROWS:
        cells = []
        for threads in (1, 2):
            v = runs.get((key, threads))
            cells.append(f"{statistics.median(v):.0f} ({iqr(v):.0f}), {statistics.median(v) / plain[threads]:.2f}×"
                         if v else "–")
        saved, peak = counters.get((key, 2), (0, 0))
        print(f"| {label} | {cells[0]} | {cells[1]} | {saved:.1f} | {peak:.1f} ({peak / plain_peak:.2f}) |")


if __name__ == "__main__":
    main(*sys.argv[1:])
