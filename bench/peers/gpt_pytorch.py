#!/usr/bin/python3
"""PyTorch peer of bench workload W3: the docs/gpt.md GPT, one step = loss + all gradients.

W3: B = 4 sequences × S = 512 tokens, width H = 256, 4 heads, 4 blocks, vocabulary V = 256, float32,
dropout p = 0; a step is forward + backward (no optimizer step). The model follows the docs/gpt.md
contract exactly (parameter order and shapes, weights [in,out], pre-layer-norm blocks, causal softmax
attention, tanh GELU, mean cross-entropy); parameters are the contract's deterministic formula (computed
in float64, rounded to float32), ids[r] = (5r+3) mod V, targets[r] = (5r+8) mod V, as in
tests/gpt/make_reference.py. Written with Debian's python3-torch 1.13 in mind.

Variants:
  plain      no checkpointing.
  block      every block under torch.utils.checkpoint.checkpoint(..., use_reentrant=False) (1.13 has the
             non-reentrant variant; it needs no input that requires grad and keeps only the block input).
  selective  only the attention core under checkpoint (non-reentrant): from q, k, v (column slices of
             the qkv linear's output) through scores, mask, softmax and the product with v, to the
             attention output before the projection (Korthikanti et al. 2023, "selective activation
             recomputation"); the [B, heads, S, S] score and probability tensors are recomputed.
  sdpa       F.scaled_dot_product_attention with is_causal=True: skipped (with a message) when torch
             lacks it (it appeared in torch 2.0; Debian's 1.13 does not have it).
checkpoint keeps its default preserve_rng_state=True (a ~5 KB CPU RNG state copy per call).

Measurements per variant:
  time       median and quartiles (statistics.quantiles, inclusive) of the step time over --repeats
             repetitions; in each repetition every variant runs once, in an order shuffled with a fixed
             seed (--seed), after --warmup untimed steps of each variant. Gradients are set to None
             before each step, so each step allocates them afresh.
  saved      bytes autograd keeps for backward after the forward pass: a saved_tensors_hooks pack hook
             records every tensor saved outside checkpointed functions (checkpoint's own hooks take
             precedence inside them) plus the inputs each checkpointed call keeps; each storage is
             counted once, in full; parameters are not counted (as in pytorch_checkpoint.py).
  peak       peak bytes live in c10's CPU allocator during one step, above what was live before it,
             from the profiler's memory events (torch.profiler, profile_memory=True: the allocator
             reports each allocation and free made while profiling; their running sum in time order
             peaks at the reported value).
             Includes the gradients, the saved tensors and every temporary; excludes OpenBLAS's own
             buffers, Python objects and malloc overhead. Measured in a separate, untimed step.
  FLOP/s     hand-counted forward FLOPs per step, multiply-adds counted as 2, dense kernels count the
             full S×S square (no halving for causality):
               per block:  2·BS·H·3H (qkv) + 2·BS·H·H (proj) + 2·BS·H·4H·2 (fc, fc_proj)
                           + 2·2·B·S·S·H (scores q kᵀ and probabilities × v, all heads)
               head:       2·BS·H·V
               forward = L·(24·BS·H² + 4·B·S²·H) + 2·BS·H·V          (BS = B·S)
             W3: 17.45 GFLOP forward. Achieved GFLOP/s assume backward = 2 × forward, i.e.
             3 × forward / median step time; recomputation is not counted as useful work.

Output: a table and, with --json FILE, a list of records {workload, variant, threads, median_s, q1_s,
q3_s, repeats, saved_bytes, peak_bytes, flops (forward FLOPs per step), step_flops (3 × flops),
gflops_per_s, loss}.

Run with Debian's interpreter and the C++ benchmark's BLAS/thread settings, e.g.
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_WAIT_POLICY=PASSIVE \\
      GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736 \\
      /usr/bin/python3 bench/peers/gpt_pytorch.py --threads 1 --repeats 10 --json gpt_pytorch.json
Quick smoke run (tiny model; also checks every variant's loss and gradients against plain's, and the
model against tests/gpt/reference.txt in float64):
  /usr/bin/python3 bench/peers/gpt_pytorch.py --small
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import time

from torch_threads import loaded_blas, set_threads

torch = F = checkpoint = None  # imported in main() after OPENBLAS_NUM_THREADS / OMP_NUM_THREADS are set

W3 = dict(V=256, H=256, heads=4, S=512, B=4, L=4)
SMALL = dict(V=256, H=64, heads=4, S=32, B=2, L=2)
VARIANTS = ["plain", "block", "selective", "sdpa"]
BLOCK_PARAMETERS = ["ln1_gain", "ln1_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias",
                    "ln2_gain", "ln2_bias", "fc_weight", "fc_bias", "fc_proj_weight", "fc_proj_bias"]
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpt", "reference.txt")


def forward_flops(V, H, S, B, L, **_):
    """Hand-counted forward FLOPs of one step (see the module docstring)."""
    bs = B * S
    per_block = 2 * bs * H * 3 * H + 2 * bs * H * H + 2 * bs * H * 4 * H * 2 + 2 * 2 * B * S * S * H
    return L * per_block + 2 * bs * H * V


# ----------------------------------------------------------------------------------------------- model

def parameter_shapes(V, H, S, L, **_):
    """(name, rows, cols) of every parameter, in the contract's order."""
    block = {"ln1_gain": (1, H), "ln1_bias": (1, H), "qkv_weight": (H, 3 * H), "qkv_bias": (1, 3 * H),
             "proj_weight": (H, H), "proj_bias": (1, H), "ln2_gain": (1, H), "ln2_bias": (1, H),
             "fc_weight": (H, 4 * H), "fc_bias": (1, 4 * H), "fc_proj_weight": (4 * H, H), "fc_proj_bias": (1, H)}
    shapes = [("token_embedding", V, H), ("position_embedding", S, H)]
    for l in range(L):
        shapes += [(f"block{l}.{name}",) + block[name] for name in BLOCK_PARAMETERS]
    return shapes + [("lnf_gain", 1, H), ("lnf_bias", 1, H), ("head_weight", H, V), ("head_bias", 1, V)]


