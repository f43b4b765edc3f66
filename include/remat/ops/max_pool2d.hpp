// max_pool2d: the maximum of each window of an [N,C,H,W] batch, with PyTorch's semantics; the backward finds the
// maximum again in the input instead of storing its index.
#pragma once

#include <cmath>
#include <limits>

#include "remat/detail/pool_window.hpp"
#include "remat/op.hpp"
#include "remat/ops/conv2d.hpp"

namespace remat {

/// The attributes of max_pool2d, as torch::nn::functional::MaxPool2dFuncOptions: the kernel size, then chained
/// setters for stride (default: the kernel size), padding (default 0, at most half the kernel) and dilation
/// (default 1) and ceil_mode (default false).
struct MaxPool2dOptions {
  /// A window of `kernel_size` (≥ 1), stride equal to it.
  MaxPool2dOptions(Size2 kernel_size) : kernel_(kernel_size), stride_(kernel_size) {}  // NOLINT: as LibTorch's
  MaxPool2dOptions& stride(Size2 s) {                                                  ///< step between windows, ≥ 1
    stride_ = s;
    return *this;
  }
  MaxPool2dOptions& padding(Size2 p) {  ///< implicit −∞ on each side, ≥ 0 and ≤ kernel / 2
    padding_ = p;
    return *this;
  }
  MaxPool2dOptions& dilation(Size2 d) {  ///< spacing between window elements, ≥ 1
    dilation_ = d;
    return *this;
  }
  MaxPool2dOptions& ceil_mode(bool c) {  ///< round the output size up (PyTorch's ceil_mode), default false
    ceil_mode_ = c;
    return *this;
  }
  Size2 kernel_size() const { return kernel_; }  ///< the window
  Size2 stride() const { return stride_; }       ///< the step between windows
  Size2 padding() const { return padding_; }     ///< the padding on each side
  Size2 dilation() const { return dilation_; }   ///< the spacing between window elements
  bool ceil_mode() const { return ceil_mode_; }  ///< whether the output size rounds up

 private:
  Size2 kernel_, stride_, padding_{0}, dilation_{1};
  bool ceil_mode_ = false;
};

namespace detail {

struct MaxPool2dOp : OpBase {
  static constexpr const char* name = "max_pool2d";
  static constexpr OpKind kind = OpKind::reduction;
  using Params = PoolWindow;
  /// The backward finds each window's maximum again: it reads the input, not a stored index.
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_input0 : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& w) { return pool_output_shape(name, in[0], w); }

  /// The flat index in its H×W plane of the maximum of output (oy, ox)'s window: PyTorch's rule (the first of
  /// equal maxima in row-major window order; a NaN counts as a maximum, the last NaN wins; the first position
  /// inside the input when every value is −∞); −1 for a window with no position inside the input (a dilated
  /// window can lie wholly in the padding), whose output is −∞ and which passes no gradient.
  template <class T>
  static Index argmax(const T* plane, Index h, Index w, const Params& a, Index oy, Index ox) {
    Index best_index = -1;
    T best = -std::numeric_limits<T>::infinity();
    for (Index i = 0; i < a.kernel[0]; ++i) {
      const Index y = oy * a.stride[0] - a.padding[0] + i * a.dilation[0];
      if (y < 0 || y >= h) continue;
      for (Index j = 0; j < a.kernel[1]; ++j) {
        const Index x = ox * a.stride[1] - a.padding[1] + j * a.dilation[1];
        if (x < 0 || x >= w) continue;
        const T v = plane[y * w + x];
        if (best_index < 0) best_index = y * w + x;
        if (v > best || std::isnan(v)) {
          best = v;
          best_index = y * w + x;
        }
      }
    }
    return best_index;
  }

  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const T* in = c.in(0).data();
    T* out = c.out().data();
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    for_row_blocks(planes, oh * ow, a.window_elements(), [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p)
        for (Index oy = 0; oy < oh; ++oy)
          for (Index ox = 0; ox < ow; ++ox) {
            const Index k = argmax(in + p * h * w, h, w, a, oy, ox);
            out[(p * oh + oy) * ow + ox] = k >= 0 ? in[p * h * w + k] : -std::numeric_limits<T>::infinity();
          }
    });
  }

  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const T* in = c.in(0).data();
    const T* g = c.grad_out().data();
    GradTarget<T> d = c.grad_target(0);
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    for_row_blocks(planes, oh * ow, a.window_elements(), [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p) {
        T* dx = d.map.data() + p * h * w;
        if (!d.accumulate) std::fill(dx, dx + h * w, T(0));
        for (Index oy = 0; oy < oh; ++oy)
          for (Index ox = 0; ox < ow; ++ox) {
            const Index k = argmax(in + p * h * w, h, w, a, oy, ox);
            if (k >= 0) dx[k] += g[(p * oh + oy) * ow + ox];  // a window wholly in the padding passes nothing
          }
      }
    });
  }

  static double flops(const Shape*, int, const Shape& out, const Params& a) {
    return static_cast<double>(out.numel()) * a.window_elements();
  }
};

inline PoolWindow max_pool2d_params(const MaxPool2dOptions& o) {
  const char* op = MaxPool2dOp::name;
  PoolWindow w;
  w.kernel[0] = pool_int(op, "kernel_size", o.kernel_size().height, 1);
  w.kernel[1] = pool_int(op, "kernel_size", o.kernel_size().width, 1);
  w.stride[0] = pool_int(op, "stride", o.stride().height, 1);
  w.stride[1] = pool_int(op, "stride", o.stride().width, 1);
  w.padding[0] = pool_int(op, "padding", o.padding().height, 0);
  w.padding[1] = pool_int(op, "padding", o.padding().width, 0);
  w.dilation[0] = pool_int(op, "dilation", o.dilation().height, 1);
  w.dilation[1] = pool_int(op, "dilation", o.dilation().width, 1);
  w.ceil_mode = o.ceil_mode();
  check_pool_padding(op, w);
  return w;
}

}  // namespace detail

/// 2-D max pooling, torch.nn.functional.max_pool2d: y[n,c,i,j] = max over the window
/// x[n, c, i·sh − ph + a·dh, j·sw − pw + b·dw], a < kH, b < kW, positions outside the input left out.
/// x: [N, C, H, W] → [N, C, Hout, Wout], Hout = ⌊(H + 2·ph − dh·(kH − 1) − 1) / sh⌋ + 1 (Wout likewise); with
/// ceil_mode the quotient rounds up, less one if the last window would start in the right padding (PyTorch's rule).
/// dx routes each dy to its window's maximum (the first of equal maxima; a NaN is a maximum), summed where windows
/// overlap. The backward finds the maxima again in x, which it therefore keeps (no index buffer is stored).
/// Throws shape_error naming max_pool2d for an input that is not [N,C,H,W] or smaller than a window,
/// domain_error for bad options, tape_error for an empty or stale Var.
template <class T>
Var<T> max_pool2d(const Var<T>& x, const MaxPool2dOptions& options) {
  return apply_op<detail::MaxPool2dOp>(detail::max_pool2d_params(options), x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MaxPool2dOp)
