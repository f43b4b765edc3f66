// sum: the sum of all elements.
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct SumOp : OpBase {
  static constexpr const char* name = "sum";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape*, const Params&) { return {1, 1}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    c.out()(0, 0) =
        sum_row_blocks<T>(x.rows(), x.cols(), 1, [&](Index r0, Index n) { return x.middleRows(r0, n).sum(); });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Index cols = c.in_shape(0).cols();
    const T g = c.grad_out()(0, 0);
    add_grad_rows(c, 0, 1, [&](Index, Index n) { return Matrix<T>::Constant(n, cols, g); });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// y = Σᵢⱼ xᵢⱼ. x: [m,n] → [1,1]; dy/dx = 1 everywhere.
template <class T>
Var<T> sum(const Var<T>& x) {
  return apply_op<detail::SumOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SumOp)
