#!/usr/bin/python3
"""Reference values and gradients of remat's N-D ops, for the C++ N-D op tests (which never need torch).

Every case is one op (named by its C++ name) applied to deterministic float64 inputs with PyTorch's semantics
(Debian's python3-torch 1.13), its output, an upstream gradient g of the output's shape, and the gradient of
sum(out ⊙ g) with respect to every differentiable input.

Inputs: float input k (0-based, in argument order), flat row-major element i:
  x_k[i] = scale · 0.8 · sin(0.37 i + 1.3 k + 0.1) + offset
with scale 1 and offset 0 unless the case needs otherwise (offset 1.2 for the inputs of log, sqrt, pow and the
denominator of divide; offset 1 for layer_norm's weight; scale 2–3 or 20 to spread some inputs wider, scale 3
for the graph's x, w and v; max's input adds a ramp 0.05 i, because sin(0.37 i) nearly repeats every 17
elements (0.37 · 17 ≈ 2π) and would leave near-ties). Integer
inputs (cross_entropy's labels, index_select's and gather's indices) and where's 0/1 condition are given per case
and are not differentiable (no grad line). The weight is g[i] = 0.5 · cos(0.23 i + 0.7) over the output's flat
row-major elements; the case "graph" has weight 1.

Semantics worth knowing (all PyTorch's unless said):
  gelu         the tanh form, F.gelu(x, approximate="tanh"), as include/remat/ops/gelu.hpp
               (½ x (1 + tanh(√(2/π)(x + 0.044715 x³)))).
  softplus     beta 1, threshold 20; every input is below the threshold, so the values are the exact ln(1 + eˣ)
               that include/remat/ops/softplus.hpp computes (PyTorch would return x itself above 20).
  linear       remat's convention, as include/remat/ops/linear.hpp: W is [in, out] and y = x @ W + b (NOT
               PyTorch's F.linear, whose weight is [out, in]); x has rank 1–4 with the features last, b is [out].
  matmul       torch.matmul: a 1-D left operand is a row vector [1,k] whose 1 is removed from the result, a 1-D
               right operand a column [k,1] whose 1 is removed; [k]·[k] is a rank-0 dot; batch dims broadcast.
  max          torch.amax over dims; the inputs have no ties (checked), so its gradient goes to the one maximum.
  sum/mean/max attr dims lists the reduced dims as given (negative allowed); "attr dims" with no value reduces
               all dims (rank-0 output when keepdim is 0).
  reshape      attr shape lists the new dims; "attr shape" with no value is the rank-0 shape.
  layer_norm   F.layer_norm(x, normalized_shape, weight, bias, eps): normalised over the trailing dims given by
               attr normalized_shape with the biased variance; weight and bias have shape normalized_shape.
  cross_entropy F.cross_entropy(logits [N,C], labels [N]) with mean reduction; rank-0 output.
  where        torch.where(cond != 0, a, b), cond, a, b broadcast together; cond is a float 0/1 input.
  slice        torch.narrow(x, dim, begin, count).
  gather       torch.gather(x, dim, index); index has x's rank and x's size in every dim but dim.
  index_select torch.index_select(x, dim, index), index rank 1; repeated indices make gradients accumulate.
  maximum, minimum, max, relu, abs, clamp, leaky_relu: no input lies within 1e-3 of a kink or of a tie (checked),
               so every gradient is unambiguous.

The case "graph" (an end-to-end N-D test) is one function of x [2,3,4,5], w [5,6], b [3,1,6], v [2,18,7],
u [2,4,3]:
  h = x @ w + b                       # [2,3,4,6], broadcasting
  y = softmax(h, dim=1)               # over a middle dim
  z = y.permute(0, 2, 1, 3)           # [2,4,3,6]
  r = z.reshape(2, 4, 18)
  p = r @ v                           # batched matmul [2,4,7]
  c = torch.cat([p, u], dim=2)        # [2,4,10]
  loss = (c.sum(dim=1, keepdim=True) ** 2).sum() + c.mean(dim=2).exp().mean() + c.amax(dim=1).sum()
its output is the rank-0 loss, its weight 1, and it has grads for all five inputs.

Before writing, it checks itself: torch.autograd.gradcheck of every case (float64, eps 1e-6) with respect to its
differentiable inputs; the kink and tie distances above (≥ 1e-3); independent formulas for gelu (remat's tanh
form), softplus, linear, matmul (explicit loops over broadcast batch indices), layer_norm, cross_entropy and the
graph; and that the text parses back to exactly the tensors it came from.

Output (tests/ops/nd_reference.txt by default), plain text, one record per line, tokens separated by one space,
floats %.17g:
  # <comment lines: how the file was generated>
  case <name> <n_inputs>
  attr <key> <value...>                zero or more: the op's attributes (ints, floats, int lists)
  input <rank> <d0> ... <d_{rank-1}>   one per input, in argument order, each followed by
  <values, row-major>                  one line (integers for an integer input)
  output <rank> <dims...>              followed by one line of values
  weight                               followed by one line: g, the output's shape
  grad <k> <rank> <dims...>            for each differentiable input k (0-based), followed by one line:
                                       d sum(out ⊙ g) / d input_k
  end
A rank-0 tensor is "input 0" / "output 0" / "grad <k> 0" with one value.

Run (from the repository root):
  /usr/bin/python3 tests/ops/make_nd_reference.py            # checks, then writes tests/ops/nd_reference.txt
  /usr/bin/python3 tests/ops/make_nd_reference.py --output /tmp/nd_reference.txt
"""
import argparse
import itertools
import math
import sys

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
KINK = 1e-3  # minimum distance of a kink or tie


