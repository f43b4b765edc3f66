// sin: elementwise y = sin x.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SinOp : UnaryElementwise<SinOp> {
  static constexpr const char* name = "sin";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 10;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.sin();
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    return g * x.cos();
  }
};

}  // namespace detail

/// Elementwise y = sin x; dy/dx = cos x.
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> sin(const Var<T>& x) {
  return apply_op<detail::SinOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SinOp)
