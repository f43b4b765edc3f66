// cos: elementwise y = cos x.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct CosOp : UnaryElementwise<CosOp> {
  static constexpr const char* name = "cos";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 10;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.cos();
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    return -(g * x.sin());
  }
};

}  // namespace detail

/// Elementwise y = cos x; dy/dx = −sin x.
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> cos(const Var<T>& x) {
  return apply_op<detail::CosOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::CosOp)
