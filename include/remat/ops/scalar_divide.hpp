// scalar_divide: y = c / x for a scalar constant c (the c / Var form of division).
#pragma once

#include <cmath>

#include "remat/op.hpp"
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
    const T numerator = T(params_of<Params>(c).numerator);
    const auto x = c.in(0);
    auto y = c.out();
    for_row_blocks(y.rows(), y.cols(), 4,
                   [&](Index r0, Index n) { y.middleRows(r0, n).array() = numerator / x.middleRows(r0, n).array(); });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto g = c.grad_out(), x = c.in(0), y = c.out();
    add_grad_rows(c, 0, 4, [&](Index r0, Index n) {
      return -(g.middleRows(r0, n).array() * y.middleRows(r0, n).array()) / x.middleRows(r0, n).array();
    });
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
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
