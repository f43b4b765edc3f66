// max_rows: the largest element of each row.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct MaxRowsOp : OpBase {
  static constexpr const char* name = "max_rows";
  static constexpr OpKind kind = OpKind::reduction;
  /// dx finds each row's first maximum again from x and y.
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_input0 | reads_output : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "x", in[0], 2);
    return {in[0].rows(), 1};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    auto y = c.out();
    for_row_blocks(x.rows(), x.cols(), 1, [&](Index r0, Index n) {
      y.middleRows(r0, n).noalias() = x.middleRows(r0, n).rowwise().maxCoeff();
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto x = c.in(0);
    const auto y = c.out();
    const auto g = c.grad_out();
    GradTarget<T> d = c.grad_target(0);
    for_row_blocks(x.rows(), x.cols(), 1, [&](Index r0, Index n) {
      if (!d.accumulate) d.map.middleRows(r0, n).setZero();
      for (Index i = r0; i < r0 + n; ++i) {
        Index j = 0;
        while (j + 1 < x.cols() && !(x(i, j) == y(i, 0))) ++j;  // the first maximum (NaN rows: column 0)
        d.map(i, j) += g(i, 0);
      }
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Row maxima: yᵢ = maxⱼ xᵢⱼ. x: [m,n] → [m,1]. The gradient goes to each row's first maximum (a
/// subgradient where the maximum is tied, as torch.max(dim) and jnp.max pick one element), 0 elsewhere.
template <class T>
Var<T> max_rows(const Var<T>& x) {
  return apply_op<detail::MaxRowsOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MaxRowsOp)
