// detach: the value of x with no gradient flowing back (jax.lax.stop_gradient, torch.Tensor.detach).
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct DetachOp : OpBase {
  static constexpr const char* name = "detach";
  static constexpr OpKind kind = OpKind::data_movement;
  /// Its output requires no gradient, so the sweep never reaches its backward.
  static constexpr bool stops_gradient = true;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out() = c.in(0);
  }
  template <class T>
  static void backward(const BackwardContext<T>&) {}
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// y = x with dy/dx = 0: a copy of x's value that requires no gradient (stop_gradient). Values computed
/// from y alone need no gradient either, so their backwards keep no residuals. x: [m,n] → [m,n].
template <class T>
Var<T> detach(const Var<T>& x) {
  return apply_op<detail::DetachOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::DetachOp)