# ---------------------------------------------------------------------------------------------------------------
# inputs


def numel(shape):
    return math.prod(shape)


def X(k, shape, offset=0.0, scale=1.0, ramp=0.0):
    """Float input number k: scale · 0.8 sin(0.37 i + 1.3 k + 0.1) + offset + ramp · i, row-major element i."""
    i = torch.arange(numel(shape), dtype=torch.float64)
    return (scale * 0.8 * torch.sin(0.37 * i + 1.3 * k + 0.1) + offset + ramp * i).reshape(shape)


def weight_of(shape):
    i = torch.arange(numel(shape), dtype=torch.float64)
    return (0.5 * torch.cos(0.23 * i + 0.7)).reshape(shape)


class Case:
    """One record: kinds are "float" (differentiable), "const" (float, not differentiable), "int"."""

    def __init__(self, name, inputs, fn, attrs=(), weight=None):
        self.name, self.inputs, self.fn, self.attrs = name, inputs, fn, list(attrs)
        self.weight = weight

    def tensors(self):
        return [t for t, _ in self.inputs]

    def differentiable(self):
        return [k for k, (_, kind) in enumerate(self.inputs) if kind == "float"]

    def evaluate(self):
        """(output, weight, grads {k: tensor}) with autograd."""
        ts = [t.detach().clone().requires_grad_(kind == "float") for t, kind in self.inputs]
        out = self.fn(*ts)
        g = weight_of(tuple(out.shape)) if self.weight is None else torch.full(out.shape, float(self.weight))
        diff = [ts[k] for k in self.differentiable()]
        grads = torch.autograd.grad((out * g).sum(), diff, allow_unused=True)
        grads = {k: (torch.zeros_like(ts[k]) if gr is None else gr)
                 for k, gr in zip(self.differentiable(), grads)}
        return out.detach(), g, grads

    def gradcheck(self):
        diff = self.differentiable()
        base = self.tensors()

        def f(*d):
            ts = list(base)
            for k, t in zip(diff, d):
                ts[k] = t
            return self.fn(*ts)

        args = tuple(base[k].detach().clone().requires_grad_() for k in diff)
        return torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-5)


def floats(k, shape, **kw):
    return (X(k, shape, **kw), "float")


def ints(values, shape=None):
    t = torch.tensor(values, dtype=torch.int64)
    return (t if shape is None else t.reshape(shape), "int")


# ---------------------------------------------------------------------------------------------------------------
# kink and tie checks (asserted while the cases are built)


