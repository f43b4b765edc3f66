// silu: elementwise y = x · sigmoid(x) (F.silu, the swish of Ramachandran et al. 2017).
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SiluOp : UnaryElementwise<SiluOp> {
  static constexpr const char* name = "silu";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 14;
  template <class X>
  static auto value(const X& x, const Params&) {
    using T = typename X::Scalar;
    return x * (T(1) + (-x).exp()).inverse();
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    using T = typename X::Scalar;
    const auto s = (T(1) + (-x).exp()).inverse();
    return g * s * (T(1) + x * (T(1) - s));
  }
};

}  // namespace detail

/// F.silu(x): y = x σ(x) elementwise with σ(x) = 1/(1 + e^(−x)). dy/dx = σ(x) (1 + x (1 − σ(x))).
/// x: any shape → x's shape. Keeps x as its residual.
template <class T>
Var<T> silu(const Var<T>& x) {
  return apply_op<detail::SiluOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SiluOp)
