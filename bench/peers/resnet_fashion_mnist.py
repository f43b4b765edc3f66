#!/usr/bin/python3
"""PyTorch reference for examples/resnet (issue 45): a small ResNet trained on Fashion-MNIST.

Usage (Debian's interpreter, python3-torch 1.13, in the benchmarks' environment, bench/README.md):
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE \\
      GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736 \\
      /usr/bin/python3 bench/peers/resnet_fashion_mnist.py --threads 2 --json
The defaults are the recommended configuration, ResNet-14 of width 16, 9 epochs, i.e.
  --width 16 --blocks 2 --epochs 9 --batch 128 --lr 0.1 --momentum 0.9 --weight-decay 5e-4 --seed 1
The issue's first scale point (ResNet-8, one block per stage, 8 epochs):
  /usr/bin/python3 bench/peers/resnet_fashion_mnist.py --blocks 1 --epochs 8 --threads 2
Without the GLIBC_TUNABLES setting glibc returns the large activation buffers to the kernel after every
use and the page faults slow the training steps (about 1.6× at 2 threads, 1.1× at 1, for ResNet-8) and the
evaluation in large batches.
Quick smoke run (2,560 training images, one epoch):
  /usr/bin/python3 bench/peers/resnet_fashion_mnist.py --limit 2560 --epochs 1

Data: the Fashion-MNIST IDX .gz files under --data (60,000 training, 10,000 test images, 28×28),
pixels / 255, then normalised with the training set's mean and standard deviation (one scalar each,
over all training pixels; population std), tensors [N, 1, 28, 28] float32.
--augment crop: each training image, independently at each epoch, is padded by 2 px of zeros (in pixel
space, i.e. (0 - mean) / std after normalising) to 32×32 and a 28×28 window is cut at a uniformly random
offset (0..4, 0..4), as torchvision's RandomCrop(28, padding=2). Default: no augmentation.

Model (NCHW; only conv2d, batch_norm, relu, add, adaptive_avg_pool2d, linear, cross_entropy):
  stem     conv3x3(1 -> w, stride 1, padding 1, no bias), BatchNorm2d(w), ReLU
  stages   widths w, 2w, 4w with strides 1, 2, 2 (28×28, 14×14, 7×7); --blocks BasicBlocks per stage,
           the stride in the stage's first block. BasicBlock (torchvision's):
             out = relu(bn1(conv3x3(x, stride, padding 1, no bias)))
             out = bn2(conv3x3(out, stride 1, padding 1, no bias))
             shortcut = x, or bn(conv1x1(x, stride, no bias)) when the stride or width changes
             y = relu(out + shortcut)
  head     adaptive_avg_pool2d to 1×1, flatten, linear(4w -> 10, with bias)
  loss     mean softmax cross-entropy
  ResNet-(6·blocks + 2): --blocks 1 is ResNet-8, 2 is ResNet-14, 3 is ResNet-20.
PyTorch's default initialisations: Conv2d and Linear weights kaiming_uniform_(a = sqrt(5)), i.e.
U(-1/sqrt(fan_in), 1/sqrt(fan_in)), Linear bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)); BatchNorm weight 1,
bias 0, running mean 0, running var 1, momentum 0.1, eps 1e-5 (running var updated with the unbiased
batch variance). Training uses batch statistics, evaluation the running statistics.

Optimizer: torch.optim.SGD(nesterov=True, momentum=--momentum, dampening 0), weight decay --weight-decay
(L2 added to the gradient) only for conv and linear weights (parameters with more than one dimension);
BatchNorm weights and biases and the linear bias have none. torch's Nesterov step, per parameter:
  g = grad + wd·p;  buf = momentum·buf + g (buf = g at the first step);  p -= lr·(g + momentum·buf)
Schedule: torch.optim.lr_scheduler.OneCycleLR stepped after every batch, with
  max_lr = --lr, total_steps = epochs · ceil(N / batch), pct_start = 0.25 (--pct-start),
  anneal_strategy = "cos", div_factor = 25 (initial lr = max_lr / 25),
  final_div_factor = 1e4 (final lr = initial lr / 1e4), three_phase = False,
  cycle_momentum = False (momentum stays --momentum).
So step s (0-based, of T = total_steps) uses, with u = pct_start·T - 1 and the cosine
c(a, b, t) = b + (a - b)·(1 + cos(pi·t))/2:
  lr = c(max_lr/25, max_lr, s/u)                    for s <= u
  lr = c(max_lr, max_lr/25/1e4, (s - u)/(T - 1 - u)) after.
The last partial batch of an epoch is kept (60,000 = 468·128 + 96).

Determinism: torch.manual_seed(--seed) before building the model (initialisation); the shuffle (a
fresh torch.randperm each epoch) and the crop offsets come from their own torch.Generator seeded with
--seed + 1 and --seed + 2; torch.use_deterministic_algorithms(True). Runs with the same seed and the same
--threads give identical losses; a different thread count may change the last bits (oneDNN's
convolutions split their reductions by thread).

Output: the torch build and thread count, one line per epoch (training loss, training and test accuracy,
training seconds, evaluation seconds, learning rate at the end of the epoch), and with --json a last line
with one JSON object (configuration, per-epoch history, totals). "train_seconds" is the sum of the
training passes; "total_seconds" adds the per-epoch evaluations on the test set (in batches of --batch).
"""
import argparse
import gzip
import json
import math
import os
import struct
import time

