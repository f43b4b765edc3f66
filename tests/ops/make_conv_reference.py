#!/usr/bin/python3
"""Reference values and gradients of remat's convolution, pooling and upsampling ops, for the C++ tests (which never
need torch).

The cases are torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups) in float64 over strides,
paddings, dilations and groups (depthwise included), kernel 1, an output of size 1, and with and without bias;
max_pool2d(x, kernel_size, stride, padding, dilation) (attributes "kernel", "stride", "padding", "dilation"; no
window holds two values within 1e-3 of its maximum, checked, so the gradient is unambiguous); avg_pool2d(x,
kernel_size, stride, padding, count_include_pad) (attributes "kernel", "stride", "padding", "count_include_pad" 0/1);
adaptive_avg_pool2d(x, output_size) (attribute "output_size"); upsample_nearest2d, i.e. F.interpolate(x, size |
scale_factor, mode="nearest", recompute_scale_factor) (attribute "size" (two ints) or "scale_factor" (two floats),
and "recompute_scale_factor" 0/1).
Inputs, the weight g of the loss sum(out ⊙ g), the checks and the file format are those of
make_nd_reference.py (this script imports them): attributes "stride", "padding", "dilation" (two ints each) and
"groups" (one); the bias, when there is one, is input 2.

Before writing, it gradchecks every case (torch.autograd.gradcheck, float64), checks every conv2d output against an
independent loop over the definition, every upsample_nearest2d output and gradient against PyTorch 1.13's index rules
written out (nearest_source below), and that the text parses back bit-identical. Two upsample_nearest2d cases are
forward-only (their input is "const", without a grad line): there PyTorch 1.13's backward is not its forward's
derivative (nearest_source says why), and remat's backward is the derivative.

Run (from the repository root):
  /usr/bin/python3 tests/ops/make_conv_reference.py           # checks, then writes tests/ops/conv_reference.txt
"""
import argparse
import math
import os
import sys

import numpy as np

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_nd_reference import Case, floats, weight_of, write_reference  # noqa: E402


