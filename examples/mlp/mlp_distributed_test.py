#!/usr/bin/env python3
"""End-to-end tests of `mlp --distributed` (docs/distributed.md) under mpiexec.

Usage: mlp_distributed_test.py CASE MPIEXEC MLP DATA LIMIT
  CASE: equals_single_process | faults
Each case exits 0 on success and prints what failed otherwise. Standard library only.
"""
import json
import os
import subprocess
import sys
import tempfile

CASE, MPIEXEC, MLP, DATA, LIMIT = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
MPI = [MPIEXEC, "--oversubscribe", "--allow-run-as-root"]
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)
    return condition


def run(command, timeout=120):
    try:
        return subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        check(False, f"still running after {timeout} s (a hang): {' '.join(map(str, command))}")
        return None


def last_json(p):
    return json.loads(p.stdout.strip().splitlines()[-1])


COMMON = ["--data", DATA, "--limit", LIMIT, "--epochs", 1, "--batch", 64, "--hidden", "64,64", "--schedule",
          "constant", "--threads", 1, "--json"]


def case_equals_single_process():
    single = run([MLP, *COMMON])
    check(single is not None and single.returncode == 0, f"single process: {single and single.stderr}")
    for ranks in (2, 3):
        dist = run([*MPI, "-np", ranks, MLP, "--distributed", *COMMON])
        if not check(dist is not None and dist.returncode == 0, f"{ranks} ranks: {dist and dist.stderr}"):
            continue
        check(dist.stdout.count('"epochs"') == 1, f"{ranks} ranks: only rank 0 prints, got:\n{dist.stdout}")
        s, d = last_json(single), last_json(dist)
        # The same global batches and the same averaged gradient: the same training up to float rounding.
        check(abs(s["loss"] - d["loss"]) <= 1e-3 * s["loss"], f"{ranks} ranks: loss {d['loss']} vs {s['loss']}")
        check(abs(s["test_accuracy"] - d["test_accuracy"]) <= 0.01,
              f"{ranks} ranks: test accuracy {d['test_accuracy']} vs {s['test_accuracy']}")
        check(d["train_images"] == s["train_images"], f"{ranks} ranks: {d['train_images']} training images")


def case_faults():
    with tempfile.TemporaryDirectory() as empty:
        # MPMD: rank 1 gets a data directory without the files (a machine with a bad copy).
        p = run([*MPI, "-np", 1, MLP, "--distributed", *COMMON, ":", "-np", 1, MLP, "--distributed", *COMMON[:1],
                 empty, *COMMON[2:]], timeout=60)
        if p is not None:
            check(p.returncode != 0, "a rank without data: exit code 0")
            check(f"mlp: rank 1 of 2: error: {empty}/train-images-idx3-ubyte.gz: cannot open" in p.stderr,
                  f"a rank without data: stderr {p.stderr[-3000:]!r}")
    # Different model flags on the two ranks.
    flags = [f for f in COMMON]
    narrow = flags[:flags.index("--hidden") + 1] + ["32,64"] + flags[flags.index("--hidden") + 2:]
    p = run([*MPI, "-np", 1, MLP, "--distributed", *flags, ":", "-np", 1, MLP, "--distributed", *narrow], timeout=60)
    if p is not None:
        check(p.returncode != 0, "mismatched --hidden: exit code 0")
        check("broadcast_parameters: parameter 0 is [784,64] on rank 0 but [784,32] on rank 1" in p.stderr,
              f"mismatched --hidden: stderr {p.stderr[-3000:]!r}")


{"equals_single_process": case_equals_single_process, "faults": case_faults}[CASE]()
if failures:
    sys.exit(1)
print("ok:", CASE)