import numpy as np

from torch_threads import set_threads

torch = None  # imported in main() after OMP_NUM_THREADS is set (torch's OpenMP runtime reads it when it loads)


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        raise SystemExit(f"{path}: bad magic number {got}, expected {magic}")
    if magic == 2051:
        n, rows, cols = struct.unpack(">III", data[4:16])
        return np.frombuffer(data, np.uint8, n * rows * cols, 16).reshape(n, 1, rows, cols)
    n = struct.unpack(">I", data[4:8])[0]
    return np.frombuffer(data, np.uint8, n, 8)


def build_model(width, blocks):
    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, stride=1, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = None
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return torch.relu(out + (x if self.shortcut is None else self.shortcut(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, width, 3, stride=1, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(width)
            layers, cin = [], width
            for stage, stride in enumerate((1, 2, 2)):
                cout = width << stage
                for b in range(blocks):
                    layers.append(BasicBlock(cin, cout, stride if b == 0 else 1))
                    cin = cout
            self.blocks = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, 10)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x)))
            x = self.blocks(x)
            x = torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
            return self.fc(x)

    return ResNet()


def random_crop(x, pad, fill, generator):
    """torchvision's RandomCrop(H, padding=pad) on every image of x [B, 1, H, W], fill = padding value."""
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad), value=fill)
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    rows = (dy[:, None] + torch.arange(h))[:, :, None]  # [B, H, 1]
    cols = (dx[:, None] + torch.arange(w))[:, None, :]  # [B, 1, W]
    return padded[torch.arange(b)[:, None, None], 0, rows, cols].unsqueeze(1)


