// softplus: elementwise y = ln(1 + eˣ), evaluated as max(x, 0) + ln(1 + e^(−|x|)) so that it never overflows.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SoftplusOp : UnaryElementwise<SoftplusOp> {
  static constexpr const char* name = "softplus";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 20;
  template <class X>
  static auto value(const X& x, const Params&) {
    using T = typename X::Scalar;
    return x.max(T(0)) + (-x.abs()).exp().log1p();
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * (T(1) + (-x).exp()).inverse();
  }
};

}  // namespace detail

/// Elementwise y = ln(1 + eˣ), evaluated as max(x, 0) + ln(1 + e^(−|x|)) so that it never overflows; dy/dx =
/// sigmoid(x). x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> softplus(const Var<T>& x) {
  return apply_op<detail::SoftplusOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SoftplusOp)