def assert_far(distance, what):
    d = float(distance)
    assert d >= KINK, f"{what}: an input lies {d:.3g} from a kink or tie (< {KINK})"


def kink_distance(x, points):
    return min((x - p).abs().min().item() for p in points)


def top_gap(x, dims):
    """Smallest gap between the largest and the second-largest element over the reduced dims (inf if one)."""
    rank = x.dim()
    dims = sorted(d % rank for d in dims) if dims else list(range(rank))
    kept = [d for d in range(rank) if d not in dims]
    y = x.permute(*kept, *dims).reshape(numel([x.shape[d] for d in kept]), -1)
    if y.shape[1] < 2:
        return math.inf
    s = y.sort(dim=1, descending=True).values
    return (s[:, 0] - s[:, 1]).min().item()


# ---------------------------------------------------------------------------------------------------------------
# cases

UNARY_SHAPES = [(7,), (2, 3, 4), (2, 1, 3, 2)]


def unary_cases():
    cases = []
    plain = {
        "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "square": torch.square, "sin": torch.sin,
        "cos": torch.cos, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
        "gelu": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    }
    kinks = {"abs": [0.0], "relu": [0.0]}
    for name, fn in plain.items():
        for shape in UNARY_SHAPES:
            scale = 3.0 if len(shape) == 4 else 1.0
            x = X(0, shape, scale=scale)
            if name in kinks:
                assert_far(kink_distance(x, kinks[name]), f"{name} {shape}")
            cases.append(Case(name, [(x, "float")], fn))
        if name == "exp":  # log and sqrt follow exp, on positive inputs
            for pname, pfn in (("log", torch.log), ("sqrt", torch.sqrt)):
                for shape in UNARY_SHAPES:
                    cases.append(Case(pname, [floats(0, shape, offset=1.2)], pfn))
    for shape, scale in (((7,), 1.0), ((2, 3, 4), 1.0), ((2, 1, 3, 2), 3.0), ((2, 3, 4), 20.0)):
        x = X(0, shape, scale=scale)
        assert x.max().item() < 20 - KINK, "softplus: keep every input below the threshold"
        cases.append(Case("softplus", [(x, "float")], lambda x: F.softplus(x, beta=1, threshold=20),
                          [("beta", [1]), ("threshold", [20])]))
    for slope in (0.01, 0.2):
        for shape in UNARY_SHAPES:
            x = X(0, shape, scale=3.0 if len(shape) == 4 else 1.0)
            assert_far(kink_distance(x, [0.0]), f"leaky_relu {shape}")
            cases.append(Case("leaky_relu", [(x, "float")], lambda x, s=slope: F.leaky_relu(x, s),
                              [("negative_slope", [slope])]))
    for exponent in (3, 0.5):
        for shape in UNARY_SHAPES:
            cases.append(Case("pow", [floats(0, shape, offset=1.2)], lambda x, e=exponent: torch.pow(x, e),
                              [("exponent", [exponent])]))
    for lo, hi in ((-0.3, 0.4), (-0.3, None), (None, 0.4)):
        for shape in UNARY_SHAPES:
            x = X(0, shape, scale=3.0 if len(shape) == 4 else 1.0)
            assert_far(kink_distance(x, [p for p in (lo, hi) if p is not None]), f"clamp {shape}")
            attrs = ([("min", [lo])] if lo is not None else []) + ([("max", [hi])] if hi is not None else [])
            cases.append(Case("clamp", [(x, "float")], lambda x, lo=lo, hi=hi: torch.clamp(x, min=lo, max=hi),
                              attrs))
    return cases


BINARY_SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)), ((2, 1, 4), (3, 1)),
                 ((1, 3, 1, 5), (2, 1, 4, 1)), ((2, 3), ()), ((), (2, 3)), ((3, 1), (1, 4)), ((), ())]