def conv_case(n, c, h, w, o, kh, kw, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, bias=True):
    inputs = [floats(0, (n, c, h, w)), floats(1, (o, c // groups, kh, kw))]
    if bias:
        inputs.append(floats(2, (o,)))

    def fn(x, wt, b=None):
        return F.conv2d(x, wt, b, stride=stride, padding=padding, dilation=dilation, groups=groups)

    attrs = [("stride", list(stride)), ("padding", list(padding)), ("dilation", list(dilation)), ("groups", [groups])]
    return Case("conv2d", inputs, fn, attrs)


def cases():
    return [
        conv_case(2, 3, 5, 6, 4, 3, 3),                                    # plain 3x3
        conv_case(2, 3, 5, 6, 4, 3, 3, bias=False),
        conv_case(1, 2, 7, 7, 3, 3, 2, stride=(2, 2), padding=(1, 1)),
        conv_case(2, 2, 6, 5, 2, 3, 3, stride=(2, 1), padding=(1, 2)),     # asymmetric
        conv_case(1, 2, 8, 8, 2, 3, 3, dilation=(2, 2), padding=(2, 2)),
        conv_case(1, 3, 7, 6, 2, 2, 3, dilation=(1, 2), stride=(3, 2)),
        conv_case(2, 4, 5, 5, 6, 3, 3, groups=2, padding=(1, 1)),
        conv_case(2, 4, 5, 5, 4, 3, 3, groups=4, padding=(1, 1)),          # depthwise
        conv_case(1, 3, 4, 4, 6, 3, 3, groups=3, stride=(2, 2)),           # depthwise with multiplier 2
        conv_case(2, 3, 4, 5, 5, 1, 1),                                    # kernel 1
        conv_case(2, 3, 4, 5, 5, 1, 1, stride=(2, 2)),
        conv_case(1, 2, 3, 3, 2, 3, 3),                                    # output 1x1
        conv_case(3, 1, 1, 1, 2, 1, 1),                                    # a 1x1 image
        conv_case(1, 1, 5, 5, 1, 5, 5, padding=(0, 0), bias=False),       # kernel covers the image
        # Shapes oneDNN runs on its direct kernels (conv2d_onednn_test.cpp checks that it does): 16 channels,
        # strided, 1x1, depthwise, and a one-channel stem.
        conv_case(2, 16, 6, 6, 16, 3, 3, padding=(1, 1)),
        conv_case(2, 16, 7, 7, 32, 3, 3, stride=(2, 2), padding=(1, 1), bias=False),
        conv_case(2, 16, 6, 6, 32, 1, 1, stride=(2, 2), bias=False),
        conv_case(2, 16, 6, 6, 16, 3, 3, padding=(1, 1), groups=16),
        conv_case(2, 1, 8, 8, 16, 3, 3, padding=(1, 1), bias=False),
    ]


def max_pool_case(shape, kernel, stride, padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    x = floats(0, shape, ramp=0.013)

    def fn(t):
        return F.max_pool2d(t, kernel, stride, padding, dilation, ceil_mode=ceil_mode)

    # "ceil_mode" only when set, so that the cases written before it existed stay byte-identical.
    return Case("max_pool2d", [x], fn, [("kernel", list(kernel)), ("stride", list(stride)),
                                        ("padding", list(padding)), ("dilation", list(dilation))] +
                ([("ceil_mode", [1])] if ceil_mode else []))


def avg_pool_case(shape, kernel, stride, padding=(0, 0), count_include_pad=True, ceil_mode=False):
    def fn(t):
        return F.avg_pool2d(t, kernel, stride, padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad)

    return Case("avg_pool2d", [floats(0, shape)], fn, [("kernel", list(kernel)), ("stride", list(stride)),
                                                       ("padding", list(padding)),
                                                       ("count_include_pad", [int(count_include_pad)])] +
                ([("ceil_mode", [1])] if ceil_mode else []))


def adaptive_case(shape, size):
    return Case("adaptive_avg_pool2d", [floats(0, shape)], lambda t: F.adaptive_avg_pool2d(t, size),
                [("output_size", list(size))])


def pool_cases():
    return [
        max_pool_case((2, 3, 6, 6), (2, 2), (2, 2)),
        max_pool_case((1, 2, 7, 7), (3, 3), (2, 2), (1, 1)),       # ResNet's stem pooling
        max_pool_case((1, 2, 6, 7), (3, 2), (1, 2), (1, 1), (1, 2)),
        max_pool_case((1, 1, 5, 5), (2, 2), (1, 1), (0, 0), (2, 2)),
        max_pool_case((2, 1, 3, 3), (3, 3), (1, 1)),              # output 1x1
        avg_pool_case((2, 3, 6, 6), (2, 2), (2, 2)),
        avg_pool_case((1, 2, 7, 6), (3, 3), (2, 2), (1, 1), True),
        avg_pool_case((1, 2, 7, 6), (3, 3), (2, 2), (1, 1), False),
        avg_pool_case((1, 1, 5, 4), (3, 2), (1, 2), (1, 1), True),
        adaptive_case((2, 3, 5, 7), (1, 1)),                      # global average pooling
        adaptive_case((1, 2, 7, 5), (3, 2)),                      # sizes that do not divide
        adaptive_case((1, 1, 3, 4), (5, 6)),                      # larger than the input: windows overlap
        # ceil_mode (PyTorch's pooling_output_shape): 6x6, k 3, s 2 gives 3 windows, not 2, the last past the
        # input; 5x5, k 2, s 2, p 1 rounds 2.5 up to 4 windows, then drops the last, which would start in the right
        # padding (3, as without ceil_mode); 4x4, k 3, s 2, p 1 keeps its rounded-up 3 (floor: 2); a dilated
        # window clipped (7x7, k 2, s 3, d 2: 3, floor 2); average windows past the padded input divided by their
        # part inside it, with and without the padding counted.
        max_pool_case((1, 2, 6, 6), (3, 3), (2, 2), ceil_mode=True),
        max_pool_case((1, 1, 5, 5), (2, 2), (2, 2), (1, 1), ceil_mode=True),
        max_pool_case((1, 1, 4, 4), (3, 3), (2, 2), (1, 1), ceil_mode=True),
        max_pool_case((1, 1, 7, 7), (2, 2), (3, 3), (0, 0), (2, 2), ceil_mode=True),
        avg_pool_case((1, 2, 7, 6), (3, 3), (2, 2), (1, 1), True, ceil_mode=True),
        avg_pool_case((1, 2, 7, 6), (3, 3), (2, 2), (1, 1), False, ceil_mode=True),
        avg_pool_case((1, 1, 5, 5), (2, 2), (2, 2), ceil_mode=True),
    ]


class ForwardOnlyCase(Case):
    """A case whose inputs are all "const": its output and weight, no gradient."""

    def evaluate(self):
        out = self.fn(*self.tensors())
        return out.detach(), weight_of(tuple(out.shape)), {}


def upsample_case(shape, size=None, scale_factor=None, recompute_scale_factor=None, forward_only=False):
    """forward_only: PyTorch's backward is not its forward's derivative here (see nearest_source); the input is then
    "const", so the file has no gradient for it (remat's, the forward's derivative, is gradchecked instead)."""
    def fn(t):
        return F.interpolate(t, size=size, scale_factor=scale_factor, mode="nearest",
                             recompute_scale_factor=recompute_scale_factor)

    attrs = [("size", list(size))] if size is not None else [("scale_factor", [float(f) for f in scale_factor])]
    attrs.append(("recompute_scale_factor", [int(bool(recompute_scale_factor))]))
    x, _ = floats(0, shape)
    if forward_only:
        return ForwardOnlyCase("upsample_nearest2d", [(x, "const")], fn, attrs)
    return Case("upsample_nearest2d", [(x, "float")], fn, attrs)


def upsample_cases():
    return [
        upsample_case((2, 3, 3, 4), scale_factor=(2.0, 2.0)),                 # integer scale
        upsample_case((1, 2, 3, 2), scale_factor=(3.0, 3.0)),                 # integer scale 3
        upsample_case((1, 2, 4, 3), scale_factor=(1.5, 2.5)),                 # non-integer scales
        upsample_case((1, 1, 5, 6), scale_factor=(1.1, 1.7)),                 # C = 1: 5 -> 5 copies
        upsample_case((1, 2, 5, 6), scale_factor=(1.1, 1.7), forward_only=True),  # C > 1: 5 -> 5 does not
        upsample_case((1, 2, 5, 4), scale_factor=(1.7, 2.3), recompute_scale_factor=True),
        upsample_case((2, 2, 7, 9), scale_factor=(0.5, 0.4)),                 # downsampling by scale
        upsample_case((1, 1, 3, 6), size=(5, 74)),                            # C = 1: float index at 37 -> 2
        upsample_case((1, 2, 3, 6), size=(5, 74), forward_only=True),         # C > 1: double index at 37 -> 3
        upsample_case((2, 2, 7, 9), size=(3, 4)),                             # downsampling by size
        upsample_case((1, 2, 4, 5), size=(6, 2)),                             # up along H, down along W
        upsample_case((1, 3, 4, 5), size=(1, 1)),                             # output size 1
        upsample_case((3, 2, 1, 1), size=(3, 2)),                             # a 1x1 image
    ]


def nearest_source(dst, size_in, size_out, scale_factor, legacy):
    """The source index PyTorch 1.13's CPU forward reads for a contiguous float64 [N,C,H,W] input
    (aten/src/ATen/native/cpu/UpSampleKernel.cpp). Such an input is also channels-last contiguous when C = 1 or
    H*W = 1 (legacy): then nearest_idx of UpSample.h (float32 arithmetic, with the same-size and double-size
    shortcuts); otherwise HelperInterpNearest (scale and product in float64, rounded to float32 before floorf, no
    shortcuts). The backward, upsample_nearest2d_backward, always uses nearest_idx: where the two differ its gradient
    is not the forward's derivative. scale_factor None: in/out."""
    real = np.float64
    if legacy:
        if size_out == size_in:
            return dst
        if size_out == 2 * size_in:
            return dst >> 1
        real = np.float32
    if scale_factor is not None and scale_factor > 0:
        scale = real(1.0 / scale_factor)
    else:
        scale = real(size_in) / real(size_out)
    return min(int(math.floor(np.float32(scale * real(dst)))), size_in - 1)


def check_upsample(case):
    """The output gathers x at nearest_source; the gradient of sum(y * g) scatters g back with sums, except in the
    forward_only cases, where PyTorch's differs (checked: that is why they are forward_only)."""
    attrs = dict(case.attrs)
    x = case.tensors()[0]
    n, c, h, w = x.shape
    xg = x.detach().clone().requires_grad_()
    out = case.fn(xg)
    g = weight_of(tuple(out.shape))
    (torch_dx,) = torch.autograd.grad((out * g).sum(), [xg])
    oh, ow = out.shape[2], out.shape[3]
    if "size" in attrs:
        assert [oh, ow] == attrs["size"]
        sh = sw = None
    else:
        sh, sw = attrs["scale_factor"]
        assert [oh, ow] == [math.floor(h * sh), math.floor(w * sw)]
        if attrs["recompute_scale_factor"][0]:
            sh = sw = None
    legacy = c == 1 or h * w == 1
    rows = [nearest_source(i, h, oh, sh, legacy) for i in range(oh)]
    cols = [nearest_source(j, w, ow, sw, legacy) for j in range(ow)]
    assert torch.equal(out.detach(), x[:, :, rows][:, :, :, cols]), attrs
    dx = torch.zeros_like(x)
    for i in range(oh):
        for j in range(ow):
            dx[:, :, rows[i], cols[j]] += g[:, :, i, j]
    assert torch.allclose(torch_dx, dx, rtol=0, atol=1e-15) == bool(case.differentiable()), attrs


def window_gaps(case):
    """Asserts no max_pool2d window holds two values within 1e-3 (ties would make the gradient ambiguous)."""
    attrs = dict(case.attrs)
    x = case.tensors()[0]
    k, s, p, d = attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"]
    unfold = F.unfold(F.pad(x, (p[1], p[1], p[0], p[0]), value=-1e9), k, dilation=d, stride=s)
    n, c = x.shape[0], x.shape[1]
    windows = unfold.reshape(n, c, k[0] * k[1], -1)
    top = windows.topk(2, dim=2).values
    assert ((top[:, :, 0] - top[:, :, 1]) >= 1e-3).all(), attrs


def loops(x, w, b, stride, padding, dilation, groups):
    """conv2d by its definition, one output element at a time."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = torch.zeros(n, o, oh, ow, dtype=torch.float64)
    og = o // groups
    for s in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(oh):
                for j in range(ow):
                    acc = b[oc].item() if b is not None else 0.0
                    for ci in range(cg):
                        for a in range(kh):
                            for bb in range(kw):
                                yy = i * stride[0] - padding[0] + a * dilation[0]
                                xx = j * stride[1] - padding[1] + bb * dilation[1]
                                if 0 <= yy < h and 0 <= xx < wd:
                                    acc += w[oc, ci, a, bb].item() * x[s, g * cg + ci, yy, xx].item()
                    y[s, oc, i, j] = acc
    return y


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="tests/ops/conv_reference.txt")
    args = parser.parse_args()
    torch.set_num_threads(1)

    all_cases = cases() + pool_cases() + upsample_cases()
    for case in all_cases:
        assert not case.differentiable() or case.gradcheck(), (case.name, case.attrs)
        if case.name == "max_pool2d":
            window_gaps(case)
        if case.name == "upsample_nearest2d":
            check_upsample(case)
        if case.name != "conv2d":
            continue
        attrs = dict(case.attrs)
        t = case.tensors()
        expected = loops(t[0], t[1], t[2] if len(t) > 2 else None, attrs["stride"], attrs["padding"],
                         attrs["dilation"], attrs["groups"][0])
        assert torch.allclose(case.fn(*t), expected, rtol=0, atol=1e-13), attrs
    print(f"gradcheck: all {len(all_cases)} cases ok; conv2d against the definition's loops; max_pool2d windows "
          f"without near-ties; upsample_nearest2d against ATen's index rules")

    write_reference(args.output, "tests/ops/make_conv_reference.py", [
        "Reference values and gradients of remat's conv2d, pooling and upsample ops (float64, torch.nn.functional);",
        "format and inputs: see make_nd_reference.py's docstring",
    ], all_cases)


if __name__ == "__main__":
    sys.exit(main())
