#!/usr/bin/python3
"""Reference loss, logits checksum and gradients of the docs/gpt.md model, for the C++ GPT test.

The model is written here from docs/gpt.md alone, as plain functional float64 PyTorch (Debian's
python3-torch 1.13): F.embedding, F.layer_norm (eps 1e-5), x @ W + b with W [in,out], causal softmax
attention (scores q_h k_hᵀ / √d, entries above the diagonal −inf), F.gelu(approximate="tanh"),
F.cross_entropy (mean over the B·S rows), dropout p = 0. Parameters come from the contract's
deterministic formula; inputs are ids[r] = (5·r + 3) mod V and targets[r] = (5·r + 8) mod V for
r in [0, B·S) (the targets are the ids shifted by one row).

Before writing, it checks itself: torch.autograd.gradcheck of the loss with respect to every parameter on
a tiny configuration, the vectorised attention against a naive per-(sequence, head, row) loop, and
causality (changing a later token leaves every earlier row's logits bit-identical).

Output (tests/gpt/reference.txt by default), plain text, one record per line, tokens separated by one space:
  # <comment lines: how the file was generated>
  config <V> <H> <heads> <S> <B> <L>
  loss <%.17g>
  logits_checksum <%.17g>          sum of all B·S·V logits
  grad <name> <rows> <cols>        one per parameter, in contract order, each followed by
  <rows·cols values, %.17g>        one line: the gradient, row-major
Names: token_embedding, position_embedding, block<l>.ln1_gain ... block<l>.fc_proj_bias, lnf_gain,
lnf_bias, head_weight, head_bias. Bias and gain gradients are [1,n].

Run (from the repository root):
  /usr/bin/python3 tests/gpt/make_reference.py            # checks, then writes tests/gpt/reference.txt
  /usr/bin/python3 tests/gpt/make_reference.py --output /tmp/reference.txt
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F

# name, config (V, H, heads, S, B, L)
CONFIGS = [
    ("A", dict(V=32, H=16, heads=2, S=8, B=2, L=1)),
    ("B", dict(V=11, H=6, heads=1, S=1, B=3, L=1)),
    ("C", dict(V=32, H=12, heads=3, S=5, B=2, L=2)),
]

BLOCK_PARAMETERS = ["ln1_gain", "ln1_bias", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias",
                    "ln2_gain", "ln2_bias", "fc_weight", "fc_bias", "fc_proj_weight", "fc_proj_bias"]


def parameter_shapes(V, H, S, L, **_):
    """(name, rows, cols) of every parameter, in the contract's order."""
    shapes = [("token_embedding", V, H), ("position_embedding", S, H)]
    block = {"ln1_gain": (1, H), "ln1_bias": (1, H), "qkv_weight": (H, 3 * H), "qkv_bias": (1, 3 * H),
             "proj_weight": (H, H), "proj_bias": (1, H), "ln2_gain": (1, H), "ln2_bias": (1, H),
             "fc_weight": (H, 4 * H), "fc_bias": (1, 4 * H), "fc_proj_weight": (4 * H, H), "fc_proj_bias": (1, H)}
    for l in range(L):
        shapes += [(f"block{l}.{name}",) + block[name] for name in BLOCK_PARAMETERS]
    shapes += [("lnf_gain", 1, H), ("lnf_bias", 1, H), ("head_weight", H, V), ("head_bias", 1, V)]
    return shapes


def deterministic_parameter(n, name, rows, cols):
    """Element (i, j) of parameter number n: u = sin(0.731·(i·c + j) + 1.37·n + 0.25), scaled by kind."""
    flat = torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols)
    u = torch.sin(0.731 * flat + 1.37 * n + 0.25)
    if name.endswith("_gain"):
        return 1 + 0.1 * u
    if name.endswith("_bias"):
        return 0.05 * u
    return 0.2 * u


def make_parameters(cfg):
    return [deterministic_parameter(n, name, r, c).requires_grad_()
            for n, (name, r, c) in enumerate(parameter_shapes(**cfg))]


def make_inputs(V, S, B, **_):
    r = torch.arange(B * S)
    return (5 * r + 3) % V, (5 * r + 8) % V


def attention(q, k, v, heads, S):
    """Causal multi-head attention on [B·S, H] matrices; head h owns columns h·d … h·d + d − 1."""
    rows, H = q.shape
    B, d = rows // S, H // heads
    q, k, v = (t.reshape(B, S, heads, d).transpose(1, 2) for t in (q, k, v))  # [B, heads, S, d]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v  # [B, heads, S, d]
    return y.transpose(1, 2).reshape(rows, H)


