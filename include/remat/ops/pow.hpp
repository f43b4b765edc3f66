// pow: x raised to a scalar exponent.
#pragma once

#include <cmath>

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct PowOp : UnaryElementwise<PowOp> {
  static constexpr const char* name = "pow";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 20;
  struct Params {
    double exponent = 1;
  };
  template <class X>
  static auto value(const X& x, const Params& a) {
    using T = typename X::Scalar;
    return x.pow(T(a.exponent));
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params& a) {
    using T = typename X::Scalar;
    return g * T(a.exponent) * x.pow(T(a.exponent - 1));
  }
  // x⁰ = 1 is constant: its derivative is 0 even at x = 0, where p·x^(p−1) would be 0·inf = NaN.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (params_of<Params>(c).exponent == 0)
      c.add_grad(0, Matrix<T>::Zero(c.out_shape().rows(), c.out_shape().cols()));
    else
      UnaryElementwise<PowOp>::backward(c);
  }
};

}  // namespace detail

/// y = x^p elementwise for a scalar exponent p (NaN where x < 0 and p is not an integer, as std::pow);
/// dy/dx = p x^(p−1). x: [m,n] → [m,n]. Throws remat::domain_error if p is not finite.
template <class T>
Var<T> pow(const Var<T>& x, double p) {
  if (!std::isfinite(p)) throw domain_error("pow: the exponent must be finite, got " + std::to_string(p));
  return apply_op<detail::PowOp>(detail::PowOp::Params{p}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::PowOp)
