// softmax: row-wise softmax, stabilised by subtracting the row maximum.
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct SoftmaxOp : OpBase {
  static constexpr const char* name = "softmax";
  static constexpr OpKind kind = OpKind::normalization;
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_output : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    auto x = c.in(0);
    auto y = c.out();
    for_row_blocks(x.rows(), x.cols(), 15, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) {
        y.row(i).array() = (x.row(i).array() - x.row(i).maxCoeff()).exp();
        y.row(i) /= y.row(i).sum();
      }
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto y = c.out();
    const auto g = c.grad_out();
    GradTarget<T> dx = c.grad_target(0);
    for_row_blocks(y.rows(), y.cols(), 4, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) {
        const T dot = (g.row(i).array() * y.row(i).array()).sum();
        assign_or_add(dx.map.row(i).array(), y.row(i).array() * (g.row(i).array() - dot), dx.accumulate);
      }
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return 15.0 * static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Row-wise softmax: yᵢⱼ = exp(xᵢⱼ − maxⱼ xᵢ) / Σₖ exp(xᵢₖ − maxⱼ xᵢ).
/// dx = y ⊙ (dy − Σⱼ dyⱼ yⱼ) per row. x: [m,n] → [m,n].
template <class T>
Var<T> softmax(const Var<T>& x) {
  return apply_op<detail::SoftmaxOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SoftmaxOp)
