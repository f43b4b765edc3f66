#!/usr/bin/python3
"""PyTorch peer of bench/step_benchmark: W0, W1, W1-small and W2 (bench/README.md; shapes in bench/workloads.hpp) in PyTorch (Debian's
python3-torch 1.13), plain, with torch.utils.checkpoint per layer (W2: per block), with
checkpoint_sequential over round(sqrt(L)) segments and, for chains of 8 or more, over 4 segments.
Reports the median step time, the ratio to plain and the bytes saved for backward after the forward pass.

Saved bytes: a saved_tensors_hooks pack hook records every tensor autograd saves outside checkpointed
functions (checkpoint installs its own hooks inside them, which take precedence), plus the inputs each
checkpointed call keeps; storages are counted once. Parameters are not counted (remat does not count
referenced Parameters either).

Run with Debian's interpreter and the same BLAS/thread settings as the C++ benchmark, e.g.
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE \
      GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736 \
      /usr/bin/python3 bench/peers/pytorch_checkpoint.py --threads 1 --repeats 10
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

from torch_threads import loaded_blas, set_threads

WORKLOADS = {
    "W0": dict(kind="mlp", input=32, hidden=32, layers=64, output=10, batch=16),
    "W1": dict(kind="mlp", input=784, hidden=1024, layers=16, output=10, batch=512),
    "W1-small": dict(kind="mlp", input=784, hidden=256, layers=4, output=10, batch=64),
    "W2": dict(kind="blocks", model=256, inner=1024, blocks=8, classes=10, batch=2048),
}


def affine(fan_in, fan_out, g):
    bound = 1.0 / math.sqrt(fan_in)
    w = (torch.rand(fan_in, fan_out, generator=g) * 2 - 1) * bound
    b = (torch.rand(fan_out, generator=g) * 2 - 1) * bound
    return w.requires_grad_(), b.requires_grad_()


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
    w = WORKLOADS[name]
    g = torch.Generator().manual_seed(seed)
    width_in = w["input"] if w["kind"] == "mlp" else w["model"]
    classes = w["output"] if w["kind"] == "mlp" else w["classes"]
    x = torch.randn(w["batch"], width_in, generator=g)
    labels = torch.randint(0, classes, (w["batch"],), generator=g)
    layers, params = [], []
    if w["kind"] == "mlp":
        fan_in = w["input"]
        for _ in range(w["layers"]):
            W, b = affine(fan_in, w["hidden"], g)
            params += [W, b]
            layers.append(lambda h, W=W, b=b: torch.tanh(torch.addmm(b, h, W)))
            fan_in = w["hidden"]
        Wo, bo = affine(w["hidden"], w["output"], g)
        params += [Wo, bo]
        head = lambda h: torch.addmm(bo, h, Wo)
    else:
        D = w["model"]

        def norm():
            gain = (1 + (torch.rand(D, generator=g) * 2 - 1) * 0.1).requires_grad_()
            shift = ((torch.rand(D, generator=g) * 2 - 1) * 0.1).requires_grad_()
            return gain, shift

        for _ in range(w["blocks"]):
            gain, shift = norm()
            W1, b1 = affine(D, w["inner"], g)
            W2, b2 = affine(w["inner"], D, g)
            params += [gain, shift, W1, b1, W2, b2]

            def block(h, gain=gain, shift=shift, W1=W1, b1=b1, W2=W2, b2=b2):
                u = F.gelu(torch.addmm(b1, F.layer_norm(h, (D,), gain, shift, 1e-5), W1), approximate="tanh")
                return h + torch.addmm(b2, u, W2)

            layers.append(block)
        gain, shift = norm()
        Wo, bo = affine(D, w["classes"], g)
        params += [gain, shift, Wo, bo]
        head = lambda h: torch.addmm(bo, F.layer_norm(h, (D,), gain, shift, 1e-5), Wo)
    return x, labels, layers, head, params


def step(variant, x, labels, layers, head, params, saved=None):
    for p in params:
        p.grad = None

    def run_checkpoint(fn, *args):
        if saved is not None:
            for a in args:
                saved.add(a)
        return checkpoint(fn, *args, use_reentrant=False)

    def forward():
        h = x
        if variant == "plain":
            for layer in layers:
                h = layer(h)
        elif variant == "checkpoint_per_layer":
            for layer in layers:
                h = run_checkpoint(layer, h)
        elif variant in ("checkpoint_sequential", "checkpoint_sequential_4"):
            # 1.13's checkpoint_sequential is reentrant-only: without an input that requires grad the
            # first segment's weights would get no gradient, so x requires grad here (one extra GEMM
            # for dx of the first layer). Its saved_for_backward segment inputs reach our pack hook.
            segments = 4 if variant == "checkpoint_sequential_4" else round(math.sqrt(len(layers)))
            h = checkpoint_sequential(torch.nn.Sequential(*[Lambda(f) for f in layers]), segments,
                                      x.detach().requires_grad_())
        return F.cross_entropy(head(h), labels)

    if saved is not None:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            loss = forward()
    else:
        loss = forward()
    loss.backward()
    return loss.item()


class Lambda(torch.nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, h):
        return self.f(h)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per measurement (median reported)")
    parser.add_argument("--workloads", default="W0,W1-small,W1,W2")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    set_threads(args.threads)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, BLAS mapped: {', '.join(loaded_blas())}")
    results = []
    for name in args.workloads.split(","):
        x, labels, layers, head, params = build(name)
        plain_time = None
        variants = ["plain", "checkpoint_per_layer", "checkpoint_sequential"]
        if len(layers) >= 8:
            variants.append("checkpoint_sequential_4")  # multi-layer regions, as remat's segments4 rows
        for variant in variants:
            saved = Saved(exclude=params)
            step(variant, x, labels, layers, head, params, saved)
            saved_bytes = saved.total()
            times = []
            step(variant, x, labels, layers, head, params)
            for _ in range(args.repeats):
                start = time.perf_counter()
                step(variant, x, labels, layers, head, params)
                times.append(time.perf_counter() - start)
            median = statistics.median(times)
            plain_time = plain_time or median
            row = dict(workload=name, variant=variant, threads=args.threads, median_ms=median * 1e3,
                       ratio_to_plain=median / plain_time, saved_bytes=saved_bytes)
            results.append(row)
            print(f"{name:9s} {variant:22s} {median * 1e3:9.3f} ms  x{median / plain_time:5.3f}  "
                  f"saved {saved_bytes / 2**20:8.2f} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
