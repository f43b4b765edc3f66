#!/usr/bin/env python3
"""Reads the targets of issue 11 (threads) off one bench/run.sh run: the 2-thread speedups, the ratios to
LibTorch, hand-written and PyTorch at 1 and 2 threads, each with its interquartile range, and (when
bench/profile.sh ran) the non-GEMM part of the W2 step. Prints a Markdown table.

  bench/issue11_targets.py bench/results/run_tuned.json [--pytorch-w3 gpt_pytorch_threads2.json]
                           [--profile bench/results/profile.jsonl]
"""
import argparse
import json
import statistics


def quartiles(xs):
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], statistics.median(xs), q[2]


def load(path):
    runs = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") != "iteration" or b.get("error_occurred"):
            continue
        name = b["run_name"] if "run_name" in b else b["name"]
        runs.setdefault(name, []).append(b["real_time"])
    return runs


def key(workload, impl, threads):
    return f"Step<{workload}, {impl}>/threads:{threads}/real_time"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run")
    p.add_argument("--pytorch-w3", nargs="*", default=[])
    p.add_argument("--profile")
    a = p.parse_args()
    runs = load(a.run)

    def med(w, i, t):
        return quartiles(runs[key(w, i, t)])

    def fmt(q):
        return f"{q[1]:.3g} ms (IQR {q[0]:.3g}–{q[2]:.3g})"

    rows = []

    def ratio(label, limit, num, den):
        r = num[1] / den[1]
        verdict = "—" if limit is None else ("met" if r <= limit else "missed")
        rows.append((label, "—" if limit is None else f"≤ {limit}", f"{r:.3f}", verdict, f"{fmt(num)} ÷ {fmt(den)}"))

    def speedup(label, limit, w, i):
        one, two = med(w, i, 1), med(w, i, 2)
        s = one[1] / two[1]
        rows.append((label, f"≥ {limit}", f"{s:.3f}", "met" if s >= limit else "missed", f"{fmt(one)} → {fmt(two)}"))

    speedup("W2 plain, 2-thread speedup", 1.85, "W2", "RematPlain")
    speedup("W1 plain, 2-thread speedup", 1.90, "W1", "RematPlain")
    for t in (1, 2):
        # The LibTorch targets are for 2 threads; the 1-thread ratios are shown beside them.
        ratio(f"W2 plain ÷ LibTorch, {t} thread(s)", 0.70 if t == 2 else None, med("W2", "RematPlain", t),
              med("W2", "LibTorch", t))
        ratio(f"W1 plain ÷ LibTorch, {t} thread(s)", 0.85 if t == 2 else None, med("W1", "RematPlain", t),
              med("W1", "LibTorch", t))
        ratio(f"W0 plain ÷ hand-written, {t} thread(s)", 1.10, med("W0", "RematPlain", t), med("W0", "HandWritten", t))
        if key("W0", "RematCaptured", t) in runs:  # the same step recorded once, replayed (remat::CapturedStep)
            ratio(f"W0 captured ÷ hand-written, {t} thread(s)", 1.10, med("W0", "RematCaptured", t),
                  med("W0", "HandWritten", t))
    if key("W3", "LibTorch", 2) not in runs:
        a.pytorch_w3 = None
    libtorch_w3 = med("W3", "LibTorch", 2) if a.pytorch_w3 is not None else None
    fastest = libtorch_w3
    for path in a.pytorch_w3 or []:
        for r in json.load(open(path)):
            if r["variant"] == "plain" and r["threads"] == 2:
                q = (1e3 * r["q1_s"], 1e3 * r["median_s"], 1e3 * r["q3_s"])
                if q[1] < fastest[1]:
                    fastest = q
    if fastest is not None:
        ratio("W3 plain ÷ faster of LibTorch and PyTorch, 2 threads", 1.00, med("W3", "RematNone", 2), fastest)
    if a.profile:
        split = {}
        for line in open(a.profile):
            r = json.loads(line)
            split[(r["workload"], r["impl"], r["threads"])] = r["split"]
        one, two = split.get(("W2", "RematPlain", 1)), split.get(("W2", "RematPlain", 2))
        if one and two:
            n1, n2 = one["other_ms"] + one["wait_ms"], two["other_ms"] + two["wait_ms"]
            r = n2 / n1
            rows.append(("W2 plain non-GEMM time, 2 ÷ 1 threads", "≤ 0.55", f"{r:.3f}", "met" if r <= 0.55 else "missed",
                         f"{n1:.0f} ms → {n2:.0f} ms (profile run, calling thread outside OpenBLAS)"))
    print("| workload | implementation | 1 thread ms (IQR) | 2 threads ms (IQR) | speedup |")
    print("|---|---|---|---|---|")
    names = sorted({n.split("/")[0] for n in runs})
    for name in names:
        w, impl = name[len("Step<"):-1].split(", ")
        if key(w, impl, 1) in runs and key(w, impl, 2) in runs:
            one, two = med(w, impl, 1), med(w, impl, 2)
            print(f"| {w} | {impl} | {one[1]:.4g} ({one[0]:.4g}–{one[2]:.4g}) | {two[1]:.4g} ({two[0]:.4g}–{two[2]:.4g}) "
                  f"| {one[1] / two[1]:.3f} |")
    print()
    print("| target | limit | measured | verdict | from (medians, interquartile range) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
