// The window geometry shared by the 2-D pooling ops (max_pool2d, avg_pool2d): PyTorch's output size rule and the
// checks of kernel, stride, padding and dilation, with errors naming the op.
#pragma once

#include <climits>
#include <string>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/shape.hpp"

namespace remat::detail {

/// Kernel, stride, padding and dilation along H and W (int32: the op's Params hold them), and ceil_mode.
struct PoolWindow {
  std::int32_t kernel[2] = {1, 1}, stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
  bool ceil_mode = false;  ///< the output size rounds up: a last window may run past the padded input

  /// The window's extent along dimension d (0: H, 1: W): d(k − 1) + 1, in Index (no int32 product overflows).
  Index extent(int d) const { return Index(dilation[d]) * (kernel[d] - 1) + 1; }
  /// Output size along dimension d of an input `size` long, PyTorch's pooling_output_shape:
  /// ⌊(size + 2p − d(k − 1) − 1) / s⌋ + 1, or with ceil_mode ⌈…⌉ + 1 less one if the last window would start in the
  /// right padding or beyond (every window starts inside the input or its left padding).
  Index out(int d, Index size) const {
    const Index span = size + Index(2) * padding[d] - extent(d);  // ≥ 0: pool_output_shape checks it
    if (!ceil_mode) return span / stride[d] + 1;
    Index n = (span + stride[d] - 1) / stride[d] + 1;
    if ((n - 1) * stride[d] >= size + padding[d]) --n;
    return n;
  }
  /// The elements of one window (the kernel's), as the kernels' cost per output element.
  double window_elements() const { return static_cast<double>(kernel[0]) * static_cast<double>(kernel[1]); }
};

/// v as an int32 of at least `least`; throws domain_error naming `op` and `what` otherwise.
inline std::int32_t pool_int(const char* op, const char* what, Index v, Index least) {
  if (v < least || v > INT_MAX)
    throw domain_error(std::string(op) + ": " + what + " is " + std::to_string(v) + "; it must be at least " +
                       std::to_string(least) + " (and below 2^31)");
  return static_cast<std::int32_t>(v);
}

/// Throws domain_error naming `op` unless every padding is at most half its kernel (PyTorch's rule; with a
/// dilation above 1 a window may still lie wholly in the padding, which max_pool2d handles).
inline void check_pool_padding(const char* op, const PoolWindow& w) {
  for (int d = 0; d < 2; ++d)
    if (Index(2) * w.padding[d] > w.kernel[d])
      throw domain_error(std::string(op) + ": padding " + std::to_string(w.padding[d]) + " is more than half the " +
                         "kernel size " + std::to_string(w.kernel[d]) + "; use at most " +
                         std::to_string(w.kernel[d] / 2));
}

/// The [N, C, Hout, Wout] output of a pooling op on x; throws shape_error naming `op` for an input that is not
/// [N,C,H,W] or smaller than a dilated window.
inline Shape pool_output_shape(const char* op, const Shape& x, const PoolWindow& w) {
  if (x.rank() != 4)
    throw shape_error(std::string(op) + ": the input is " + to_string(x) +
                      "; it must be [N,C,H,W] (unsqueeze(x, 0) makes one sample a batch of one)");
  for (int d = 0; d < 2; ++d) {
    const Index extent = x[2 + d] + Index(2) * w.padding[d], window = w.extent(d);
    if (extent < window)
      throw shape_error(std::string(op) + ": the input is " + to_string(x) + "; padded, it is " +
                        std::to_string(extent) + (d == 0 ? " high" : " wide") + ", smaller than the window (" +
                        std::to_string(window) + ")");
  }
  return Shape{x[0], x[1], w.out(0, x[2]), w.out(1, x[3])};
}

}  // namespace remat::detail
