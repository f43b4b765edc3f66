#!/usr/bin/python3
"""The table and plot of compressed residuals (bench/RESULTS.md §6, docs/compression.md) from
bench/suites/compression.sh's compression_step JSON: per workload and policy, the median step time in ms and its
interquartile range at 1 and 2 threads, the time as a multiple of the plain step's, the saved bytes after the
forward pass and the step's peak (MB, 10^6 bytes); and a PNG of each workload's peak (as a fraction of plain's)
against its time (as a multiple of plain's) at 2 threads.

  /usr/bin/python3 bench/compression_summary.py compression_step.json [--png compression_memory_vs_time.png]
"""
import argparse
import json
import statistics


def iqr(values):
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json")
    parser.add_argument("--png")
    args = parser.parse_args()
    runs, counters, order = {}, {}, []
    for b in json.load(open(args.json))["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        name, threads = b["run_name"].split("/real_time")[0].rsplit("/", 1)
        key = (name, int(threads))
        if name not in order:
            order.append(name)
        runs.setdefault(key, []).append(b["real_time"])
        counters[key] = (b["saved_MB"], b["peak_MB"])
    rank = ["plain", "nothing_saveable", "dots_saveable", "dots_no_batch", "bf16", "int8_64", "int8_64_linear_bf16"]
    order.sort(key=lambda name: (name.split("/", 1)[0], rank.index(name.split("/", 1)[1])))
    print("| workload | policy | 1 thread: ms (IQR), × plain | 2 threads: ms (IQR), × plain | saved MB | peak MB |")
    print("|---|---|---|---|---|---|")
    points = {}
    for name in order:
        workload, policy = name.split("/", 1)
        cells = []
        for threads in (1, 2):
            v, plain = runs.get((name, threads)), runs.get((workload + "/plain", threads))
            if not v or not plain:
                cells.append("–")
                continue
            ratio = statistics.median(v) / statistics.median(plain)
            cells.append(f"{statistics.median(v):.1f} ({iqr(v):.1f}), {ratio:.2f}×")
            if threads == 2:
                peak_ratio = counters[(name, 2)][1] / counters[(workload + "/plain", 2)][1]
                points.setdefault(workload, []).append((policy, ratio, peak_ratio))
        saved, peak = counters[(name, 2)]
        print(f"| {workload} | {policy} | {cells[0]} | {cells[1]} | {saved:.2f} | {peak:.2f} |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(points), figsize=(5 * len(points), 4), squeeze=False)
        for ax, (workload, pts) in zip(axes[0], points.items()):
            for policy, time_ratio, peak_ratio in pts:
                compressed = policy.startswith(("bf16", "int8"))
                ax.scatter(time_ratio, peak_ratio, marker="o" if compressed else "s",
                           color="tab:red" if compressed else "tab:blue")
                ax.annotate(policy, (time_ratio, peak_ratio), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.set_title(f"{workload}, 2 threads")
            ax.set_xlabel("step time / plain")
            ax.set_ylabel("peak / plain")
            ax.grid(alpha=0.3)
        fig.suptitle("Compressed residuals (red) beside recompute-only policies (blue)")
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
