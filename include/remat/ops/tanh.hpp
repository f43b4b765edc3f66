// tanh: elementwise y = tanh x.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct TanhOp : UnaryElementwise<TanhOp> {
  static constexpr const char* name = "tanh";
  static constexpr unsigned residuals = reads_output;
  static constexpr double flops_per_element = 10;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.tanh();
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * (T(1) - y.square());
  }
};

}  // namespace detail

/// Elementwise y = tanh x; dy/dx = 1 − y².
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> tanh(const Var<T>& x) {
  return apply_op<detail::TanhOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::TanhOp)
