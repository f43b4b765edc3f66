#!/usr/bin/python3
"""PyTorch peer of bench/lstm_step: W5, the unrolled LSTM of bench/workloads.hpp (batch 16, 48 timesteps, input and
hidden 128, 10 classes, float32), in Debian's PyTorch 1.13, plain and with torch.utils.checkpoint around each
timestep (non-reentrant; the cell takes (x_t, h, c) and returns (h, c), as remat's checkpoint_per_step row).

The cell is remat's: gates = x_t·W_ih + b + h·W_hh in the order i, f, g, o (torch.chunk: views, where remat's
slice_cols copies), i, f, o = sigmoid, g = tanh, c = f*c + i*g, h = o*tanh(c), from h = c = 0; the loss is the softmax
cross-entropy (mean over the batch) of a linear head on the last h. Weights U(±1/sqrt(hidden)), inputs N(0,1) from
torch's generator (the same distributions as bench/workloads.hpp's make_data, not the same numbers).

Reports, per variant, the median step time over `rounds` randomly interleaved rounds (each the median of `repeats`
timed steps after one warm-up step), its interquartile range, the ratio to plain's median, and the bytes autograd
saves for backward after the forward pass (a saved_tensors_hooks pack hook outside checkpointed functions, plus
the inputs each checkpointed call keeps; storages counted once; parameters not counted), as
bench/peers/pytorch_checkpoint.py does. PyTorch on CPU reports no peak.

Run with Debian's interpreter and the benchmark environment (bench/suites/lstm.sh does):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE \\
      GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736 \\
      /usr/bin/python3 bench/peers/lstm_pytorch.py --threads 1 --rounds 10 --repeats 20
"""
import argparse
import json
import math
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from torch_threads import loaded_blas, set_threads

SHAPES = {
    "W5": dict(batch=16, steps=48, input=128, hidden=128, classes=10),
    "W5-large": dict(batch=32, steps=64, input=64, hidden=256, classes=10),
}


class Saved:
    """Counts bytes of the distinct storages autograd keeps for backward."""

    def __init__(self, exclude):
        self.exclude = {t.data_ptr() for t in exclude}
        self.seen = {}

    def add(self, t):
        if isinstance(t, torch.Tensor) and t.data_ptr() not in self.exclude:
            self.seen[t.data_ptr()] = t.numel() * t.element_size()

    def pack(self, t):
        self.add(t)
        return t

    def total(self):
        return sum(self.seen.values())


def build(name, seed=42):
    s = SHAPES[name]
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(s["hidden"])

    def uniform(*shape):
        return ((torch.rand(*shape, generator=g) * 2 - 1) * bound).requires_grad_()

    x = torch.randn(s["steps"], s["batch"], s["input"], generator=g)
    labels = torch.randint(0, s["classes"], (s["batch"],), generator=g)
    w_ih, w_hh, b = uniform(s["input"], 4 * s["hidden"]), uniform(s["hidden"], 4 * s["hidden"]), uniform(4 * s["hidden"])
    w_out, b_out = uniform(s["hidden"], s["classes"]), uniform(s["classes"])
    return s, x, labels, [w_ih, w_hh, b, w_out, b_out]


def step(variant, shape, x, labels, params, saved=None):
    w_ih, w_hh, b, w_out, b_out = params
    for p in params:
        p.grad = None

    def cell(x_t, h, c):
        i, f, g, o = (torch.addmm(b, x_t, w_ih) + h @ w_hh).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def forward():
        h = torch.zeros(shape["batch"], shape["hidden"])
        c = h
        for t in range(shape["steps"]):
            if variant == "plain":
                h, c = cell(x[t], h, c)
            else:
                if saved is not None:
                    for a in (x[t], h, c):
                        saved.add(a)
                h, c = checkpoint(cell, x[t], h, c, use_reentrant=False)
        return F.cross_entropy(torch.addmm(b_out, h, w_out), labels)

    if saved is not None:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            loss = forward()
    else:
        loss = forward()
    loss.backward()
    return loss.item()


def quantile(values, q):
    """Linear interpolation between order statistics (numpy's default)."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (median and IQR over them)")
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per round (their median)")
    parser.add_argument("--workloads", default="W5")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    set_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, BLAS mapped: {', '.join(loaded_blas())}")
    variants = ["plain", "checkpoint_per_step"]
    results = []
    order = random.Random(0)
    for name in args.workloads.split(","):
        shape, x, labels, params = build(name)
        saved_bytes, losses, times = {}, {}, {v: [] for v in variants}
        for variant in variants:
            saved = Saved(exclude=params)
            losses[variant] = step(variant, shape, x, labels, params, saved)
            saved_bytes[variant] = saved.total()
        for _ in range(args.rounds):
            for variant in order.sample(variants, len(variants)):
                step(variant, shape, x, labels, params)  # warm-up
                round_times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    step(variant, shape, x, labels, params)
                    round_times.append(time.perf_counter() - start)
                times[variant].append(statistics.median(round_times))
        plain = statistics.median(times["plain"])
        for variant in variants:
            median = statistics.median(times[variant])
            iqr = quantile(times[variant], 0.75) - quantile(times[variant], 0.25)
            row = dict(workload=name, variant=variant, threads=args.threads, median_ms=median * 1e3,
                       iqr_ms=iqr * 1e3, ratio_to_plain=median / plain, saved_bytes=saved_bytes[variant],
                       loss=losses[variant], rounds=args.rounds, repeats=args.repeats)
            results.append(row)
            print(f"{name:9s} {variant:20s} {median * 1e3:9.3f} ms (IQR {iqr * 1e3:.3f})  x{median / plain:5.3f}  "
                  f"saved {saved_bytes[variant] / 2**20:8.2f} MiB  loss {losses[variant]:.6f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