def binary_cases():
    cases = []
    ops = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
           "maximum": torch.maximum, "minimum": torch.minimum}
    for name, fn in ops.items():
        for sa, sb in BINARY_SHAPES:
            a = X(0, sa)
            b = X(1, sb, offset=1.2 if name == "divide" else 0.0)
            if name in ("maximum", "minimum"):
                assert_far((a - b).abs().min(), f"{name} {sa} {sb}")
            cases.append(Case(name, [(a, "float"), (b, "float")], fn))
    return cases


def where_cases():
    cases = []
    for sc, sa, sb in (((2, 1, 4), (2, 3, 4), (4,)), ((2, 3), (2, 3), (2, 3)), ((4,), (2, 3, 1), ()),
                       ((3, 1, 1, 2), (4, 1, 1), (2, 1))):
        cond = torch.tensor([1.0 if i % 3 != 1 else 0.0 for i in range(numel(sc))]).reshape(sc)
        cases.append(Case("where", [(cond, "const"), (X(1, sa), "float"), (X(2, sb), "float")],
                          lambda c, a, b: torch.where(c != 0, a, b)))
    return cases


MATMUL_SHAPES = [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)), ((2, 3, 4), (4, 5)),
                 ((3, 4), (2, 4, 5)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((2, 3, 4), (4,)),
                 ((4,), (2, 4, 5)), ((1, 3, 4), (2, 4, 1))]


def matmul_cases():
    return [Case("matmul", [floats(0, sa), floats(1, sb)], torch.matmul) for sa, sb in MATMUL_SHAPES]


LINEAR_X = [(4,), (2, 4), (2, 3, 4), (2, 1, 3, 4)]


def linear(x, w, b):
    return x @ w + b  # remat's convention: w is [in, out]


def linear_cases():
    return [Case("linear", [floats(0, sx), floats(1, (4, 3)), floats(2, (3,))], linear) for sx in LINEAR_X]


REDUCTIONS = [((5,), [0], 0), ((5,), [-1], 1), ((5,), [], 0), ((2, 3, 4), [1], 0), ((2, 3, 4), [-1], 1),
              ((2, 3, 4), [0, 2], 0), ((2, 3, 4), [0, 2], 1), ((2, 3, 4), [], 0), ((2, 3, 4), [], 1),
              ((2, 3, 1, 4), [1, 3], 1), ((2, 3, 1, 4), [-2], 0), ((2, 3, 1, 4), [0, -1], 0),
              ((2, 3, 1, 4), [-3, -1], 1)]


def reduction_cases():
    cases = []
    ops = {"sum": torch.sum, "mean": torch.mean, "max": torch.amax}
    for name, fn in ops.items():
        for shape, dims, keepdim in REDUCTIONS:
            x = X(0, shape, scale=2.0, ramp=0.05 if name == "max" else 0.0)
            if name == "max":
                assert_far(top_gap(x, dims), f"max {shape} dims {dims}")
            all_dims = tuple(dims) if dims else tuple(range(len(shape)))
            cases.append(Case(name, [(x, "float")],
                              lambda x, f=fn, d=all_dims, kd=keepdim: f(x, dim=d, keepdim=bool(kd)),
                              [("dims", dims), ("keepdim", [keepdim])]))
    return cases


SOFTMAX = [((5,), 0), ((5,), -1), ((2, 3, 4), 0), ((2, 3, 4), 1), ((2, 3, 4), 2), ((2, 3, 4), -2),
           ((2, 3, 1, 4), 1), ((2, 3, 1, 4), 2), ((2, 3, 1, 4), -1), ((2, 3, 1, 4), -4)]


def softmax_cases():
    cases = []
    for name, fn in (("softmax", torch.softmax), ("log_softmax", torch.log_softmax)):
        for shape, dim in SOFTMAX:
            cases.append(Case(name, [floats(0, shape, scale=2.0)], lambda x, f=fn, d=dim: f(x, dim=d),
                              [("dim", [dim])]))
    return cases


LAYER_NORM = [((5,), (5,)), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 4)), ((2, 1, 3, 4), (4,)), ((2, 1, 3, 4), (3, 4))]
EPS = 1e-5


