#!/usr/bin/python3
"""Turns a step_benchmark run (--benchmark_format=json or --benchmark_out=FILE) into a CSV, a Markdown table
of medians and ratios, a W3 table (remat's recompute modes beside LibTorch and the PyTorch GPT peer), and a
PNG of memory saved vs time overhead per policy on W2.

  /usr/bin/python3 bench/plot_results.py run.json [--pytorch pytorch_1.json pytorch_2.json]
      [--pytorch-w3 gpt_pytorch_1.json gpt_pytorch_2.json]
      [--csv bench/results.csv] [--markdown bench/results_table.md] [--png bench/w2_memory_vs_time.png]

Medians: the "median" aggregate of --benchmark_repetitions when present, else the median of the
repeated runs of the same name. Ratios are taken within the run (same binary, same moment).
"""
import argparse
import csv
import json
import re
import statistics
from collections import defaultdict

NAME = re.compile(r"Step<(?P<workload>\w+), (?P<implementation>\w+)>/threads:(?P<threads>\d+)")
WORKLOAD_NAMES = {"W0": "W0", "W1": "W1", "W1Small": "W1-small", "W2": "W2", "W3": "W3"}
POLICY_OF = {
    "RematPlain": "plain",
    "RematNothingSaveable": "nothing_saveable",
    "RematDotsSaveable": "dots_saveable",
    "RematEverythingSaveable": "everything_saveable",
    "RematSequential": "sequential_sqrt",
    "RematSegments4NothingSaveable": "segments4_nothing_saveable",
    "RematSegments4DotsSaveable": "segments4_dots_saveable",
}
# W3's remat benchmarks (bench/step_benchmark.cpp) and the recompute mode each runs (docs/gpt.md).
W3_MODE_OF = {
    "RematNone": "none",
    "RematBlock": "block",
    "RematAttention": "attention (selective)",
    "RematDotsNoBatch": "dots_no_batch",
    "RematSqrt": "sqrt (round(√L) segments)",
    "RematNoneFused": "none, fused attention",
    "RematBlockFused": "block, fused attention",
    "LibTorch": "plain (C++ API, no checkpoint)",
}
# The baseline of the "÷ remat plain" ratio: W3's is its none mode.
PLAIN_OF = {"W3": "RematNone"}
# The hand-written baseline doing the same recomputation as each remat variant.
HAND_OF = {"RematSequential": "HandWrittenSequential", "RematSegments4NothingSaveable": "HandWrittenSegments4"}
ORDER = ["HandWritten", "HandWrittenSequential", "HandWrittenSegments4", "LibTorch", "RematPlain", "RematCaptured",
         "RematNothingSaveable", "RematDotsSaveable", "RematEverythingSaveable", "RematSequential",
         "RematSegments4NothingSaveable", "RematSegments4DotsSaveable", "RematNone", "RematBlock", "RematAttention",
         "RematDotsNoBatch", "RematSqrt", "RematNoneFused", "RematBlockFused"]


def load(path):
    with open(path) as f:
        doc = json.load(f)
    runs = defaultdict(list)
    medians = {}
    failed = {}
    for b in doc["benchmarks"]:
        m = NAME.match(b.get("run_name", b["name"]))
        if not m:
            continue
        if b.get("error_occurred"):
            # A failed correctness check: no row, but say so (a missing row must not pass unnoticed).
            failed[b.get("run_name", b["name"])] = b.get("error_message", "")
            continue
        key = (WORKLOAD_NAMES[m["workload"]], m["implementation"], int(m["threads"]))
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[key] = b
        else:
            runs[key].append(b)
    rows = {}
    for key in set(runs) | set(medians):
        src = medians.get(key)
        reps = runs.get(key, [])
        if src is None:
            src = dict(reps[0])
            src["real_time"] = statistics.median(r["real_time"] for r in reps)
            src["cpu_time"] = statistics.median(r["cpu_time"] for r in reps)
        counters = reps[0] if reps else src  # byte counters are identical across repetitions
        scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[src.get("time_unit", "ns")]
        times = sorted(r["real_time"] * scale for r in reps) if reps else [src["real_time"] * scale]
        quartiles = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
        rows[key] = dict(workload=key[0], implementation=key[1], threads=key[2],
                         median_ms=src["real_time"] * scale, cpu_ms=src["cpu_time"] * scale,
                         q1_ms=quartiles[0], q3_ms=quartiles[2],
                         repetitions=max(1, len(reps)),
                         saved_bytes=counters.get("saved_bytes"), peak_bytes=counters.get("peak_bytes"),
                         replayed_bytes=counters.get("replayed_bytes"),
                         flops_per_step=counters.get("flops_per_step"),
                         gflops=(counters.get("flops_per_step") or 0) / (src["real_time"] * scale * 1e6),
                         gradient_error=counters.get("gradient_error"), loss_error=counters.get("loss_error"),
                         bitwise_equal_to_none=counters.get("bitwise_equal_to_none"),
                         saved_bytes_formula=counters.get("saved_bytes_formula"))
    return doc.get("context", {}), rows, failed


