#!/usr/bin/env python3
"""Writes bench/RESULTS.md, the current benchmark table, from the results bench/run.sh leaves in bench/results.

  python3 bench/summarize.py bench/results > bench/RESULTS.md
  python3 bench/summarize.py --environment [build-dir] > bench/results/environment.md   (run.sh does this first)

Each suite's section comes from its raw results (Google Benchmark JSON, the PyTorch peers' JSON, the examples' JSON
lines) through the suite's own summarizer; the header names the machine and software (recorded when the run
started) and, per suite, the commit, the time and the load average at its start and end.
"""
import argparse
import csv
import json
import os
import platform
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def package_version(name):
    return sh("dpkg-query", "-W", "-f=${Version}", name) or "not installed"


def environment(build):
    """The machine and the software a run uses, as a Markdown table (recorded at the start of bench/run.sh)."""
    lscpu = sh("lscpu")
    cpu = re.search(r"Model name:\s*(.*)", lscpu)
    family = re.search(r"CPU family:\s*(\d+)", lscpu)
    model = re.search(r"Model:\s*(\d+)", lscpu)
    with open("/proc/meminfo") as f:
        mem_kb = int(re.search(r"MemTotal:\s*(\d+)", f.read()).group(1))
    compiler = "c++"
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        with open(cache) as f:
            m = re.search(r"CMAKE_CXX_COMPILER:\w+=(.*)", f.read())
            if m:
                compiler = m.group(1)
    kernels = sh("bash", "-c", f"source {HERE}/common.sh && echo $openblas_coretype") or "OpenBLAS's own choice"
    rows = [
        ("CPU", f"{cpu.group(1) if cpu else platform.processor()} (family {family.group(1) if family else '?'}, "
                f"model {model.group(1) if model else '?'}), {os.cpu_count()} logical cores"),
        ("memory", f"{mem_kb / 2**20:.1f} GiB"),
        ("system", sh("bash", "-c", ". /etc/os-release && echo $PRETTY_NAME") + ", Linux " + platform.release()),
        ("compiler", (sh(compiler, "--version").splitlines() or ["?"])[0] + "; Release, -O3 -march=native"),
        ("Eigen", package_version("libeigen3-dev")),
        ("OpenBLAS (OpenMP build)", f"{package_version('libopenblas0-openmp')}, kernels: {kernels}"),
        ("oneDNN", package_version("libdnnl-dev")),
        ("LibTorch / PyTorch", f"{package_version('libtorch-dev')} / {package_version('python3-torch')}"),
        ("Open MPI", package_version("openmpi-bin")),
        ("Google Benchmark", package_version("libbenchmark-dev")),
    ]
    return "\n".join(["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows])


def read(path):
    with open(path) as f:
        return f.read()


def meta(results, suite):
    """commit, started, ended and repetitions of one suite's last run (bench/run.sh writes <suite>.meta)."""
    path = os.path.join(results, suite + ".meta")
    if not os.path.exists(path):
        return None
    m = {}
    for line in read(path).splitlines():
        key, _, value = line.partition(" ")
        m[key] = value
    return m


def loads(results, names):
    """The 1-minute load average at the first and the last `uptime` line of a suite's .uptime files."""
    lines = []
    for name in names:
        path = os.path.join(results, name + ".uptime")
        if os.path.exists(path):
            lines += read(path).splitlines()
    found = [re.search(r"load average: ([\d.]+)", l) for l in lines]
    found = [f.group(1) for f in found if f]
    return (found[0], found[-1]) if found else ("?", "?")


def run(*cmd):
    out = subprocess.run([sys.executable] + list(cmd), capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        return f"(the summarizer failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else '?'})"
    # A suite's own headings sit under its numbered section.
    return re.sub(r"^#+ ", "### ", out.stdout.strip(), flags=re.M)


def steps(results):
    r = lambda name: os.path.join(results, name)
    # plot_results.py writes the table, the CSV and the plot together.
    out = subprocess.run([sys.executable, os.path.join(HERE, "plot_results.py"), r("steps.json"),
                          "--pytorch", r("steps_pytorch_threads1.json"), r("steps_pytorch_threads2.json"),
                          "--pytorch-w3", r("steps_gpt_pytorch_threads1.json"), r("steps_gpt_pytorch_threads2.json"),
                          "--csv", r("steps.csv"), "--markdown", r("steps_table.md"),
                          "--png", os.path.join(HERE, "w2_memory_vs_time.png")],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        return "(plot_results.py failed)"
    return read(r("steps_table.md")).strip() + "\n\n![W2: peak against step time](w2_memory_vs_time.png)"


def headline(results):
    """remat's plain step beside hand-written Eigen, LibTorch and PyTorch for W0–W4, 1 and 2 threads."""
    rows = {}
    path = os.path.join(results, "steps.csv")
    if os.path.exists(path):
        with open(path) as f:
            for r in csv.DictReader(f):
                rows[(r["workload"], r["implementation"], int(r["threads"]))] = float(r["median_ms"])
    pytorch = {}
    for t in (1, 2):
        for name in (f"steps_pytorch_threads{t}.json", f"steps_gpt_pytorch_threads{t}.json"):
            p = os.path.join(results, name)
            if os.path.exists(p):
                for r in json.loads(read(p)):
                    if r["variant"] in ("plain", "none"):
                        pytorch[(r["workload"], t)] = r["median_ms"] if "median_ms" in r else 1e3 * r["median_s"]
    resnet = {}
    p = os.path.join(results, "resnet_step.json")
    if os.path.exists(p):
        for b in json.loads(read(p))["benchmarks"]:
            if b.get("aggregate_name") == "median":
                m = re.match(r"(remat_step/none|libtorch_step)/(\d)/", b["run_name"])
                if m:
                    resnet[(m.group(1), int(m.group(2)))] = b["real_time"] / 1e6 if b["time_unit"] == "ns" else b["real_time"]
        for t in (1, 2):
            pp = os.path.join(results, f"resnet_pytorch_threads{t}.json")
            if os.path.exists(pp):
                for r in json.loads(read(pp))["results"]:
                    if r.get("mode") == "none":
                        pytorch[("W4", t)] = r["median_ms"]
    lines = ["| workload | threads | remat ms | ÷ hand-written | ÷ LibTorch | ÷ PyTorch |", "|---|---|---|---|---|---|"]
    f = lambda a, b: f"{a / b:.2f}" if a and b else "—"
    for w in ("W0", "W1", "W2", "W3"):
        plain = "RematNone" if w == "W3" else "RematPlain"
        for t in (1, 2):
            me = rows.get((w, plain, t))
            if me is None:
                continue
            lines.append(f"| {w} | {t} | {me:.3g} | {f(me, rows.get((w, 'HandWritten', t)))} | "
                         f"{f(me, rows.get((w, 'LibTorch', t)))} | {f(me, pytorch.get((w, t)))} |")
    for t in (1, 2):
        me = resnet.get(("remat_step/none", t))
        if me:
            lines.append(f"| W4 | {t} | {me:.3g} | — | {f(me, resnet.get(('libtorch_step', t)))} | "
                         f"{f(me, pytorch.get(('W4', t)))} |")
    return "\n".join(lines)


def batched_matmul(results):
    data = json.loads(read(os.path.join(results, "batched_matmul.json")))
    med = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") == "median":
            m = re.match(r"(.*)/(\d)(/|$)", b["run_name"])
            name, threads = (m.group(1), int(m.group(2))) if m else (b["run_name"], 1)
            scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3}[b["time_unit"]]
            med[(name, threads)] = b["real_time"] * scale
    names = sorted({k[0] for k in med}, key=lambda n: (n.split("/")[1] if "/" in n else "", n))
    lines = ["| row | 1 thread µs | 2 threads µs |", "|---|---|---|"]
    for n in names:
        cell = lambda t: f"{med[(n, t)]:.0f}" if (n, t) in med else "—"
        lines.append(f"| {n} | {cell(1)} | {cell(2)} |")
    return "\n".join(lines)


def mlp_epochs(results):
    runs = [json.loads(l) for l in read(os.path.join(results, "mlp_epochs.jsonl")).splitlines() if l.strip()]
    by = {}
    for r in runs:
        by.setdefault((r["impl"], r["threads"]), []).append(r["result"]["seconds_per_epoch"])
    lines = ["| program | threads | seconds per epoch, median (min–max) | runs |", "|---|---|---|---|"]
    for (impl, t), s in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0] != "remat")):
        name = "remat (examples/mlp)" if impl == "remat" else "PyTorch 1.13 (bench/peers/mlp_pytorch.py)"
        lines.append(f"| {name} | {t} | {statistics.median(s):.2f} ({min(s):.2f}–{max(s):.2f}) | {len(s)} |")
    for t in (1, 2):
        a, b = by.get(("remat", t)), by.get(("pytorch", t))
        if a and b:
            lines.append(f"\nremat ÷ PyTorch at {t} thread{'s' if t > 1 else ''}: "
                         f"{statistics.median(a) / statistics.median(b):.2f}")
    return "\n".join(lines)


