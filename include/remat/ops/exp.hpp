// exp: elementwise y = eˣ.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct ExpOp : UnaryElementwise<ExpOp> {
  static constexpr const char* name = "exp";
  static constexpr unsigned residuals = reads_output;
  static constexpr double flops_per_element = 10;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.exp();
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    return g * y;
  }
};

}  // namespace detail

/// Elementwise y = eˣ; dy/dx = y.
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> exp(const Var<T>& x) {
  return apply_op<detail::ExpOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ExpOp)