def evaluate(model, x, y, batch):
    model.eval()
    right = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch):
            right += (model(x[i : i + batch]).argmax(1) == y[i : i + batch]).sum().item()
    return right / x.shape[0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--width", type=int, default=16, help="channels of the first stage (then 2w, 4w)")
    p.add_argument("--blocks", type=int, default=2, help="BasicBlocks per stage")
    p.add_argument("--epochs", type=int, default=9)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1, help="OneCycleLR's max_lr")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4, help="on conv and linear weights only")
    p.add_argument("--pct-start", type=float, default=0.25, help="OneCycleLR's warm-up fraction")
    p.add_argument("--augment", choices=("none", "crop"), default="none")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="train on the first N images only (smoke tests)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()

    os.environ["OPENBLAS_NUM_THREADS"] = str(a.threads)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    global torch
    import torch as torch_module
    torch = torch_module
    set_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"mkldnn {torch.backends.mkldnn.is_available()}", flush=True)

    raw_train = read_idx(f"{a.data}/train-images-idx3-ubyte.gz", 2051).astype(np.float32) / 255
    mean, std = float(raw_train.mean(dtype=np.float64)), float(raw_train.std(dtype=np.float64))
    x_train = torch.from_numpy((raw_train - np.float32(mean)) / np.float32(std))
    y_train = torch.from_numpy(read_idx(f"{a.data}/train-labels-idx1-ubyte.gz", 2049).astype(np.int64))
    raw_test = read_idx(f"{a.data}/t10k-images-idx3-ubyte.gz", 2051).astype(np.float32) / 255
    x_test = torch.from_numpy((raw_test - np.float32(mean)) / np.float32(std))
    y_test = torch.from_numpy(read_idx(f"{a.data}/t10k-labels-idx1-ubyte.gz", 2049).astype(np.int64))
    if a.limit > 0:
        x_train, y_train = x_train[: a.limit], y_train[: a.limit]
    fill = (0.0 - mean) / std

    torch.manual_seed(a.seed)
    model = build_model(a.width, a.blocks)
    parameters = sum(q.numel() for q in model.parameters())
    decay = [q for q in model.parameters() if q.ndim > 1]
    no_decay = [q for q in model.parameters() if q.ndim <= 1]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": a.weight_decay},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=a.lr, momentum=a.momentum, nesterov=True)
    n = x_train.shape[0]
    steps_per_epoch = math.ceil(n / a.batch)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=a.lr, total_steps=a.epochs * steps_per_epoch, pct_start=a.pct_start,
        anneal_strategy="cos", cycle_momentum=False, div_factor=25.0, final_div_factor=1e4, three_phase=False)
    shuffle = torch.Generator().manual_seed(a.seed + 1)
    crops = torch.Generator().manual_seed(a.seed + 2)
    loss_fn = torch.nn.CrossEntropyLoss()
    print(f"ResNet-{6 * a.blocks + 2} width {a.width}, {parameters} parameters; {n} training images, "
          f"batch {a.batch}, {a.epochs} epochs, max lr {a.lr}, momentum {a.momentum} (Nesterov), "
          f"weight decay {a.weight_decay}, augment {a.augment}, seed {a.seed}; mean {mean:.6f} std {std:.6f}",
          flush=True)

    history = []
    for epoch in range(1, a.epochs + 1):
        start = time.perf_counter()
        cpu_start = time.process_time()
        model.train()
        order = torch.randperm(n, generator=shuffle)
        total, correct = 0.0, 0
        for first in range(0, n, a.batch):
            idx = order[first : first + a.batch]
            x, y = x_train[idx], y_train[idx]
            if a.augment == "crop":
                x = random_crop(x, 2, fill, crops)
            optimizer.zero_grad(set_to_none=True)
            logits = model(x)
            loss = loss_fn(logits, y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item() * len(idx)
            correct += (logits.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        eval_start = time.perf_counter()
        accuracy = evaluate(model, x_test, y_test, a.batch)
        eval_seconds = time.perf_counter() - eval_start
        history.append({"loss": total / n, "train_accuracy": correct / n, "test_accuracy": accuracy,
                        "seconds": seconds, "cpu_seconds": cpu, "eval_seconds": eval_seconds})
        lr = optimizer.param_groups[0]["lr"]
        print(f"epoch {epoch:2d}/{a.epochs}  loss {total / n:.4f}  train {100 * correct / n:.2f}%  "
              f"test {100 * accuracy:.2f}%  {seconds:.1f} s (cpu {cpu:.1f} s)  eval {eval_seconds:.1f} s  "
              f"lr {lr:.3g}", flush=True)
    train_seconds = sum(h["seconds"] for h in history)
    total_seconds = train_seconds + sum(h["eval_seconds"] for h in history)
    print(f"test accuracy {100 * history[-1]['test_accuracy']:.2f}%  training {train_seconds:.1f} s  "
          f"with evaluation {total_seconds:.1f} s  ({train_seconds / len(history):.1f} s an epoch)", flush=True)
    if a.json:
        result = {"peer": "pytorch", "torch": torch.__version__, "model": f"resnet{6 * a.blocks + 2}",
                  "width": a.width, "blocks": a.blocks, "parameters": parameters, "epochs": a.epochs,
                  "batch": a.batch, "lr": a.lr, "momentum": a.momentum, "weight_decay": a.weight_decay,
                  "pct_start": a.pct_start, "augment": a.augment, "threads": a.threads, "seed": a.seed,
                  "train_images": n, "test_accuracy": history[-1]["test_accuracy"],
                  "train_seconds": train_seconds, "total_seconds": total_seconds,
                  "seconds_per_epoch": train_seconds / len(history),
                  "test_accuracies": [h["test_accuracy"] for h in history],
                  "losses": [h["loss"] for h in history],
                  "epoch_seconds": [h["seconds"] for h in history],
                  "eval_seconds": [h["eval_seconds"] for h in history]}
        print(json.dumps(result))


if __name__ == "__main__":
    main()
