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

After them, the cases "batch_norm2d_step": two runs of the module torch.nn.BatchNorm2d(3, eps=1e-5, momentum)
in float64, one with momentum=None (the cumulative moving average: each training forward first adds 1 to
num_batches_tracked, then updates the running statistics with weight 1/num_batches_tracked) and one with the
default momentum 0.1, four cases each, in order: steps 1–3 in training (module.train()), step 4 in evaluation
(module.eval()), each a forward and a backward of sum(out ⊙ g) on a new input x [2, 3, 4, 5] (input 10 + step of
make_nd_reference.py with scale 1 + 0.5·step and offset 0.4·step − 0.6). The module starts as PyTorch makes it
(running_mean 0, running_var 1, num_batches_tracked 0) but for weight = input 1 + 1 and bias = input 2 (as the
cases above); no optimizer step, so weight and bias stay. Each step records: inputs x (differentiable), weight
and bias (differentiable: the module's, the same every step), running_mean and running_var ("const": the module's
before the step); attributes "step" (1–4), "training" 0/1, "momentum" (no value: None), "eps",
"num_batches_tracked_after", "running_mean_after", "running_var_after" (the module's after the step); the output,
g, and the gradients of x, weight and bias of that step alone (no accumulation across steps). A test carries one
module through its four steps and compares to every record; the recorded "before" statistics are the previous
step's "after".

Before writing, it gradchecks every case (torch.autograd.gradcheck, float64; a module step through
F.batch_norm with the update weight the module used), checks the outputs and running statistics against the
definition written out here (for momentum None: the running statistics after step n are the mean of the n batch
means and of the n unbiased batch variances), checks that each module step equals F.batch_norm on the recorded
inputs bitwise, and that the text parses back bit-identical.

Run (from the repository root):
  /usr/bin/python3 tests/ops/make_batch_norm_reference.py     # checks, then writes tests/ops/batch_norm_reference.txt
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nd_reference import X, Case, floats, weight_of, write_reference  # noqa: E402

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


STEP_SHAPE = (2, 3, 4, 5)


def step_input(step):
    return X(10 + step, STEP_SHAPE, scale=1.0 + 0.5 * step, offset=0.4 * step - 0.6)


class ModuleStep(Case):
    """One step of an nn.BatchNorm2d run: its output and gradients are the module's (evaluate); fn, the same step
    as F.batch_norm on the recorded inputs with the module's update weight, is what gradcheck differentiates."""

    def __init__(self, inputs, fn, attrs, result):
        super().__init__("batch_norm2d_step", inputs, fn, attrs)
        self.result = result

    def evaluate(self):
        return self.result


def module_run(momentum):
    """The four ModuleSteps of one torch.nn.BatchNorm2d(C, momentum=momentum): three in training, one in eval."""
    c = STEP_SHAPE[1]
    bn = torch.nn.BatchNorm2d(c, eps=EPS, momentum=momentum).double()
    with torch.no_grad():
        bn.weight.copy_(X(1, (c,), offset=1.0))
        bn.bias.copy_(X(2, (c,)))
    steps = []
    for step in (1, 2, 3, 4):
        training = step <= 3
        bn.train(training)
        x = step_input(step)
        inputs = [(x, "float"), (bn.weight.detach().clone(), "float"), (bn.bias.detach().clone(), "float"),
                  (bn.running_mean.clone(), "const"), (bn.running_var.clone(), "const")]
        xv = x.clone().requires_grad_()
        y = bn(xv)
        g = weight_of(tuple(y.shape))
        grads = torch.autograd.grad((y * g).sum(), [xv, bn.weight, bn.bias])
        count = int(bn.num_batches_tracked)
        factor = (1.0 / count if momentum is None else momentum) if training else 0.0

        def fn(x, w, b, rm, rv, training=training, factor=factor):
            return F.batch_norm(x, rm.clone(), rv.clone(), w, b, training=training, momentum=factor, eps=EPS)

        attrs = [("step", [step]), ("training", [int(training)]), ("momentum", [] if momentum is None else [momentum]),
                 ("eps", [EPS]), ("num_batches_tracked_after", [count]),
                 ("running_mean_after", bn.running_mean.tolist()), ("running_var_after", bn.running_var.tolist())]
        steps.append(ModuleStep(inputs, fn, attrs, (y.detach(), g, dict(enumerate(grads)))))
    return steps


def check_module_run(steps, momentum):
    """Each step against F.batch_norm (bitwise) and its running statistics and count against the definition."""
    means, variances = [], []
    mean, var = torch.zeros(STEP_SHAPE[1]), torch.ones(STEP_SHAPE[1])
    for case in steps:
        attrs = dict(case.attrs)
        t = case.tensors()
        x, w, b, rm, rv = t
        out, g, grads = case.result
        assert torch.equal(case.fn(*t), out), attrs["step"]
        _, _, functional = Case.evaluate(case)
        assert all(torch.equal(functional[k], grads[k]) for k in (0, 1, 2)), attrs["step"]
        assert torch.equal(rm, mean) and torch.equal(rv, var), attrs["step"]  # the previous step's "after"
        view, dims = [1, -1, 1, 1], [0, 2, 3]
        if attrs["training"][0]:
            bm, bv = x.mean(dims), ((x - x.mean(dims, keepdim=True)) ** 2).mean(dims)
            m = x.shape[0] * x[0, 0].numel()
            means.append(bm)
            variances.append(bv * m / (m - 1))
            if momentum is None:
                want = (torch.stack(means).mean(0), torch.stack(variances).mean(0))
            else:
                want = ((1 - momentum) * rm + momentum * bm, (1 - momentum) * rv + momentum * variances[-1])
        else:
            bm, bv, want = rm, rv, (rm, rv)
        y = (x - bm.view(view)) / torch.sqrt(bv.view(view) + EPS) * w.view(view) + b.view(view)
        assert torch.allclose(out, y, rtol=0, atol=1e-12), attrs["step"]
        assert attrs["num_batches_tracked_after"] == [len(means)], attrs
        after = (torch.tensor(attrs["running_mean_after"]), torch.tensor(attrs["running_var_after"]))
        assert torch.allclose(after[0], want[0], rtol=0, atol=1e-14), attrs["step"]
        assert torch.allclose(after[1], want[1], rtol=0, atol=1e-14), attrs["step"]
        if not attrs["training"][0]:
            assert torch.equal(after[0], rm) and torch.equal(after[1], rv)
        mean, var = after


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
    module_cases = []
    for momentum in (None, MOMENTUM):
        steps = module_run(momentum)
        check_module_run(steps, momentum)
        for case in steps:
            assert case.gradcheck(), case.attrs
        module_cases += steps
    print(f"nn.BatchNorm2d runs (momentum None and {MOMENTUM}): all {len(module_cases)} steps gradchecked, equal to "
          "F.batch_norm; outputs, running statistics and counts against the definition")

    write_reference(args.output, "tests/ops/make_batch_norm_reference.py", [
        "Reference values, gradients and running statistics of remat's batch_norm (float64, F.batch_norm);",
        "then batch_norm2d_step: nn.BatchNorm2d runs (momentum None and 0.1), 3 training steps and 1 evaluation;",
        "format and inputs: see make_batch_norm_reference.py's and make_nd_reference.py's docstrings",
    ], all_cases + module_cases)


if __name__ == "__main__":
    sys.exit(main())
