// avg_pool2d: the mean of each window of an [N,C,H,W] batch, with PyTorch's semantics.
#pragma once

#include <algorithm>

#include "remat/detail/pool_window.hpp"
#include "remat/op.hpp"
#include "remat/ops/conv2d.hpp"

namespace remat {

/// The attributes of avg_pool2d, as torch::nn::functional::AvgPool2dFuncOptions: the kernel size, then chained
/// setters for stride (default: the kernel size), padding (default 0, at most half the kernel), ceil_mode (default
/// false) and count_include_pad (default true: the padding's zeros count in each window's divisor).
struct AvgPool2dOptions {
  /// A window of `kernel_size` (≥ 1), stride equal to it.
  AvgPool2dOptions(Size2 kernel_size) : kernel_(kernel_size), stride_(kernel_size) {}  // NOLINT: as LibTorch's
  AvgPool2dOptions& stride(Size2 s) {                                                  ///< step between windows, ≥ 1
    stride_ = s;
    return *this;
  }
  AvgPool2dOptions& padding(Size2 p) {  ///< implicit zeros on each side, ≥ 0 and ≤ kernel / 2
    padding_ = p;
    return *this;
  }
  AvgPool2dOptions& count_include_pad(bool c) {  ///< whether padded zeros count in the divisor
    count_include_pad_ = c;
    return *this;
  }
  AvgPool2dOptions& ceil_mode(bool c) {  ///< round the output size up (PyTorch's ceil_mode), default false
    ceil_mode_ = c;
    return *this;
  }
  Size2 kernel_size() const { return kernel_; }                  ///< the window
  Size2 stride() const { return stride_; }                       ///< the step between windows
  Size2 padding() const { return padding_; }                     ///< the padding on each side
  bool count_include_pad() const { return count_include_pad_; }  ///< whether padding counts in the divisor
  bool ceil_mode() const { return ceil_mode_; }                  ///< whether the output size rounds up

 private:
  Size2 kernel_, stride_, padding_{0};
  bool count_include_pad_ = true;
  bool ceil_mode_ = false;
};

namespace detail {

struct AvgPool2dOp : OpBase {
  static constexpr const char* name = "avg_pool2d";
  static constexpr OpKind kind = OpKind::reduction;
  struct Params {
    PoolWindow window;
    bool count_include_pad = true;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& a) { return pool_output_shape(name, in[0], a.window); }

  /// Output (oy, ox)'s window: rows [y0, y1), columns [x0, x1) inside the input, and its divisor (PyTorch's:
  /// the window clipped to the padded input, or to the input without count_include_pad).
  struct Window {
    Index y0, y1, x0, x1;
    Index divisor;
  };
  static Window window(const Params& a, Index h, Index w, Index oy, Index ox) {
    const PoolWindow& p = a.window;
    Index y0 = oy * p.stride[0] - p.padding[0], x0 = ox * p.stride[1] - p.padding[1];
    Index y1 = std::min<Index>(y0 + p.kernel[0], h + p.padding[0]);
    Index x1 = std::min<Index>(x0 + p.kernel[1], w + p.padding[1]);
    const Index padded = (y1 - y0) * (x1 - x0);
    y0 = std::max<Index>(y0, 0);
    x0 = std::max<Index>(x0, 0);
    y1 = std::min(y1, h);
    x1 = std::min(x1, w);
    return {y0, y1, x0, x1, a.count_include_pad ? padded : (y1 - y0) * (x1 - x0)};
  }

  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const T* in = c.in(0).data();
    T* out = c.out().data();
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    for_row_blocks(planes, oh * ow, a.window.window_elements(), [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p)
        for (Index oy = 0; oy < oh; ++oy)
          for (Index ox = 0; ox < ow; ++ox) {
            const Window win = window(a, h, w, oy, ox);
            T sum = 0;
            for (Index i = win.y0; i < win.y1; ++i)
              for (Index j = win.x0; j < win.x1; ++j) sum += in[(p * h + i) * w + j];
            out[(p * oh + oy) * ow + ox] = sum / static_cast<T>(win.divisor);
          }
    });
  }

  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const T* g = c.grad_out().data();
    GradTarget<T> d = c.grad_target(0);
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    for_row_blocks(planes, oh * ow, a.window.window_elements(), [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p) {
        T* dx = d.map.data() + p * h * w;
        if (!d.accumulate) std::fill(dx, dx + h * w, T(0));
        for (Index oy = 0; oy < oh; ++oy)
          for (Index ox = 0; ox < ow; ++ox) {
            const Window win = window(a, h, w, oy, ox);
            const T share = g[(p * oh + oy) * ow + ox] / static_cast<T>(win.divisor);
            for (Index i = win.y0; i < win.y1; ++i)
              for (Index j = win.x0; j < win.x1; ++j) dx[i * w + j] += share;
          }
      }
    });
  }

  static double flops(const Shape*, int, const Shape& out, const Params& a) {
    return static_cast<double>(out.numel()) * a.window.window_elements();
  }
};

inline AvgPool2dOp::Params avg_pool2d_params(const AvgPool2dOptions& o) {
  const char* op = AvgPool2dOp::name;
  AvgPool2dOp::Params a;
  a.window.kernel[0] = pool_int(op, "kernel_size", o.kernel_size().height, 1);
  a.window.kernel[1] = pool_int(op, "kernel_size", o.kernel_size().width, 1);
  a.window.stride[0] = pool_int(op, "stride", o.stride().height, 1);
  a.window.stride[1] = pool_int(op, "stride", o.stride().width, 1);
  a.window.padding[0] = pool_int(op, "padding", o.padding().height, 0);
  a.window.padding[1] = pool_int(op, "padding", o.padding().width, 0);
  a.window.ceil_mode = o.ceil_mode();
  check_pool_padding(op, a.window);
  a.count_include_pad = o.count_include_pad();
  return a;
}

}  // namespace detail

/// 2-D average pooling, torch.nn.functional.avg_pool2d (no divisor_override): y[n,c,i,j] = the sum
/// of x over the window at (i·sh − ph, j·sw − pw) of kH × kW, divided by the window's size clipped to the padded
/// input (count_include_pad, the default) or to the input. x: [N, C, H, W] → [N, C, Hout, Wout],
/// Hout = ⌊(H + 2·ph − kH) / sh⌋ + 1 (Wout likewise); with ceil_mode the quotient rounds up, less one if the last
/// window would start in the right padding (PyTorch's rule), and a last window running past the padded input
/// divides by the part of it inside. dx spreads each dy / divisor over its window. Reads no
/// residual. Throws shape_error naming avg_pool2d for an input that is not [N,C,H,W] or smaller than a window,
/// domain_error for bad options, tape_error for an empty or stale Var.
template <class T>
Var<T> avg_pool2d(const Var<T>& x, const AvgPool2dOptions& options) {
  return apply_op<detail::AvgPool2dOp>(detail::avg_pool2d_params(options), x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::AvgPool2dOp)
