// leaky_relu: elementwise y = x for x > 0, negative_slope · x otherwise (F.leaky_relu).
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct LeakyReluOp : UnaryElementwise<LeakyReluOp> {
  static constexpr const char* name = "leaky_relu";
  static constexpr unsigned residuals = reads_input0;
  static constexpr unsigned sign_reads = reads_input0;  // the derivative reads it only through > 0
  static constexpr double flops_per_element = 2;
  struct Params {
    double negative_slope = 0.01;
  };
  template <class X>
  static auto value(const X& x, const Params& p) {
    using T = typename X::Scalar;
    return (x > T(0)).select(x, x * T(p.negative_slope));
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params& p) {
    using T = typename X::Scalar;
    return (x > T(0)).select(g, g * T(p.negative_slope));
  }
};

}  // namespace detail

/// F.leaky_relu(x, negative_slope): y = x where x > 0, negative_slope · x elsewhere. dy/dx = 1 where x > 0,
/// negative_slope elsewhere (at 0 too, as PyTorch). x: any shape → x's shape. Keeps x as its residual, read only
/// through x > 0 (Compression::sign() may store it in one bit an element).
template <class T>
Var<T> leaky_relu(const Var<T>& x, double negative_slope = 0.01) {
  return apply_op<detail::LeakyReluOp>(detail::LeakyReluOp::Params{negative_slope}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::LeakyReluOp)
