#!/usr/bin/python3
"""The MLP example's model and recipe in PyTorch, for the per-epoch time comparison (docs/mlp.md).

Same data (Fashion-MNIST IDX .gz, pixels / 255), model (784 -> hidden... -> 10, ReLU by default,
He-uniform weights, zero biases, Glorot-uniform output layer), loss (mean softmax cross-entropy),
optimizer (Adam lr 1e-3, betas 0.9/0.999, eps 1e-8), batch 128, a fresh shuffle each epoch, and the
same evaluation (test accuracy in batches of 1000 after each epoch), and subnormals flushed to zero
(--no-flush-denormal: not). Runs on `--threads` threads (default 1). Prints the BLAS PyTorch was built against and the library libblas.so.3 resolves to, one
line per epoch, and with --json a last line with the same keys as examples/mlp --json.

Run with Debian's interpreter (/usr/bin/python3, python3-torch):
  /usr/bin/python3 bench/peers/mlp_pytorch.py --epochs 3 --json
"""
import argparse
import gzip
import json
import math
import os
import struct
import subprocess
import time

import numpy as np

from torch_threads import set_threads

torch = None  # imported in main() after OMP_NUM_THREADS is set (torch's OpenMP runtime reads it when it loads;
# OpenBLAS's threads are set by set_threads: numpy has loaded OpenBLAS already)


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        raise SystemExit(f"{path}: bad magic number {got}, expected {magic}")
    if magic == 2051:
        n, rows, cols = struct.unpack(">III", data[4:16])
        return np.frombuffer(data, np.uint8, n * rows * cols, 16).reshape(n, rows * cols)
    n = struct.unpack(">I", data[4:8])[0]
    return np.frombuffer(data, np.uint8, n, 8)


def blas_in_use():
    """What libblas.so.3 resolves to (Debian's alternatives) and what torch reports about its BLAS."""
    try:
        target = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    except OSError:
        target = "?"
    config = torch.__config__.show()
    blas = [line.strip() for line in config.splitlines() if "BLAS" in line or "LAPACK" in line]
    return target, blas


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--hidden", default="512,512")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true")
    p.add_argument("--flush-denormal", action=argparse.BooleanOptionalAction, default=True,
                   help="torch.set_flush_denormal, as examples/mlp's --flush-denormal (default on in both); "
                        "it sets the calling thread, where PyTorch's optimizer step runs")
    a = p.parse_args()

    # torch.set_num_threads() sets the OpenMP/intra-op threads, but Debian's torch calls the system
    # libblas.so.3 (OpenBLAS, pthreads build). OPENBLAS_NUM_THREADS alone is not enough: numpy, imported
    # above, has already loaded that OpenBLAS, which read the variable then: with it alone this peer's
    # "1 thread" ran its GEMMs on two threads (its CPU time was twice its wall time). set_threads calls
    # openblas_set_num_threads in every OpenBLAS mapped into the process, as the other peers do.
    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    global torch
    import torch as torch_module
    torch = torch_module
    set_threads(a.threads)
    torch.manual_seed(a.seed)
    torch.set_flush_denormal(a.flush_denormal)
    target, blas = blas_in_use()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); libblas.so.3 -> {target}")
    for line in blas:
        print("  torch config:", line)

    x_train = torch.from_numpy(read_idx(f"{a.data}/train-images-idx3-ubyte.gz", 2051).astype(np.float32) / 255)
    y_train = torch.from_numpy(read_idx(f"{a.data}/train-labels-idx1-ubyte.gz", 2049).astype(np.int64))
    x_test = torch.from_numpy(read_idx(f"{a.data}/t10k-images-idx3-ubyte.gz", 2051).astype(np.float32) / 255)
    y_test = torch.from_numpy(read_idx(f"{a.data}/t10k-labels-idx1-ubyte.gz", 2049).astype(np.int64))
    if a.limit > 0:
        x_train, y_train = x_train[: a.limit], y_train[: a.limit]

    widths = [x_train.shape[1]] + [int(h) for h in a.hidden.split(",")]
    layers = []
    for i in range(len(widths) - 1):
        linear = torch.nn.Linear(widths[i], widths[i + 1])
        torch.nn.init.kaiming_uniform_(linear.weight, a=0, nonlinearity="relu")  # He uniform, as nn::Init::he_uniform
        torch.nn.init.zeros_(linear.bias)
        layers += [linear, torch.nn.ReLU()]
    head = torch.nn.Linear(widths[-1], 10)
    torch.nn.init.xavier_uniform_(head.weight)
    torch.nn.init.zeros_(head.bias)
    model = torch.nn.Sequential(*layers, head)
    optimizer = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    loss_fn = torch.nn.CrossEntropyLoss()

    n = x_train.shape[0]
    history = []
    for epoch in range(1, a.epochs + 1):
        start = time.perf_counter()
        cpu_start = time.process_time()
        model.train()
        order = torch.randperm(n)
        total, correct = 0.0, 0
        for first in range(0, n, a.batch):
            idx = order[first : first + a.batch]
            x, y = x_train[idx], y_train[idx]
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            correct += (logits.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        model.eval()
        with torch.no_grad():
            right = sum((model(x_test[i : i + 1000]).argmax(1) == y_test[i : i + 1000]).sum().item()
                        for i in range(0, x_test.shape[0], 1000))
        history.append({"loss": total / n, "train_accuracy": correct / n, "test_accuracy": right / x_test.shape[0],
                        "seconds": seconds, "cpu_seconds": cpu})
        h = history[-1]
        print(f"epoch {epoch:2d}/{a.epochs}  loss {h['loss']:.4f}  train {100 * h['train_accuracy']:.2f}%  "
              f"test {100 * h['test_accuracy']:.2f}%  {seconds:.2f} s (cpu {cpu:.2f} s)  {n / seconds:.0f} samples/s", flush=True)
    seconds = [h["seconds"] for h in history]
    result = {"peer": "pytorch", "torch": torch.__version__, "libblas": target, "threads": a.threads,
              "flush_denormal": a.flush_denormal,
              "epochs": a.epochs, "test_accuracy": history[-1]["test_accuracy"], "train_seconds": sum(seconds),
              "seconds_per_epoch": sum(seconds) / len(seconds), "median_seconds_per_epoch": float(np.median(seconds)),
              "cpu_seconds_per_epoch": sum(h["cpu_seconds"] for h in history) / len(history),
              "samples_per_second": n * len(seconds) / sum(seconds), "losses": [h["loss"] for h in history],
              "epoch_seconds": seconds}
    if a.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
