// square: elementwise y = x².
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SquareOp : UnaryElementwise<SquareOp> {
  static constexpr const char* name = "square";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 1;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.square();
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    using T = typename X::Scalar;
    return T(2) * g * x;
  }
};

}  // namespace detail

/// Elementwise y = x²; dy/dx = 2x.
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> square(const Var<T>& x) {
  return apply_op<detail::SquareOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SquareOp)