def checkpoint_modes(results):
    runs = [json.loads(l) for l in read(os.path.join(results, "checkpoint_modes.jsonl")).splitlines() if l.strip()]
    by, ratios = {}, {}
    rounds = {}
    for r in runs:
        by.setdefault((r["mode"], r["threads"]), []).append(r["result"])
        rounds.setdefault((r["round"], r["threads"]), {})[r["mode"]] = r["result"]["seconds_per_epoch"]
    for (_, t), modes in rounds.items():
        for mode, s in modes.items():
            if "none" in modes:
                ratios.setdefault((mode, t), []).append(s / modes["none"])
    lines = ["| mode | threads | seconds per epoch, median | ÷ none (median of per-round ratios) | saved bytes per step |",
             "|---|---|---|---|---|"]
    order = ["none", "layer", "sqrt", "dots"]
    for (mode, t), rs in sorted(by.items(), key=lambda kv: (kv[0][1], order.index(kv[0][0]) if kv[0][0] in order else 9)):
        s = statistics.median(x["seconds_per_epoch"] for x in rs)
        saved = rs[0].get("saved_bytes_per_step")
        saved = f"{saved:,}" if saved is not None else "—"
        ratio = statistics.median(ratios[(mode, t)]) if (mode, t) in ratios else None
        lines.append(f"| {mode} | {t} | {s:.2f} | {f'{ratio:.2f}' if ratio else '—'} | {saved} |")
    return "\n".join(lines)