def make_parameters(cfg, dtype):
    """The contract's deterministic parameters: u = sin(0.731·(i·c + j) + 1.37·n + 0.25)."""
    params = []
    for n, (name, rows, cols) in enumerate(parameter_shapes(**cfg)):
        u = torch.sin(0.731 * torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) + 1.37 * n + 0.25)
        value = 1 + 0.1 * u if name.endswith("_gain") else 0.05 * u if name.endswith("_bias") else 0.2 * u
        params.append(value.to(dtype).requires_grad_())
    return params


def make_inputs(V, S, B, **_):
    r = torch.arange(B * S)
    return (5 * r + 3) % V, (5 * r + 8) % V


class GPT:
    """The docs/gpt.md model on [B·S, H] matrices; `variant` picks where checkpointing goes."""

    def __init__(self, cfg, dtype=None):
        self.cfg = cfg
        self.params = make_parameters(cfg, dtype or torch.float32)
        self.ids, self.targets = make_inputs(**cfg)
        self.positions = torch.arange(cfg["B"] * cfg["S"]) % cfg["S"]
        self.future = torch.ones(cfg["S"], cfg["S"], dtype=torch.bool).triu(1)  # True above the diagonal
        self.saved = None  # a Saved while measuring, to count checkpoint inputs

    def run_checkpoint(self, fn, *args):
        if self.saved is not None:
            for a in args:
                self.saved.add(a)
        return checkpoint(fn, *args, use_reentrant=False)

    def heads(self, t):
        """[B·S, H] (a column slice of qkv) -> [B, heads, S, d], a view."""
        c = self.cfg
        return t.reshape(c["B"], c["S"], c["heads"], c["H"] // c["heads"]).transpose(1, 2)

    def merge(self, y):
        """[B, heads, S, d] -> [B·S, H], head h in columns h·d … h·d + d − 1."""
        return y.transpose(1, 2).reshape(self.cfg["B"] * self.cfg["S"], self.cfg["H"])

    def attention_core(self, q, k, v):
        """Causal softmax attention from q, k, v ([B·S, H] slices) to the output before the projection."""
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        probabilities = torch.softmax(scores.masked_fill(self.future, float("-inf")), dim=-1)
        return self.merge(probabilities @ v)

    def attention_sdpa(self, q, k, v):
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        return self.merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def layer_norm(self, x, gain, bias):
        H = self.cfg["H"]
        return F.layer_norm(x, (H,), gain.reshape(H), bias.reshape(H), 1e-5)

    def block(self, x, p, variant):
        ln1_g, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_g, ln2_b, fc_w, fc_b, fcp_w, fcp_b = p
        H = self.cfg["H"]
        qkv = torch.addmm(qkv_b, self.layer_norm(x, ln1_g, ln1_b), qkv_w)
        q, k, v = qkv[:, :H], qkv[:, H:2 * H], qkv[:, 2 * H:]
        if variant == "selective":
            y = self.run_checkpoint(self.attention_core, q, k, v)
        elif variant == "sdpa":
            y = self.attention_sdpa(q, k, v)
        else:
            y = self.attention_core(q, k, v)
        x = x + torch.addmm(proj_b, y, proj_w)
        hidden = F.gelu(torch.addmm(fc_b, self.layer_norm(x, ln2_g, ln2_b), fc_w), approximate="tanh")
        return x + torch.addmm(fcp_b, hidden, fcp_w)

    def logits(self, variant="plain"):
        p = self.params
        x = F.embedding(self.ids, p[0]) + F.embedding(self.positions, p[1])
        n = len(BLOCK_PARAMETERS)
        for l in range(self.cfg["L"]):
            block_params = p[2 + n * l: 2 + n * (l + 1)]
            if variant == "block":
                x = self.run_checkpoint(lambda x, bp=block_params: self.block(x, bp, "plain"), x)
            else:
                x = self.block(x, block_params, variant)
        lnf_g, lnf_b, head_w, head_b = p[-4:]
        return torch.addmm(head_b, self.layer_norm(x, lnf_g, lnf_b), head_w)

    def step(self, variant, saved=None):
        """One training step without optimizer: loss and all gradients. Returns the loss."""
        for q in self.params:
            q.grad = None
        if saved is not None:
            self.saved = saved
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
                loss = F.cross_entropy(self.logits(variant), self.targets)
            self.saved = None
        else:
            loss = F.cross_entropy(self.logits(variant), self.targets)
        loss.backward()
        return loss.item()


class Saved:
    """Counts the bytes of the distinct storages autograd keeps for backward (parameters excluded)."""

    def __init__(self, exclude):
        self.exclude = {t.storage().data_ptr() for t in exclude}
        self.seen = {}

    def add(self, t):
        if isinstance(t, torch.Tensor):
            s = t.storage()
            if s.data_ptr() not in self.exclude:
                self.seen[s.data_ptr()] = s.nbytes()

    def pack(self, t):
        self.add(t)
        return t

    def total(self):
        return sum(self.seen.values())


def peak_bytes(model, variant):
    """(peak, net) bytes of c10's CPU allocator during one step, above those live before it.

    With profile_memory=True the allocator reports every allocation (+bytes) and free (−bytes) made while
    profiling (read here through the private prof.profiler.kineto_results); blocks allocated before
    profiling started are not reported when freed. The events, in time order (stable for equal
    microseconds), are summed: the maximum prefix is the peak, the final sum the net growth (the
    gradients left in .grad, plus the loss)."""
    for q in model.params:
        q.grad = None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        model.step(variant)
    events = [(e.start_us(), i, e.nbytes()) for i, e in enumerate(prof.profiler.kineto_results.events())
              if e.name() == "[memory]" and str(e.device_type()) == "DeviceType.CPU"]
    total = peak = 0
    for _, _, nbytes in sorted(events):
        total += nbytes
        peak = max(peak, total)
    return peak, total


# ----------------------------------------------------------------------------------------------- checks

def read_reference(path):
    """{(V, H, heads, S, B, L): (loss, logits_checksum, [(name, rows, cols, values)])} from reference.txt."""
    configs, current = {}, None
    with open(path) as f:
        lines = [line.split() for line in f if line.strip() and not line.startswith("#")]
    i = 0
    while i < len(lines):
        key = lines[i][0]
        if key == "config":
            current = [None, None, []]
            configs[tuple(int(v) for v in lines[i][1:])] = current
        elif key == "loss":
            current[0] = float(lines[i][1])
        elif key == "logits_checksum":
            current[1] = float(lines[i][1])
        elif key == "grad":
            name, rows, cols = lines[i][1], int(lines[i][2]), int(lines[i][3])
            i += 1
            current[2].append((name, rows, cols, [float(v) for v in lines[i]]))
        i += 1
    return configs


def check_reference(path):
    """The peer's model in float64, every variant that exists, against tests/gpt/reference.txt."""
    worst = 0.0
    for key, (loss, checksum, grads) in read_reference(path).items():
        cfg = dict(zip(("V", "H", "heads", "S", "B", "L"), key))
        for variant in available_variants():
            model = GPT(cfg, torch.float64)
            got = model.step(variant)
            worst = max(worst, abs(got - loss))
            with torch.no_grad():
                worst = max(worst, abs(model.logits().sum().item() - checksum))
            names = [name for name, _, _ in parameter_shapes(**cfg)]
            assert names == [g[0] for g in grads], f"parameter names/order differ for {key}"
            for p, (name, rows, cols, values) in zip(model.params, grads):
                ref = torch.tensor(values, dtype=torch.float64).reshape(rows, cols)
                worst = max(worst, (p.grad - ref).abs().max().item())
    assert worst < 1e-12, f"float64 model differs from {path} by {worst}"
    print(f"float64 model (all variants) vs {os.path.relpath(path)}: max |difference| {worst:.3g}")


def check_variants(cfg):
    """Every variant's float32 loss and gradients against plain's (same parameters)."""
    model = GPT(cfg)
    model.step("plain")
    loss, grads = model.step("plain"), [q.grad.clone() for q in model.params]
    for variant in available_variants()[1:]:
        got = model.step(variant)
        err = max((q.grad - g).abs().max().item() / (g.abs().max().item() + 1e-30)
                  for q, g in zip(model.params, grads))
        assert abs(got - loss) < 1e-5 * abs(loss) and err < 1e-4, (variant, got, loss, err)
        print(f"{variant:10s} vs plain (float32): loss {got:.7f} vs {loss:.7f}, "
              f"max relative gradient difference {err:.3g}")


def available_variants(requested=VARIANTS):
    return [v for v in requested if v != "sdpa" or hasattr(F, "scaled_dot_product_attention")]


# ----------------------------------------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=10, help="timed repetitions (each runs every variant once)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps of each variant before timing")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=1, help="seed of the per-repetition variant order")
    parser.add_argument("--small", action="store_true",
                        help=f"tiny configuration {SMALL} instead of W3, plus correctness checks")
    parser.add_argument("--no-peak", action="store_true", help="skip the profiler step measuring peak bytes")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    # Debian's torch calls the system libblas.so.3 (OpenBLAS, pthreads build): it reads
    # OPENBLAS_NUM_THREADS when it loads, so set it (and OpenMP's) before importing torch.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    global torch, F, checkpoint
    import torch as torch_module
    import torch.nn.functional as functional
    from torch.utils.checkpoint import checkpoint as checkpoint_function
    torch, F, checkpoint = torch_module, functional, checkpoint_function
    set_threads(args.threads)

    cfg, workload = (SMALL, "W3-small") if args.small else (W3, "W3")
    flops = forward_flops(**cfg)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, BLAS mapped: {', '.join(loaded_blas())}")
    print(f"{workload}: {cfg}, float32, forward {flops / 1e9:.3f} GFLOP/step (hand count), "
          f"GFLOP/s below assume a step = 3 × forward")
    requested = args.variants.split(",")
    unknown = set(requested) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    if "sdpa" in requested and "sdpa" not in available_variants(requested):
        print(f"sdpa: skipped, torch {torch.__version__} has no F.scaled_dot_product_attention (added in torch 2.0)")
    variants = available_variants(requested)
    if args.small:
        check_reference(REFERENCE)
        check_variants(cfg)

    model = GPT(cfg)
    gradient_bytes = sum(q.numel() * q.element_size() for q in model.params)
    info = {}
    for variant in variants:
        start = time.perf_counter()
        saved = Saved(exclude=model.params)
        loss = model.step(variant, saved)
        peak, net = (None, None) if args.no_peak else peak_bytes(model, variant)
        for _ in range(args.warmup):
            model.step(variant)
        info[variant] = dict(saved_bytes=saved.total(), peak_bytes=peak, loss=loss)
        net = "" if net is None else f" (net growth {net} B, gradients {gradient_bytes} B)"
        print(f"  {variant}: measured saved/peak bytes{net} and warmed up in {time.perf_counter() - start:.1f} s",
              flush=True)

    times = {v: [] for v in variants}
    order = list(variants)
    rng = random.Random(args.seed)
    for _ in range(args.repeats):
        rng.shuffle(order)
        for variant in order:
            start = time.perf_counter()
            model.step(variant)
            times[variant].append(time.perf_counter() - start)

    results = []
    print(f"{'variant':10s} {'median s':>9s} {'q1 s':>9s} {'q3 s':>9s} {'GFLOP/s':>8s} "
          f"{'saved MiB':>10s} {'peak MiB':>9s}  loss")
    for variant in variants:
        t = times[variant]
        if len(t) >= 2:
            q1, median, q3 = statistics.quantiles(t, n=4, method="inclusive")
        else:
            q1 = median = q3 = t[0] if t else float("nan")
        i = info[variant]
        row = dict(workload=workload, variant=variant, threads=args.threads, median_s=median, q1_s=q1, q3_s=q3,
                   repeats=len(t), saved_bytes=i["saved_bytes"], peak_bytes=i["peak_bytes"], flops=flops,
                   step_flops=3 * flops, gflops_per_s=3 * flops / median / 1e9, loss=i["loss"])
        results.append(row)
        peak = "-" if i["peak_bytes"] is None else f"{i['peak_bytes'] / 2**20:.2f}"
        print(f"{variant:10s} {median:9.4f} {q1:9.4f} {q3:9.4f} {row['gflops_per_s']:8.2f} "
              f"{i['saved_bytes'] / 2**20:10.2f} {peak:>9s}  {i['loss']:.6f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
