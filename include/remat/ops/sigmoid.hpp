// sigmoid: elementwise y = 1 / (1 + e^(−x)).
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SigmoidOp : UnaryElementwise<SigmoidOp> {
  static constexpr const char* name = "sigmoid";
  static constexpr unsigned residuals = reads_output;
  static constexpr double flops_per_element = 12;
  template <class X>
  static auto value(const X& x, const Params&) {
    using T = typename X::Scalar;
    return (T(1) + (-x).exp()).inverse();
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * y * (T(1) - y);
  }
};

}  // namespace detail

/// Elementwise y = 1 / (1 + e^(−x)); dy/dx = y (1 − y).
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> sigmoid(const Var<T>& x) {
  return apply_op<detail::SigmoidOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SigmoidOp)
