#!/usr/bin/python3
"""Reference values, gradients and running statistics of remat's batch_norm, for the C++ tests (which never need
torch).

Each case is torch.nn.functional.batch_norm(x, running_mean, running_var, weight, bias, training, momentum=0.1,
eps=1e-5) in float64. Inputs, in order: x [N, C, *] (differentiable); weight and bias [C] (differentiable, only
when attribute "affine" is 1; weight gets offset 1); running_mean and running_var [C] ("const": not
differentiable; running_var gets offset 1.2 so it is positive). Attributes: "training" 0/1, "affine" 0/1,
"momentum", "eps", and for training cases "running_mean_after" and "running_var_after", the running statistics
PyTorch leaves after the call (the unbiased batch variance in running_var). Inputs, the weight g of the loss
sum(out ⊙ g), the checks and the file format are those of make_nd_reference.py (this script imports them).

Before writing, it gradchecks every case (torch.autograd.gradcheck, float64), checks the outputs and running
statistics against the definition written out here, and that the text parses back bit-identical.

Run (from the repository root):
  /usr/bin/python3 tests/ops/make_batch_norm_reference.py     # checks, then writes tests/ops/batch_norm_reference.txt
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nd_reference import X, Case, floats, write_reference  # noqa: E402

MOMENTUM, EPS = 0.1, 1e-5


def bn_case(shape, training, affine):
    c = shape[1]
    inputs = [floats(0, shape, scale=2.0)]
    if affine:
        inputs += [floats(1, (c,), offset=1.0), floats(2, (c,))]
    rm, rv = X(3, (c,)), X(4, (c,), offset=1.2)
    inputs += [(rm, "const"), (rv, "const")]

    def fn(x, *rest):
        w, b = (rest[0], rest[1]) if affine else (None, None)
        m, v = rest[-2].clone(), rest[-1].clone()
        return F.batch_norm(x, m, v, w, b, training=training, momentum=MOMENTUM, eps=EPS)

    attrs = [("training", [int(training)]), ("affine", [int(affine)]), ("momentum", [MOMENTUM]), ("eps", [EPS])]
    x = inputs[0][0]
    if training:
        m, v = rm.clone(), rv.clone()
        F.batch_norm(x, m, v, None, None, training=True, momentum=MOMENTUM, eps=EPS)
        attrs += [("running_mean_after", m.tolist()), ("running_var_after", v.tolist())]
    return Case("batch_norm", inputs, fn, attrs)


def cases():
    return [
        bn_case((4, 3, 5, 6), True, True),    # images
        bn_case((3, 2, 4, 4), True, False),   # without weight and bias
        bn_case((2, 3, 7), True, True),       # [N, C, L]
        bn_case((5, 4), True, True),          # [N, C]
        bn_case((1, 2, 3, 3), True, True),    # one sample: statistics over H and W alone
        bn_case((4, 3, 5, 6), False, True),   # evaluation
        bn_case((2, 3, 7), False, False),
    ]


def definition(case):
    """The output and the running statistics from the formulas (biased variance to normalise, unbiased to track)."""
    attrs = dict(case.attrs)
    t = case.tensors()
    x, rm, rv = t[0], t[-2], t[-1]
    w, b = (t[1], t[2]) if attrs["affine"][0] else (torch.ones(x.shape[1]), torch.zeros(x.shape[1]))
    view = [1, -1] + [1] * (x.dim() - 2)
    dims = [d for d in range(x.dim()) if d != 1]
    m = x.shape[0] * x[0, 0].numel()
    if attrs["training"][0]:
        mean, var = x.mean(dims), ((x - x.mean(dims, keepdim=True)) ** 2).mean(dims)
        after = ((1 - MOMENTUM) * rm + MOMENTUM * mean, (1 - MOMENTUM) * rv + MOMENTUM * var * m / (m - 1))
    else:
        mean, var, after = rm, rv, None
    y = (x - mean.view(view)) / torch.sqrt(var.view(view) + EPS) * w.view(view) + b.view(view)
    return y, after


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="tests/ops/batch_norm_reference.txt")
    args = parser.parse_args()
    torch.set_num_threads(1)

    all_cases = cases()
    for case in all_cases:
        assert case.gradcheck(), case.attrs
        attrs = dict(case.attrs)
        y, after = definition(case)
        assert torch.allclose(case.fn(*case.tensors()), y, rtol=0, atol=1e-12), attrs
        if after is not None:
            assert torch.allclose(torch.tensor(attrs["running_mean_after"]), after[0], rtol=0, atol=1e-14)
            assert torch.allclose(torch.tensor(attrs["running_var_after"]), after[1], rtol=0, atol=1e-14)
    print(f"gradcheck: all {len(all_cases)} cases ok; outputs and running statistics against the definition")

    write_reference(args.output, "tests/ops/make_batch_norm_reference.py", [
        "Reference values, gradients and running statistics of remat's batch_norm (float64, F.batch_norm);",
        "format and inputs: see make_batch_norm_reference.py's and make_nd_reference.py's docstrings",
    ], all_cases)


if __name__ == "__main__":
    sys.exit(main())