SECTIONS = [
    # (title, suite, .uptime names, how the section is made, the sentence before the table)
    ("Training step, W0–W3", "steps", ["steps"], steps,
     "One step (forward, loss, every weight gradient) of W0–W3 (bench/README.md) in each implementation of "
     "bench/step_benchmark.cpp, randomly interleaved, and the PyTorch peers (bench/peers/pytorch_checkpoint.py, "
     "bench/peers/gpt_pytorch.py) in their own processes. Wall-clock medians and interquartile ranges; ratios within "
     "the run. remat's saved MiB is the tape after the forward pass, peak MiB its peak over the step, replayed MiB "
     "what checkpoint replay recomputed."),
    ("Batched matmul", "batched_matmul", ["batched_matmul"], batched_matmul,
     "C [64,128,128] = A [64,128,64] × B [64,64,128], float32 (bench/batched_matmul.cpp): remat's `matmul`, "
     "LibTorch's `torch::matmul`, and hand-written loops over the batch; forward alone and forward + backward of "
     "`sum(matmul(a, b))`. Medians, µs."),
    ("ResNet step, W4", "resnet", ["resnet_step", "resnet_pytorch_threads1", "resnet_pytorch_threads2"],
     lambda r: run(os.path.join(HERE, "resnet_summary.py"), os.path.join(r, "resnet_step.json"),
                   os.path.join(r, "resnet_pytorch_threads1.json"), os.path.join(r, "resnet_pytorch_threads2.json")),
     "One training step of examples/resnet's ResNet-14 (bench/resnet_step.cpp) in each checkpoint mode, beside "
     "LibTorch and PyTorch (bench/peers/resnet_step.py); then a ResNet-104 in remat alone. Medians and IQR in ms; "
     "saved and peak bytes from `tape.memory()` (MB = 10⁶ B)."),
    ("Memory budgets, W1–W3", "budget", ["budget_step"],
     lambda r: run(os.path.join(HERE, "budget_summary.py"), os.path.join(r, "budget_step.json")),
     "W1, W2 and W3 under a budget of 50 % and 25 % of the plain step's measured peak: DTR "
     "(`Tape::set_memory_budget`) with each eviction heuristic, `checkpoint_sequential` and the planner "
     "(`checkpoint_sequential_auto`), beside the plain step (bench/budget_step.cpp)."),
    ("An LSTM under a budget, W5", "lstm", ["lstm_step", "lstm_pytorch_threads1", "lstm_pytorch_threads2"],
     lambda r: run(os.path.join(HERE, "budget_summary.py"), os.path.join(r, "lstm_step.json"), "--pytorch",
                   os.path.join(r, "lstm_pytorch_threads1.json"), os.path.join(r, "lstm_pytorch_threads2.json")),
     "W5 and W5-large, unrolled LSTMs (bench/lstm_step.cpp): plain, one checkpoint per timestep, the budget at 50 % "
     "and 35 % of plain's peak with each heuristic, the planner's schedule, and PyTorch's per-timestep "
     "`torch.utils.checkpoint` (bench/peers/lstm_pytorch.py)."),
    ("Compressed residuals", "compression", ["compression_step"],
     lambda r: run(os.path.join(HERE, "compression_summary.py"), os.path.join(r, "compression_step.json"),
                   "--png", os.path.join(HERE, "compression_memory_vs_time.png"))
     + "\n\n![Peak against step time, compressed and recomputed](compression_memory_vs_time.png)",
     "W2, W3 and W4 with every residual of each checkpointed block kept in bf16 or int8 (docs/compression.md), "
     "beside plain, `nothing_saveable` and `dots_saveable` on the same blocks (bench/compression_step.cpp)."),
    ("The Fashion-MNIST example against PyTorch", "mlp_epochs", ["mlp_epochs"], mlp_epochs,
     "examples/mlp (784-512-512-10, batch 128, Adam, constant learning rate) and the same model in PyTorch, both "
     "flushing subnormals; seconds per epoch over shuffled rounds, two epochs a run."),
    ("The Fashion-MNIST example's checkpoint modes", "checkpoint_modes", ["checkpoint_modes"], checkpoint_modes,
     "examples/mlp on 784-1024×8-10, one epoch of 10,000 images a run, each `--checkpoint` mode in shuffled rounds."),
    ("Data-parallel training on MPI", "distributed", ["distributed_w1_r1t1"],
     lambda r: run(os.path.join(HERE, "distributed_summary.py"), r),
     "W1's step and one epoch of the MLP example as 1 rank × 1 thread, 1 rank × 2 threads and 2 ranks × 1 thread "
     "(bench/distributed_step.cpp, `mpirun -np 2`)."),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="?", default=os.path.join(HERE, "results"))
    p.add_argument("--environment", metavar="BUILD", help="print the machine and software table and exit")
    a = p.parse_args()
    if a.environment:
        print(environment(a.environment))
        return
    r = a.results
    out = ["# Benchmark results", "",
           "The current table, written by `bench/run.sh` (every suite, then `bench/summarize.py`); do not edit it by "
           "hand. bench/README.md defines the workloads W0–W5 and the environment every timed program runs in. Each "
           "suite waits for a 1-minute load average below 0.5 before each program it times, interleaves its "
           "repetitions randomly, and reports medians with interquartile ranges; ratios are taken within one run. "
           "Earlier runs and the experiments behind past decisions are in git's history of this file; "
           "bench/probes/README.md lists the one-question probes and their answers.", "",
           "## Machine and software", ""]
    env_path = os.path.join(r, "environment.md")
    out.append(read(env_path).strip() if os.path.exists(env_path) else "(not recorded: run bench/run.sh)")
    steps_json = os.path.join(r, "steps.json")
    if os.path.exists(steps_json):  # what OpenBLAS reported inside the timed program
        ctx = json.loads(read(steps_json)).get("context", {})
        if ctx.get("openblas"):
            out.append(f"| OpenBLAS in the timed programs | {ctx['openblas']} |")
    out += ["", "## Runs", "", "| section | suite | commit | started | ended | load at start / end | repetitions |",
            "|---|---|---|---|---|---|---|"]
    for i, (title, suite, uptimes, _, _) in enumerate(SECTIONS, 1):
        m = meta(r, suite)
        if m:
            start, end = loads(r, uptimes)
            out.append(f"| {i}. {title} | `{suite}` | {m.get('commit', '?')} | {m.get('started', '?')} | "
                       f"{m.get('ended', '?')} | {start} / {end} | {m.get('repetitions', '?')} |")
    out += ["", "To regenerate one section: `bench/run.sh build-bench 5 <suite>` (bench/run.sh's header lists the "
            "suites and how to build them).", "", "## Headline", "",
            "remat's plain training step (no checkpointing) as a ratio of each peer's median time in the same run "
            "(sections 1 and 3): below 1 is faster than the peer.", "", headline(r)]
    for i, (title, suite, _, make, intro) in enumerate(SECTIONS, 1):
        out += ["", f"## {i}. {title}", "", intro + f" Suite `{suite}`.", ""]
        try:
            out.append(make(r) if meta(r, suite) else "(not run yet: `bench/run.sh build-bench 5 " + suite + "`)")
        except (OSError, KeyError, ValueError) as e:
            out.append(f"(no results: {e})")
    print("\n".join(out))


if __name__ == "__main__":
    main()
