// abs: elementwise y = |x|.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct AbsOp : UnaryElementwise<AbsOp> {
  static constexpr const char* name = "abs";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 1;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.abs();
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    return g * x.sign();
  }
};

}  // namespace detail

/// Elementwise y = |x|; dy/dx = sign(x), taken as 0 at x = 0 (a subgradient).
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> abs(const Var<T>& x) {
  return apply_op<detail::AbsOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::AbsOp)
