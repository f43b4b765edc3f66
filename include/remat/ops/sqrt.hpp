// sqrt: elementwise y = √x (NaN for x < 0).
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SqrtOp : UnaryElementwise<SqrtOp> {
  static constexpr const char* name = "sqrt";
  static constexpr unsigned residuals = reads_output;
  static constexpr double flops_per_element = 4;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.sqrt();
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * T(0.5) / y;
  }
};

}  // namespace detail

/// Elementwise y = √x (NaN for x < 0); dy/dx = 1 / (2y).
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> sqrt(const Var<T>& x) {
  return apply_op<detail::SqrtOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SqrtOp)
