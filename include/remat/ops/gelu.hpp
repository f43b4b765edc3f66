// gelu: Gaussian error linear unit, tanh approximation (Hendrycks & Gimpel 2016, eq. for GELU ≈).
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct GeluOp : UnaryElementwise<GeluOp> {
  static constexpr const char* name = "gelu";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 20;
  static constexpr double k = 0.7978845608028654;  // √(2/π)
  static constexpr double c = 0.044715;
  template <class X>
  static auto value(const X& x, const Params&) {
    using T = typename X::Scalar;
    return T(0.5) * x * (T(1) + (T(k) * (x + T(c) * x.cube())).tanh());
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    using T = typename X::Scalar;
    const auto t = (T(k) * (x + T(c) * x.cube())).tanh();
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t.square()) * T(k) * (T(1) + T(3 * c) * x.square()));
  }
};

}  // namespace detail

/// y = ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))), the tanh form of GELU (Hendrycks & Gimpel 2016);
/// with t = tanh(√(2/π)(x + 0.044715x³)), dy/dx = ½(1 + t) + ½ x (1 − t²) √(2/π) (1 + 3·0.044715 x²).
/// x: [m,n] → [m,n].
template <class T>
Var<T> gelu(const Var<T>& x) {
  return apply_op<detail::GeluOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::GeluOp)
