// relu: elementwise y = max(x, 0).
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct ReluOp : UnaryElementwise<ReluOp> {
  static constexpr const char* name = "relu";
  static constexpr unsigned residuals = reads_output;
  static constexpr unsigned sign_reads = reads_output;  // the derivative reads it only through > 0
  static constexpr double flops_per_element = 1;
  template <class X>
  static auto value(const X& x, const Params&) {
    using T = typename X::Scalar;
    return x.max(T(0));
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * (y > T(0)).template cast<T>();
  }
};

}  // namespace detail

/// Elementwise y = max(x, 0); dy/dx = 1 where y > 0, else 0 (F.relu).
/// x: any shape → x's shape. Keeps y as its residual, read only through y > 0: a policy may store it in one bit an
/// element (Compression::sign()). Throws tape_error for an empty or stale Var.
template <class T>
Var<T> relu(const Var<T>& x) {
  return apply_op<detail::ReluOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ReluOp)
