// max_pool2d: the maximum of each window of an [N,C,H,W] batch, with PyTorch's semantics; the backward reads each
// window's argmax, kept by the forward as a small integer, not the input.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
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
  /// The backward reads each window's argmax, which the forward keeps in its extra buffer as small integers (one
  /// byte an output for a window of fewer than 255 positions: PyTorch keeps the input and an int64 index), not the
  /// input: a value read by max_pool2d alone is not kept for it, and one stored compressed (a relu's output stored
  /// as its sign) routes the gradient as the exact input did.
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_extra : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& w) { return pool_output_shape(name, in[0], w); }
  /// The argmax of each output, index_bytes(w) bytes each, in whole elements of T.
  template <class T>
  static Shape extra_shape_of(const Shape* in, const Params& w) {
    const Index bytes = output_shape(in, w).numel() * index_bytes(w);
    return {(bytes + Index(sizeof(T)) - 1) / Index(sizeof(T)), 1};
  }

  /// Bytes of one argmax: its position in the window (row-major), or no_position(w) for a window with no position
  /// inside the input: 1 for windows of fewer than 255 positions, 2, 4 or 8 for larger ones.
  static Index index_bytes(const Params& w) {
    const auto positions = static_cast<std::uint64_t>(w.kernel[0]) * static_cast<std::uint64_t>(w.kernel[1]);
    return positions < 0xffu ? 1 : positions < 0xffffu ? 2 : positions < 0xffffffffu ? 4 : 8;
  }
  static std::uint64_t no_position(const Params& w) {
    const Index bytes = index_bytes(w);
    return bytes == 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * bytes)) - 1;
  }

  /// The position in output (oy, ox)'s window (i·kW + j) of its maximum: PyTorch's rule (the first of equal maxima in
  /// row-major window order; a NaN counts as a maximum, the last NaN wins; the first position inside the input when
  /// every value is −∞); −1 for a window with no position inside the input (a dilated window can lie wholly in the
  /// padding), whose output is −∞ and which passes no gradient.
  template <class T>
  static Index argmax(const T* plane, Index h, Index w, const Params& a, Index oy, Index ox) {
    Index best_position = -1;
    T best = -std::numeric_limits<T>::infinity();
    for (Index i = 0; i < a.kernel[0]; ++i) {
      const Index y = oy * a.stride[0] - a.padding[0] + i * a.dilation[0];
      if (y < 0 || y >= h) continue;
      for (Index j = 0; j < a.kernel[1]; ++j) {
        const Index x = ox * a.stride[1] - a.padding[1] + j * a.dilation[1];
        if (x < 0 || x >= w) continue;
        const T v = plane[y * w + x];
        if (best_position < 0) best_position = i * a.kernel[1] + j;
        if (v > best || std::isnan(v)) {
          best = v;
          best_position = i * a.kernel[1] + j;
        }
      }
    }
    return best_position;
  }
  /// The flat index in its H×W plane of window position `p` of output (oy, ox).
  static Index plane_index(Index p, Index w, const Params& a, Index oy, Index ox) {
    const Index i = p / a.kernel[1], j = p % a.kernel[1];
    return (oy * a.stride[0] - a.padding[0] + i * a.dilation[0]) * w + ox * a.stride[1] - a.padding[1] +
           j * a.dilation[1];
  }

  /// Writes v's low `bytes` bytes at `to` (v < 2^(8·bytes)); load_index reads them back.
  static void store_index(unsigned char* to, Index bytes, std::uint64_t v) {
    for (Index k = 0; k < bytes; ++k) to[k] = static_cast<unsigned char>(v >> (8 * k));
  }
  static std::uint64_t load_index(const unsigned char* from, Index bytes) {
    std::uint64_t v = 0;
    for (Index k = 0; k < bytes; ++k) v |= std::uint64_t{from[k]} << (8 * k);
    return v;
  }

  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const T* in = c.in(0).data();
    T* out = c.out().data();
    auto* index = reinterpret_cast<unsigned char*>(c.extra().data());
    const Index bytes = index_bytes(a);
    const std::uint64_t none = no_position(a);
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    for_row_blocks(planes, oh * ow, a.window_elements(), [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p)
        for (Index oy = 0; oy < oh; ++oy)
          for (Index ox = 0; ox < ow; ++ox) {
            const Index at = (p * oh + oy) * ow + ox;
            const Index k = argmax(in + p * h * w, h, w, a, oy, ox);
            out[at] = k >= 0 ? in[p * h * w + plane_index(k, w, a, oy, ox)] : -std::numeric_limits<T>::infinity();
            store_index(index + at * bytes, bytes, k >= 0 ? static_cast<std::uint64_t>(k) : none);
          }
    });
  }

  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const auto* index = reinterpret_cast<const unsigned char*>(c.extra().data());
    const Index bytes = index_bytes(a);
    const std::uint64_t none = no_position(a);
    const T* g = c.grad_out().data();
    GradTarget<T> d = c.grad_target(0);
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    for_row_blocks(planes, oh * ow, a.window_elements(), [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p) {
        T* dx = d.map.data() + p * h * w;
        if (!d.accumulate) std::fill(dx, dx + h * w, T(0));
        for (Index oy = 0; oy < oh; ++oy)
          for (Index ox = 0; ox < ow; ++ox) {
            const Index at = (p * oh + oy) * ow + ox;
            const std::uint64_t k = load_index(index + at * bytes, bytes);
            if (k != none)
              dx[plane_index(static_cast<Index>(k), w, a, oy, ox)] += g[at];  // a window wholly in the padding: nothing
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
/// overlap. Residual: the argmax of each window as its position in the window, in one byte an output (2, 4 or 8 for
/// windows of 255, 65535 or 2^32 − 1 positions and more), rounded up to whole elements of T: N·C·Hout·Wout bytes
/// for the usual windows; not x.
/// Throws shape_error naming max_pool2d for an input that is not [N,C,H,W] or smaller than a window,
/// domain_error for bad options, tape_error for an empty or stale Var.
template <class T>
Var<T> max_pool2d(const Var<T>& x, const MaxPool2dOptions& options) {
  return apply_op<detail::MaxPool2dOp>(detail::max_pool2d_params(options), x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MaxPool2dOp)