def layer_norm_cases():
    return [Case("layer_norm", [floats(0, sx, scale=2.0, offset=0.3), floats(1, ns, offset=1.0), floats(2, ns)],
                 lambda x, w, b, ns=ns: F.layer_norm(x, ns, w, b, EPS),
                 [("normalized_shape", list(ns)), ("eps", [EPS])]) for sx, ns in LAYER_NORM]


def cross_entropy_cases():
    cases = []
    for n, c in ((4, 5), (3, 7), (1, 3), (5, 2)):
        labels = [(3 * r + 1) % c for r in range(n)]
        cases.append(Case("cross_entropy", [floats(0, (n, c), scale=2.0), ints(labels)], F.cross_entropy))
    return cases


def shape_cases():
    cases = []
    for shape, new in (((2, 3, 4), (4, 6)), ((2, 3, 4), (24,)), ((2, 3, 4), (2, 12, 1)), ((6,), (1, 2, 3, 1)),
                       ((1, 1), ()), ((2, 4, 3, 6), (2, 4, 18))):
        cases.append(Case("reshape", [floats(0, shape)], lambda x, s=new: x.reshape(s), [("shape", list(new))]))
    for shape, start, end in (((2, 3, 4, 5), 1, 2), ((2, 3, 2, 2), 0, -1), ((2, 3, 2, 2), 1, -1),
                              ((2, 3, 4), -2, -1), ((5,), 0, 0), ((2, 1, 3), 0, 1)):
        cases.append(Case("flatten", [floats(0, shape)], lambda x, s=start, e=end: torch.flatten(x, s, e),
                          [("start", [start]), ("end", [end])]))
    for shape, dim in (((2, 1, 3), 1), ((1, 3), 0), ((2, 3, 1), -1), ((1,), 0), ((2, 1, 3, 1), 3)):
        assert shape[dim] == 1
        cases.append(Case("squeeze", [floats(0, shape)], lambda x, d=dim: torch.squeeze(x, d), [("dim", [dim])]))
    for shape, dim in (((2, 3), 0), ((2, 3), 2), ((2, 3), -1), ((2, 3), -3), ((), 0), ((2, 3, 4), 1),
                       ((2, 3, 1, 2), 4)):
        cases.append(Case("unsqueeze", [floats(0, shape)], lambda x, d=dim: torch.unsqueeze(x, d),
                          [("dim", [dim])]))
    for shape, dims in (((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((2, 3, 2, 2), (3, 2, 1, 0)),
                        ((3, 4), (1, 0)), ((5,), (0,))):
        cases.append(Case("permute", [floats(0, shape)], lambda x, d=dims: x.permute(*d), [("dims", list(dims))]))
    for shape, d0, d1 in (((2, 3, 4), 0, 2), ((2, 3, 4), -1, -2), ((2, 3, 2, 2), 1, 3), ((3, 4), 0, 1),
                          ((2, 3), 1, 1)):
        cases.append(Case("transpose", [floats(0, shape)], lambda x, a=d0, b=d1: torch.transpose(x, a, b),
                          [("dim0", [d0]), ("dim1", [d1])]))
    for shapes, dim in ((((2, 3, 4), (2, 1, 4), (2, 2, 4)), 1), (((3,), (2,)), 0), (((2, 3), (2, 5)), -1),
                        (((1, 2, 1, 3), (2, 2, 1, 3)), 0), (((2, 2, 1, 2), (2, 2, 3, 2)), -2)):
        cases.append(Case("concat", [floats(k, s) for k, s in enumerate(shapes)],
                          lambda *xs, d=dim: torch.cat(xs, dim=d), [("dim", [dim])]))
    for shape, n, dim in (((2, 3), 3, 0), ((2, 3), 2, 2), ((2, 3), 2, -1), ((4,), 2, 1), ((2, 1, 3), 3, 1),
                          ((), 3, 0)):
        cases.append(Case("stack", [floats(k, shape) for k in range(n)],
                          lambda *xs, d=dim: torch.stack(xs, dim=d), [("dim", [dim])]))
    for shape, dim, begin, count in (((2, 5, 3), 1, 1, 3), ((2, 5, 3), -1, 0, 2), ((7,), 0, 2, 4),
                                     ((2, 3, 4, 5), 3, 4, 1), ((2, 3, 4, 5), 0, 1, 1), ((3, 4), 0, 0, 3)):
        cases.append(Case("slice", [floats(0, shape)], lambda x, d=dim, b=begin, c=count: torch.narrow(x, d, b, c),
                          [("dim", [dim]), ("begin", [begin]), ("count", [count])]))
    for shape, dim, index in (((5, 3), 0, [4, 0, 4, 2]), ((2, 4, 3), 1, [3, 1, 3]), ((2, 3, 2, 4), -1, [0, 0, 2]),
                              ((6,), 0, [5, 1, 5, 5]), ((2, 3, 4), 0, [1])):
        cases.append(Case("index_select", [floats(0, shape), ints(index)],
                          lambda x, i, d=dim: torch.index_select(x, d, i), [("dim", [dim])]))
    for shape, dim, n in (((3, 4), 1, 5), ((2, 3, 4), 0, 3), ((2, 3, 4), -1, 2), ((6,), 0, 8), ((2, 3, 2, 3), 2, 4)):
        ishape = list(shape)
        ishape[dim] = n
        size = shape[dim]
        index = [(7 * j + 2) % size for j in range(numel(ishape))]  # repeats: gradients accumulate
        cases.append(Case("gather", [floats(0, shape), ints(index, ishape)],
                          lambda x, i, d=dim: torch.gather(x, d, i), [("dim", [dim])]))
    return cases


GRAPH_SHAPES = [(2, 3, 4, 5), (5, 6), (3, 1, 6), (2, 18, 7), (2, 4, 3)]


def graph_c(x, w, b, v, u):
    h = x @ w + b                       # [2,3,4,6], broadcasting
    y = torch.softmax(h, dim=1)         # over a middle dim
    z = y.permute(0, 2, 1, 3)           # [2,4,3,6]
    r = z.reshape(2, 4, 18)
    p = r @ v                           # batched matmul [2,4,7]
    return torch.cat([p, u], dim=2)     # [2,4,10]


def graph(x, w, b, v, u):
    c = graph_c(x, w, b, v, u)
    return (c.sum(dim=1, keepdim=True) ** 2).sum() + c.mean(dim=2).exp().mean() + c.amax(dim=1).sum()


def graph_cases():
    # x, w and v at scale 3: sharper softmaxes, so that c's columns have no near-ties for amax
    inputs = [floats(k, s, scale=3.0 if k in (0, 1, 3) else 1.0) for k, s in enumerate(GRAPH_SHAPES)]
    assert_far(top_gap(graph_c(*[t for t, _ in inputs]), [1]), "graph: c.amax(dim=1)")
    return [Case("graph", inputs, graph, weight=1.0)]


def all_cases():
    return (unary_cases() + binary_cases() + where_cases() + matmul_cases() + linear_cases() + reduction_cases()
            + softmax_cases() + layer_norm_cases() + cross_entropy_cases() + shape_cases() + graph_cases())


# ---------------------------------------------------------------------------------------------------------------
# independent references


def matmul_loops(a, b):
    """torch.matmul's rules written out: promote 1-D operands, broadcast batch dims, loop, drop the added 1s."""
    a2 = a.reshape(1, -1) if a.dim() == 1 else a
    b2 = b.reshape(-1, 1) if b.dim() == 1 else b
    batch_a, batch_b = list(a2.shape[:-2]), list(b2.shape[:-2])
    n = max(len(batch_a), len(batch_b))
    batch_a, batch_b = [1] * (n - len(batch_a)) + batch_a, [1] * (n - len(batch_b)) + batch_b
    batch = [max(p, q) for p, q in zip(batch_a, batch_b)]
    assert all(p in (1, m) and q in (1, m) for p, q, m in zip(batch_a, batch_b, batch))
    a3, b3 = a2.reshape(batch_a + list(a2.shape[-2:])), b2.reshape(batch_b + list(b2.shape[-2:]))
    m, k, p = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    out = torch.zeros(batch + [m, p])
    for idx in itertools.product(*[range(s) for s in batch]):
        ia = tuple(i if s > 1 else 0 for i, s in zip(idx, batch_a))
        ib = tuple(i if s > 1 else 0 for i, s in zip(idx, batch_b))
        for r in range(m):
            for c in range(p):
                out[idx + (r, c)] = sum(a3[ia + (r, j)] * b3[ib + (j, c)] for j in range(k))
    shape = batch + ([m] if a.dim() > 1 else []) + ([p] if b.dim() > 1 else [])
    return out.reshape(shape)


def independent_checks(cases):
    def close(p, q, what, tol=1e-13):
        assert p.shape == q.shape, (what, p.shape, q.shape)
        err = (p - q).abs().max().item() if p.numel() else 0.0
        assert err <= tol * max(1.0, q.abs().max().item()), (what, err)

    k, c = 0.7978845608028654, 0.044715
    for case in cases:
        ts = case.tensors()
        out = case.fn(*ts)
        what = f"{case.name} {[tuple(t.shape) for t in ts]}"
        if case.name == "gelu":
            x = ts[0]
            close(out, 0.5 * x * (1 + torch.tanh(k * (x + c * x ** 3))), what)
        elif case.name == "softplus":
            close(out, torch.log1p(torch.exp(ts[0])), what)
        elif case.name == "matmul":
            close(out, matmul_loops(*ts), what)
        elif case.name == "linear":
            x, w, b = ts
            close(out, torch.einsum("...i,io->...o", x, w) + b, what)
        elif case.name == "layer_norm":
            x, w, b = ts
            dims = tuple(range(-w.dim(), 0))
            mu = x.mean(dim=dims, keepdim=True)
            var = ((x - mu) ** 2).mean(dim=dims, keepdim=True)  # biased
            close(out, (x - mu) / torch.sqrt(var + EPS) * w + b, what, 1e-12)
        elif case.name == "cross_entropy":
            x, labels = ts
            close(out, (torch.logsumexp(x, dim=1) - x[torch.arange(x.shape[0]), labels]).mean(), what)
        elif case.name == "graph":
            x, w, b, v, u = ts
            h = torch.einsum("abcd,de->abce", x, w) + b
            y = torch.exp(h - h.max(dim=1, keepdim=True).values)
            y = y / y.sum(dim=1, keepdim=True)
            r = torch.stack([torch.stack([y[i, :, j, :].reshape(-1) for j in range(4)]) for i in range(2)])
            p = torch.stack([matmul_loops(r[i], v[i]) for i in range(2)])
            cc = torch.cat([p, u], dim=2)
            loss = (cc.sum(dim=1) ** 2).sum() + torch.exp(cc.mean(dim=2)).mean() + cc.max(dim=1).values.sum()
            close(out, loss, what, 1e-12)
    print("independent formulas (gelu tanh form, softplus, matmul loops, linear x@W+b, layer_norm, "
          "cross_entropy, graph): ok")


# ---------------------------------------------------------------------------------------------------------------
# output


def fmt(x):
    return "%.17g" % x


def dims_text(t):
    return " ".join([str(t.dim())] + [str(d) for d in t.shape])


def values_text(t):
    vals = t.reshape(-1).tolist()
    if t.dtype == torch.int64:
        return " ".join(str(v) for v in vals)
    return " ".join(fmt(v) for v in vals)


def attr_text(key, values):
    return " ".join(["attr", key] + [str(v) if isinstance(v, int) else fmt(v) for v in values])


def record(case):
    out, g, grads = case.evaluate()
    lines = [f"case {case.name} {len(case.inputs)}"]
    lines += [attr_text(key, values) for key, values in case.attrs]
    for t, _ in case.inputs:
        lines += ["input " + dims_text(t), values_text(t)]
    lines += ["output " + dims_text(out), values_text(out), "weight", values_text(g)]
    for k in case.differentiable():
        lines += [f"grad {k} " + dims_text(grads[k]), values_text(grads[k])]
    lines.append("end")
    return lines, (out, g, grads)


def parse(lines):
    """Reads the records back: a list of (name, attrs, inputs, output, weight, grads)."""
    records, it = [], iter(l for l in lines if not l.startswith("# "))

    def tensor(header_tokens, integer=False):
        rank = int(header_tokens[0])
        shape = tuple(int(d) for d in header_tokens[1:])
        assert len(shape) == rank
        tokens = next(it).split(" ")
        assert len(tokens) == numel(shape), (shape, len(tokens))
        if integer or all(t.lstrip("-").isdigit() for t in tokens) and integer is None:
            return torch.tensor([int(t) for t in tokens], dtype=torch.int64).reshape(shape)
        return torch.tensor([float(t) for t in tokens]).reshape(shape)

    for line in it:
        head = line.split(" ")
        assert head[0] == "case", line
        name, n = head[1], int(head[2])
        attrs, inputs, grads = [], [], {}
        line = next(it)
        while line.startswith("attr "):
            attrs.append(line.split(" ")[1:])
            line = next(it)
        for _ in range(n):
            head = line.split(" ")
            assert head[0] == "input", line
            inputs.append(tensor(head[1:], integer=None))
            line = next(it)
        head = line.split(" ")
        assert head[0] == "output", line
        out = tensor(head[1:])
        assert next(it) == "weight"
        g = tensor([str(out.dim())] + [str(d) for d in out.shape])
        line = next(it)
        while line.startswith("grad "):
            head = line.split(" ")
            grads[int(head[1])] = tensor(head[2:])
            line = next(it)
        assert line == "end", line
        records.append((name, attrs, inputs, out, g, grads))
    return records


def check_round_trip(lines, cases, results):
    records = parse(lines)
    assert len(records) == len(cases)
    for (name, attrs, inputs, out, g, grads), case, (o, w, gr) in zip(records, cases, results):
        assert name == case.name and len(attrs) == len(case.attrs)
        for t, (ref, kind) in zip(inputs, case.inputs):
            assert t.shape == ref.shape and torch.equal(t.to(ref.dtype), ref), name
            if kind == "int":
                assert t.dtype == torch.int64, name
        assert torch.equal(out, o) and torch.equal(g, w), name
        assert sorted(grads) == case.differentiable(), name
        for k, t in grads.items():
            assert t.shape == case.inputs[k][0].shape and torch.equal(t, gr[k]), (name, k)
    print(f"round trip: the text parses back bit-identical ({len(records)} records)")


def write_reference(path, script, title_lines, cases):
    """Records `cases`, checks that the text parses back bit-identical, and writes it to `path` under the comment
    lines `title_lines`, the command that regenerates it (`script` with --output) and the torch and python
    versions."""
    lines = [f"# {line}" for line in title_lines] + [
        f"# generated by: /usr/bin/python3 {script} --output {path}",
        f"# torch {torch.__version__}, python {sys.version.split()[0]}",
    ]
    results = []
    for case in cases:
        rec, res = record(case)
        lines += rec
        results.append(res)
    check_round_trip(lines, cases, results)
    text = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {path} ({len(text)} bytes)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="tests/ops/nd_reference.txt")
    args = parser.parse_args()
    torch.set_num_threads(1)  # results do not depend on it here, but keep runs reproducible

    cases = all_cases()  # asserts the kink and tie distances
    print(f"kinks and ties: every input of abs, relu, leaky_relu, clamp, maximum, minimum, max and the graph's "
          f"amax is at least {KINK} away", flush=True)
    for case in cases:
        assert case.gradcheck(), case.name
    print(f"gradcheck: all {len(cases)} cases ok")
    independent_checks(cases)

    counts = {}
    for case in cases:
        counts[case.name] = counts.get(case.name, 0) + 1
    print("cases:", " ".join(f"{name} {n}" for name, n in counts.items()), f"(total {len(cases)})")
    write_reference(args.output, "tests/ops/make_nd_reference.py", [
        "Reference values and gradients of remat's N-D ops (float64, PyTorch semantics; gelu is the tanh form,",
        "linear is x @ W + b with W [in,out]); format and inputs: see the script's docstring",
    ], cases)

if __name__ == "__main__":
    sys.exit(main())
