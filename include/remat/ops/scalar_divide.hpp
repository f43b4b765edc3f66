// scalar_divide: y = c / x for a scalar constant c (the c / Var form of division).
#pragma once

#include <cmath>

#include "remat/detail/apply.hpp"
#include "remat/ops/affine.hpp"

namespace remat {
namespace detail {

struct ScalarDivideOp : OpBase {
  static constexpr const char* name = "scalar_divide";
  static constexpr OpKind kind = OpKind::elementwise;
  struct Params {
    double numerator = 1;
  };
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_input0 | reads_output : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out().array() = T(params_of<Params>(c).numerator) / c.in(0).array();
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (c.wants_grad(0)) c.add_grad(0, -(c.grad_out().array() * c.out().array()) / c.in(0).array());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.size()); }
};

}  // namespace detail

/// y = c / x elementwise; dy/dx = −c / x² = −y / x. x: [m,n] → [m,n].
/// Throws remat::domain_error if c is not finite.
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator/(S c, const Var<T>& x) {
  if (!std::isfinite(static_cast<double>(c))) throw domain_error("scalar_divide: the numerator must be finite");
  return apply_op<detail::ScalarDivideOp>(detail::ScalarDivideOp::Params{static_cast<double>(c)}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ScalarDivideOp)