def ratio(rows, a, b):
    if a in rows and b in rows:
        return rows[a]["median_ms"] / rows[b]["median_ms"]
    return None


def fmt(x, digits=3):
    return "—" if x is None else f"{x:.{digits}f}"


def mib(x):
    return "—" if x is None else f"{x / 2**20:.2f}"


def w3_table(rows, pytorch_w3):
    """W3: every remat mode, LibTorch and the PyTorch peer's variants, per thread count."""
    lines = ["| threads | implementation | mode | median ms | IQR ms | ÷ remat none | saved MiB | peak MiB "
             "| replayed MiB | GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    threads = sorted({k[2] for k in rows if k[0] == "W3"} | {k[1] for k in pytorch_w3})
    for th in threads:
        none = rows.get(("W3", "RematNone", th))
        for impl in W3_MODE_OF:  # remat's modes, then LibTorch
            r = rows.get(("W3", impl, th))
            if not r:
                continue
            name = "LibTorch 1.13" if impl == "LibTorch" else "remat"
            lines.append(f"| {th} | {name} | {W3_MODE_OF.get(impl, impl)} | {r['median_ms']:.1f} | "
                         f"{r['q1_ms']:.1f}–{r['q3_ms']:.1f} | {fmt(ratio(rows, ('W3', impl, th), ('W3', 'RematNone', th)))} | "
                         f"{mib(r['saved_bytes'])} | {mib(r['peak_bytes'])} | {mib(r['replayed_bytes'])} | "
                         f"{r['gflops']:.1f} |")
        for (variant, t), p in sorted(pytorch_w3.items(), key=lambda kv: kv[0][1]):
            if t != th:
                continue
            ms = p["median_s"] * 1e3
            across = f"{ms / none['median_ms']:.3f}†" if none else "—"
            peak = mib(p.get("peak_bytes"))
            lines.append(f"| {th} | PyTorch 1.13 (peer) | {variant} | {ms:.1f} | {p['q1_s'] * 1e3:.1f}–{p['q3_s'] * 1e3:.1f} | "
                         f"{across} | {mib(p['saved_bytes'])} | {peak} | — | {p['gflops_per_s']:.1f} |")
    lines += ["",
              "W3: B 4 × S 512 tokens, H 256, 4 heads, 4 blocks, V 256, float32, no dropout; a step is loss + all "
              "gradients. GFLOP/s = 3 × the hand-counted forward FLOPs (bench/workloads.hpp, forward_flops) ÷ median "
              "step time; recomputation is not counted. remat's saved MiB is the tape after the forward pass (equal "
              "to examples/gpt/memory_formula.hpp, checked by the benchmark), peak MiB the tape's peak over the step, "
              "replayed MiB what checkpoint replay recomputed. LibTorch exposes no byte counts. The PyTorch peer "
              "(bench/peers/gpt_pytorch.py) counts saved tensors through saved_tensors_hooks and its peak from the "
              "profiler's allocator events; † it is a different process, not interleaved with the C++ run, so its "
              "ratio to remat none is across runs. PyTorch's variants: block = every block under checkpoint, "
              "selective = the attention core under checkpoint, sdpa = F.scaled_dot_product_attention (torch ≥ 2.0 "
              "only)."]
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run")
    p.add_argument("--pytorch", nargs="*", default=[], help="JSON files written by peers/pytorch_checkpoint.py --json")
    p.add_argument("--pytorch-w3", nargs="*", default=[], help="JSON files written by peers/gpt_pytorch.py --json")
    p.add_argument("--csv", default="bench/results.csv")
    p.add_argument("--markdown", default=None)
    p.add_argument("--png", default="bench/w2_memory_vs_time.png")
    args = p.parse_args()
    context, rows, failed = load(args.run)

    fields = ["workload", "implementation", "threads", "median_ms", "q1_ms", "q3_ms", "cpu_ms", "repetitions", "saved_bytes",
              "peak_bytes", "replayed_bytes", "flops_per_step", "gflops", "gradient_error",
              "loss_error", "bitwise_equal_to_none", "saved_bytes_formula",
              "ratio_to_hand_written", "ratio_to_libtorch", "ratio_to_remat_plain"]
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for key in sorted(rows, key=lambda k: (list(WORKLOAD_NAMES.values()).index(k[0]), k[2], ORDER.index(k[1]))):
            r = dict(rows[key])
            wl, impl, th = key
            hand = HAND_OF.get(impl, "HandWritten")
            r["ratio_to_hand_written"] = ratio(rows, key, (wl, hand, th))
            r["ratio_to_libtorch"] = ratio(rows, key, (wl, "LibTorch", th))
            r["ratio_to_remat_plain"] = ratio(rows, key, (wl, PLAIN_OF.get(wl, "RematPlain"), th))
            w.writerow(r)

    pytorch = {}
    for path in args.pytorch:
        with open(path) as f:
            for r in json.load(f):
                pytorch[(r["workload"], r["variant"], r["threads"])] = r

    def cpu_ratio(a, b):
        if a in rows and b in rows and a[2] == 1:
            return rows[a]["cpu_ms"] / rows[b]["cpu_ms"]
        return None

    lines = ["| workload | threads | implementation | median ms | IQR ms | GFLOP/s | ÷ hand-written | ÷ LibTorch | ÷ remat plain "
             "| main-thread CPU ms | CPU ÷ hand | CPU ÷ LibTorch | CPU ÷ plain | saved MiB | peak MiB | replayed MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(rows, key=lambda k: (list(WORKLOAD_NAMES.values()).index(k[0]), k[2], ORDER.index(k[1]))):
        r = rows[key]
        wl, impl, th = key
        hand = HAND_OF.get(impl, "HandWritten")
        lines.append(f"| {wl} | {th} | {impl} | {r['median_ms']:.3f} | {r['q1_ms']:.3f}–{r['q3_ms']:.3f} | "
                     f"{r['gflops']:.1f} | "
                     f"{fmt(ratio(rows, key, (wl, hand, th)))} | {fmt(ratio(rows, key, (wl, 'LibTorch', th)))} | "
                     f"{fmt(ratio(rows, key, (wl, PLAIN_OF.get(wl, 'RematPlain'), th)))} | {r['cpu_ms']:.3f} | "
                     f"{fmt(cpu_ratio(key, (wl, hand, th)))} | {fmt(cpu_ratio(key, (wl, 'LibTorch', th)))} | "
                     f"{fmt(cpu_ratio(key, (wl, PLAIN_OF.get(wl, 'RematPlain'), th)))} | {mib(r['saved_bytes'])} | "
                     f"{mib(r['peak_bytes'])} | {mib(r['replayed_bytes'])} |")
    if pytorch:
        lines += ["", "| workload | threads | PyTorch variant | median ms | ÷ PyTorch plain | saved MiB |",
                  "|---|---|---|---|---|---|"]
        for (wl, variant, th), r in sorted(pytorch.items(), key=lambda kv: (list(WORKLOAD_NAMES.values()).index(kv[0][0]), kv[0][2])):
            lines.append(f"| {wl} | {th} | {variant} | {r['median_ms']:.3f} | {r['ratio_to_plain']:.3f} | "
                         f"{r['saved_bytes'] / 2**20:.2f} |")
    targets = [
        ("W1 plain ÷ hand-written", "W1", "RematPlain", "HandWritten", 1.10),
        ("W1 plain ÷ LibTorch", "W1", "RematPlain", "LibTorch", 1.00),
        ("W1-small plain ÷ hand-written", "W1-small", "RematPlain", "HandWritten", 1.15),
        ("W0 plain ÷ hand-written", "W0", "RematPlain", "HandWritten", 1.50),
        ("W1 nothing_saveable ÷ plain", "W1", "RematNothingSaveable", "RematPlain", 1.34),
        ("W1 dots_saveable ÷ plain", "W1", "RematDotsSaveable", "RematPlain", 1.05),
        ("W2 nothing_saveable ÷ plain", "W2", "RematNothingSaveable", "RematPlain", None),
        ("W2 dots_saveable ÷ plain", "W2", "RematDotsSaveable", "RematPlain", None),
        ("W2 sequential √L ÷ hand-written sequential", "W2", "RematSequential", "HandWrittenSequential", None),
        ("W1 4 segments nothing_saveable ÷ hand-written 4 segments", "W1", "RematSegments4NothingSaveable",
         "HandWrittenSegments4", None),
        ("W1 4 segments nothing_saveable ÷ plain", "W1", "RematSegments4NothingSaveable", "RematPlain", None),
        ("W1 4 segments dots_saveable ÷ plain", "W1", "RematSegments4DotsSaveable", "RematPlain", None),
        ("W2 4 segments nothing_saveable ÷ hand-written 4 segments", "W2", "RematSegments4NothingSaveable",
         "HandWrittenSegments4", None),
        ("W2 4 segments nothing_saveable ÷ plain", "W2", "RematSegments4NothingSaveable", "RematPlain", None),
        ("W2 4 segments dots_saveable ÷ plain", "W2", "RematSegments4DotsSaveable", "RematPlain", None),
    ]
    lines += ["", "| target | limit | 1 thread, wall | 1 thread, main-thread CPU | 2 threads, wall |", "|---|---|---|---|---|"]
    for label, wl, a, b, limit in targets:
        one = ratio(rows, (wl, a, 1), (wl, b, 1))
        cpu = cpu_ratio((wl, a, 1), (wl, b, 1))
        two = ratio(rows, (wl, a, 2), (wl, b, 2))
        lines.append(f"| {label} | {'≤ ' + format(limit, '.2f') if limit else '—'} | {fmt(one)} | {fmt(cpu)} | {fmt(two)} |")
    pytorch_w3 = {}
    for path in args.pytorch_w3:
        with open(path) as f:
            for r in json.load(f):
                if r["workload"] == "W3":
                    pytorch_w3[(r["variant"], r["threads"])] = r
    if any(k[0] == "W3" for k in rows) or pytorch_w3:
        lines += ["", "### W3", ""] + w3_table(rows, pytorch_w3)
    if failed:
        lines += ["", "Benchmarks that failed their correctness check (no row above):", ""]
        lines += [f"- `{name}`: {message}" for name, message in sorted(failed.items())]
    table = "\n".join(lines) + "\n"
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    print(table)

    if not any(k[0] == "W2" for k in rows):
        print(f"wrote {args.csv} (no W2 in this run: no plot)")
        return
    try:
        import matplotlib
    except ImportError:
        print(f"wrote {args.csv}; no plot: matplotlib is missing (apt-get install python3-matplotlib)")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    # Under load the main thread's CPU time is the steadier figure at 1 thread (all work is on it);
    # at 2 threads only wall time measures the step. Colour = policy, marker = measure.
    fig, ax = plt.subplots(figsize=(10, 5.5))
    colours = dict(zip(POLICY_OF.values(), ["tab:gray", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:olive"]))
    for th, marker, measure in ((1, "o", "cpu_ms"), (2, "s", "median_ms")):
        plain = rows.get(("W2", "RematPlain", th))
        if not plain:
            continue
        for impl, policy in POLICY_OF.items():
            r = rows.get(("W2", impl, th))
            if not r:
                continue
            x = r[measure] / plain[measure]
            y = (plain["saved_bytes"] - r["saved_bytes"]) / 2**20
            what = "1 thread, main-thread CPU" if th == 1 else "2 threads, wall"
            ax.scatter(x, y, marker=marker, s=70, color=colours[policy], label=f"remat {policy} ({what})")
    for th, marker in ((1, "x"), (2, "+")):
        plain_pt = pytorch.get(("W2", "plain", th))
        for variant, colour in (("checkpoint_per_layer", "tab:orange"), ("checkpoint_sequential", "tab:purple")):
            r = pytorch.get(("W2", variant, th))
            if r and plain_pt:
                ax.scatter(r["ratio_to_plain"], (plain_pt["saved_bytes"] - r["saved_bytes"]) / 2**20, marker=marker,
                           s=90, color=colour, label=f"PyTorch 1.13 {variant} ({th} thread{'s' if th > 1 else ''}, wall)")
    ax.axvline(1.0, color="black", lw=0.5)
    ax.set_xlabel("step time ÷ plain step time of the same implementation")
    ax.set_ylabel("bytes saved for backward, freed vs plain (MiB)")
    ax.set_title("W2 (8 pre-norm MLP blocks, 2048×256, float32): memory saved vs time overhead")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"wrote {args.csv} and {args.png}")


if __name__ == "__main__":
    main()
