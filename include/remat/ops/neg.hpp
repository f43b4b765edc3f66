// neg: elementwise y = −x.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct NegOp : UnaryElementwise<NegOp> {
  static constexpr const char* name = "neg";
  static constexpr unsigned residuals = reads_nothing;
  static constexpr double flops_per_element = 1;
  template <class X>
  static auto value(const X& x, const Params&) {
    return -x;
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y&, const G& g, const Params&) {
    return -g;
  }
};

}  // namespace detail

/// Elementwise y = −x; dy/dx = −1.
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> neg(const Var<T>& x) {
  return apply_op<detail::NegOp>(x);
}

/// −x, the same as neg(x).
template <class T>
Var<T> operator-(const Var<T>& x) {
  return neg(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::NegOp)
