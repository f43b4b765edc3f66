// adaptive_avg_pool2d: the mean over PyTorch's adaptive windows, any output size (1×1 is global average pooling).
#pragma once

#include <algorithm>
#include <string>

#include "remat/op.hpp"
#include "remat/ops/conv2d.hpp"

namespace remat {
namespace detail {

struct AdaptiveAvgPool2dOp : OpBase {
  static constexpr const char* name = "adaptive_avg_pool2d";
  static constexpr OpKind kind = OpKind::reduction;
  struct Params {
    Index out_h = 1, out_w = 1;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& a) {
    const Shape& x = in[0];
    if (x.rank() != 4)
      throw shape_error(std::string(name) + ": the input is " + to_string(x) +
                        "; it must be [N,C,H,W] (unsqueeze(x, 0) makes one sample a batch of one)");
    return Shape{x[0], x[1], a.out_h, a.out_w};
  }
  /// Output i of `out` over `size`: [⌊i·size/out⌋, ⌈(i + 1)·size/out⌉), PyTorch's start_index and end_index.
  static Index begin(Index i, Index out, Index size) { return (i * size) / out; }
  static Index end(Index i, Index out, Index size) { return ((i + 1) * size + out - 1) / out; }

  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Shape x = c.in_shape(0);
    const Params a = params_of<Params>(c);
    const T* in = c.in(0).data();
    T* out = c.out().data();
    const Index planes = x[0] * x[1], h = x[2], w = x[3];
    for_row_blocks(planes, a.out_h * a.out_w, static_cast<double>(h * w) / static_cast<double>(a.out_h * a.out_w) + 1,
                   [&](Index p0, Index count) {
                     for (Index p = p0; p < p0 + count; ++p)
                       for (Index oy = 0; oy < a.out_h; ++oy)
                         for (Index ox = 0; ox < a.out_w; ++ox) {
                           const Index y0 = begin(oy, a.out_h, h), y1 = end(oy, a.out_h, h);
                           const Index x0 = begin(ox, a.out_w, w), x1 = end(ox, a.out_w, w);
                           T sum = 0;
                           for (Index i = y0; i < y1; ++i)
                             for (Index j = x0; j < x1; ++j) sum += in[(p * h + i) * w + j];
                           out[(p * a.out_h + oy) * a.out_w + ox] = sum / static_cast<T>((y1 - y0) * (x1 - x0));
                         }
                   });
  }

  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Shape x = c.in_shape(0);
    const Params a = params_of<Params>(c);
    const T* g = c.grad_out().data();
    GradTarget<T> d = c.grad_target(0);
    const Index planes = x[0] * x[1], h = x[2], w = x[3];
    for_row_blocks(planes, a.out_h * a.out_w, static_cast<double>(h * w) / static_cast<double>(a.out_h * a.out_w) + 1,
                   [&](Index p0, Index count) {
                     for (Index p = p0; p < p0 + count; ++p) {
                       T* dx = d.map.data() + p * h * w;
                       if (!d.accumulate) std::fill(dx, dx + h * w, T(0));
                       for (Index oy = 0; oy < a.out_h; ++oy)
                         for (Index ox = 0; ox < a.out_w; ++ox) {
                           const Index y0 = begin(oy, a.out_h, h), y1 = end(oy, a.out_h, h);
                           const Index x0 = begin(ox, a.out_w, w), x1 = end(ox, a.out_w, w);
                           const T share = g[(p * a.out_h + oy) * a.out_w + ox] / static_cast<T>((y1 - y0) * (x1 - x0));
                           for (Index i = y0; i < y1; ++i)
                             for (Index j = x0; j < x1; ++j) dx[i * w + j] += share;
                         }
                     }
                   });
  }

  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// torch.nn.functional.adaptive_avg_pool2d: output (i, j) is the mean of x over rows [⌊i·H/Hout⌋, ⌈(i+1)·H/Hout⌉)
/// and columns [⌊j·W/Wout⌋, ⌈(j+1)·W/Wout⌉) (windows may overlap when the size does not divide). x: [N, C, H, W] →
/// [N, C, Hout, Wout]; output_size {1, 1} is global average pooling. dx spreads each dy over its window divided by
/// the window's size. Reads no residual. Throws shape_error naming adaptive_avg_pool2d for an input that is not
/// [N,C,H,W], domain_error for an output size below 1, tape_error for an empty or stale Var.
template <class T>
Var<T> adaptive_avg_pool2d(const Var<T>& x, Size2 output_size) {
  if (output_size.height < 1 || output_size.width < 1)
    throw domain_error("adaptive_avg_pool2d: the output size is [" + std::to_string(output_size.height) + "," +
                       std::to_string(output_size.width) + "]; both must be at least 1");
  return apply_op<detail::AdaptiveAvgPool2dOp>(
      detail::AdaptiveAvgPool2dOp::Params{output_size.height, output_size.width}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::AdaptiveAvgPool2dOp)
