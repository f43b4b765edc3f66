// mean_cols: the mean of each column.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct MeanColsOp : OpBase {
  static constexpr const char* name = "mean_cols";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "x", in[0], 2);
    return {1, in[0].cols()};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    auto y = c.out();
    assign_column_sums<T>(y, x, false, 1);
    y /= T(x.rows());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    GradTarget<T> d = c.grad_target(0);
    const auto g = c.grad_out().row(0).array() / T(d.map.rows());
    // Row by row: replicate() of a quotient would evaluate it into a heap temporary.
    for_row_blocks(d.map.rows(), d.map.cols(), 1, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) assign_or_add(d.map.row(i).array(), g, d.accumulate);
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel() + in[0].cols()); }
};

}  // namespace detail

/// Column means: yⱼ = (1/m) Σᵢ xᵢⱼ. x: [m,n] → [1,n]; dxᵢⱼ = dyⱼ / m.
template <class T>
Var<T> mean_cols(const Var<T>& x) {
  return apply_op<detail::MeanColsOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MeanColsOp)