def attention_naive(q, k, v, heads, S):
    """The same attention as explicit loops over sequences, heads and rows (for checking the reshapes)."""
    rows, H = q.shape
    d = H // heads
    out = torch.zeros_like(q)
    for b in range(rows // S):
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            for s in range(S):
                i = b * S + s
                keys = range(b * S, i + 1)  # positions 0 … s of sequence b
                scores = torch.stack([q[i, cols] @ k[j, cols] for j in keys]) / math.sqrt(d)
                weights = torch.exp(scores - scores.max())
                weights = weights / weights.sum()
                out[i, cols] = sum(w * v[j, cols] for w, j in zip(weights, keys))
    return out


def forward(params, ids, cfg, attend=attention):
    """Logits [B·S, V] of the contract's forward pass (p = 0)."""
    V, H, heads, S, B, L = (cfg[key] for key in ("V", "H", "heads", "S", "B", "L"))
    it = iter(params)
    token_embedding, position_embedding = next(it), next(it)
    positions = torch.arange(B * S) % S

    def layer_norm(x, gain, bias):
        return F.layer_norm(x, (H,), gain.reshape(H), bias.reshape(H), 1e-5)

    x = F.embedding(ids, token_embedding) + F.embedding(positions, position_embedding)
    for _ in range(L):
        (ln1_g, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_g, ln2_b,
         fc_w, fc_b, fcp_w, fcp_b) = (next(it) for _ in BLOCK_PARAMETERS)
        qkv = layer_norm(x, ln1_g, ln1_b) @ qkv_w + qkv_b
        q, k, v = qkv[:, :H], qkv[:, H:2 * H], qkv[:, 2 * H:]
        x = x + attend(q, k, v, heads, S) @ proj_w + proj_b
        m = layer_norm(x, ln2_g, ln2_b)
        x = x + F.gelu(m @ fc_w + fc_b, approximate="tanh") @ fcp_w + fcp_b
    lnf_g, lnf_b, head_w, head_b = next(it), next(it), next(it), next(it)
    return layer_norm(x, lnf_g, lnf_b) @ head_w + head_b


def loss_of(params, ids, targets, cfg):
    return F.cross_entropy(forward(params, ids, cfg), targets)


def self_checks():
    """Raises AssertionError if the model code is inconsistent with itself or with autograd."""
    # (a) analytic gradients vs finite differences, every parameter, on a tiny 2-block configuration
    tiny = dict(V=7, H=4, heads=2, S=3, B=2, L=2)
    ids, targets = make_inputs(**tiny)
    params = make_parameters(tiny)
    assert torch.autograd.gradcheck(lambda *p: loss_of(list(p), ids, targets, tiny), tuple(params),
                                    eps=1e-6, atol=1e-7, rtol=1e-5)
    print("gradcheck (V=7 H=4 heads=2 S=3 B=2 L=2, all parameters): ok")

    # (b) the vectorised attention (reshapes, head columns, mask) against explicit loops, config C
    cfg = dict(CONFIGS[2][1])
    ids, _ = make_inputs(**cfg)
    params = [p.detach() for p in make_parameters(cfg)]
    fast, slow = forward(params, ids, cfg), forward(params, ids, cfg, attend=attention_naive)
    err = (fast - slow).abs().max().item()
    assert err < 1e-12, err
    print(f"vectorised vs naive-loop attention (config C): max |difference| {err:.3g}")

    # (c) causality: changing token s of sequence b changes no logits of rows b·S + s' with s' < s,
    #     nor of any other sequence, and does change row b·S + s
    for name, cfg in CONFIGS:
        S, B, V = cfg["S"], cfg["B"], cfg["V"]
        ids, _ = make_inputs(**cfg)
        params = [p.detach() for p in make_parameters(cfg)]
        base = forward(params, ids, cfg)
        for b in range(B):
            for s in range(S):
                changed = ids.clone()
                changed[b * S + s] = (changed[b * S + s] + 1) % V
                logits = forward(params, changed, cfg)
                unaffected = [r for r in range(B * S) if r // S != b or r % S < s]
                assert torch.equal(logits[unaffected], base[unaffected]), (name, b, s)
                assert not torch.equal(logits[b * S + s], base[b * S + s]), (name, b, s)
    print("causality (every position of every config): earlier rows and other sequences bit-identical")


def fmt(x):
    return "%.17g" % x


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="tests/gpt/reference.txt")
    args = parser.parse_args()
    torch.set_num_threads(1)  # results do not depend on it here, but keep runs reproducible
    self_checks()

    lines = [
        "# Reference values of the docs/gpt.md model (float64, deterministic parameters, p = 0),",
        f"# generated by: /usr/bin/python3 tests/gpt/make_reference.py --output {args.output}",
        f"# torch {torch.__version__}, python {sys.version.split()[0]}",
        "# ids[r] = (5r+3) mod V, targets[r] = (5r+8) mod V; format: see the script's docstring",
    ]
    for label, cfg in CONFIGS:
        ids, targets = make_inputs(**cfg)
        params = make_parameters(cfg)
        logits = forward(params, ids, cfg)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        print(f"config {label}: {cfg}  loss {loss.item():.10f}  (log V = {math.log(cfg['V']):.10f})  "
              f"logits_checksum {logits.sum().item():.10f}")
        lines.append("config " + " ".join(str(cfg[k]) for k in ("V", "H", "heads", "S", "B", "L")))
        lines.append("loss " + fmt(loss.item()))
        lines.append("logits_checksum " + fmt(logits.sum().item()))
        for (name, rows, cols), p in zip(parameter_shapes(**cfg), params):
            assert p.grad.shape == (rows, cols)
            lines.append(f"grad {name} {rows} {cols}")
            lines.append(" ".join(fmt(v) for v in p.grad.reshape(-1).tolist()))
    with open(args.output, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    sys.exit(main())
