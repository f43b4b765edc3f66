// sum_cols: the sum of each column.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SumColsOp : OpBase {
  static constexpr const char* name = "sum_cols";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "x", in[0], 2);
    return {1, in[0].cols()};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    assign_column_sums<T>(c.out(), c.in(0), false, 1);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const auto g = c.grad_out();
    add_grad_rows(c, 0, 1, [&](Index, Index n) { return g.replicate(n, 1); });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Column sums: yⱼ = Σᵢ xᵢⱼ (a sum over the batch). x: [m,n] → [1,n]; dx broadcasts dy over the m rows.
template <class T>
Var<T> sum_cols(const Var<T>& x) {
  return apply_op<detail::SumColsOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SumColsOp)
