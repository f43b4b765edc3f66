#!/usr/bin/python3
"""W4 in PyTorch: one training step (forward, cross-entropy, backward) of examples/resnet's ResNet-14 (width 16,
batch 128, 28×28 images), plain and with each basic block under torch.utils.checkpoint (non-reentrant, the
mode PyTorch recommends; it has no per-op policies). The peer of bench/resnet_step.cpp's rows.

Usage (Debian's interpreter, python3-torch 1.13, in the benchmarks' environment, bench/README.md):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE \\
      GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736 \\
      /usr/bin/python3 bench/peers/resnet_step.py --threads 2 --json
Prints, per mode, the median step time in milliseconds and its interquartile range over --repetitions
repetitions of --steps steps each (after --warmup steps), the modes interleaved repetition by repetition.
"""
import argparse
import json
import os
import statistics
import time

from torch_threads import set_threads

torch = None  # imported in main() after OMP_NUM_THREADS is set


def main():
    global torch
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repetitions", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch as t
    import torch.utils.checkpoint

    torch = t
    set_threads(a.threads)
    import resnet_fashion_mnist

    resnet_fashion_mnist.torch = torch
    torch.manual_seed(1)
    model = resnet_fashion_mnist.build_model(a.width, a.blocks)
    model.train()
    x = torch.randn(a.batch, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch,))

    def forward(mode):
        h = torch.relu(model.bn(model.conv(x)))
        for block in model.blocks:
            if mode == "block":
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        h = torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1)
        return model.fc(h)

    def step(mode):
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(mode), y)
        loss.backward()

    modes = ["none", "block"]
    for mode in modes:
        for _ in range(a.warmup):
            step(mode)
    times = {m: [] for m in modes}
    for r in range(a.repetitions):
        for mode in modes if r % 2 == 0 else reversed(modes):
            start = time.perf_counter()
            for _ in range(a.steps):
                step(mode)
            times[mode].append((time.perf_counter() - start) / a.steps * 1e3)
    results = []
    for mode in modes:
        q = statistics.quantiles(times[mode], n=4)
        results.append({"mode": mode, "median_ms": statistics.median(times[mode]), "iqr_ms": q[2] - q[0],
                        "repetitions": a.repetitions, "steps": a.steps})
        print(f"PyTorch {torch.__version__} ResNet-{6 * a.blocks + 2} width {a.width} batch {a.batch}, {mode}: "
              f"{results[-1]['median_ms']:.1f} ms (IQR {results[-1]['iqr_ms']:.1f}), {a.threads} threads")
    if a.json:
        print(json.dumps({"threads": a.threads, "torch": torch.__version__,
                          "mkldnn": torch.backends.mkldnn.is_available(), "results": results}))


if __name__ == "__main__":
    main()
