// sum_rows: the sum of each row.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SumRowsOp : OpBase {
  static constexpr const char* name = "sum_rows";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "x", in[0], 2);
    return {in[0].rows(), 1};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    auto y = c.out();
    for_row_blocks(x.rows(), x.cols(), 1,
                   [&](Index r0, Index n) { y.middleRows(r0, n).noalias() = x.middleRows(r0, n).rowwise().sum(); });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Index cols = c.in_shape(0).cols();
    const auto g = c.grad_out();
    add_grad_rows(c, 0, 1, [&](Index r0, Index n) { return g.middleRows(r0, n).replicate(1, cols); });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Row sums: yᵢ = Σⱼ xᵢⱼ (one value per sample of a batch). x: [m,n] → [m,1]; dy/dx broadcasts the
/// row's gradient over its n columns.
template <class T>
Var<T> sum_rows(const Var<T>& x) {
  return apply_op<detail::SumRowsOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SumRowsOp)
