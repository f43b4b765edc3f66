// mean: the mean of all elements.
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct MeanOp : OpBase {
  static constexpr const char* name = "mean";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape*, const Params&) { return {1, 1}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    c.out()(0, 0) =
        sum_row_blocks<T>(x.rows(), x.cols(), 1, [&](Index r0, Index n) { return x.middleRows(r0, n).sum(); }) /
        static_cast<T>(x.size());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Shape s = c.in_shape(0);
    const T g = c.grad_out()(0, 0) / static_cast<T>(s.numel());
    add_grad_rows(c, 0, 1, [&](Index, Index n) { return Matrix<T>::Constant(n, s.cols(), g); });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// y = (1/(mn)) Σᵢⱼ xᵢⱼ. x: [m,n] → [1,1]; dy/dx = 1/(mn) everywhere.
template <class T>
Var<T> mean(const Var<T>& x) {
  return apply_op<detail::MeanOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MeanOp)
