// log_softmax: row-wise log of the softmax, computed stably (log-sum-exp with the row maximum).
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct LogSoftmaxOp : OpBase {
  static constexpr const char* name = "log_softmax";
  static constexpr OpKind kind = OpKind::normalization;
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_output : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    auto x = c.in(0);
    auto y = c.out();
    for_row_blocks(x.rows(), x.cols(), 15, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) {
        const T m = x.row(i).maxCoeff();
        const T lse = m + std::log((x.row(i).array() - m).exp().sum());
        y.row(i).array() = x.row(i).array() - lse;
      }
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto y = c.out();
    const auto g = c.grad_out();
    GradTarget<T> dx = c.grad_target(0);
    for_row_blocks(y.rows(), y.cols(), 12, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) {
        const T total = g.row(i).sum();
        assign_or_add(dx.map.row(i).array(), g.row(i).array() - y.row(i).array().exp() * total, dx.accumulate);
      }
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return 15.0 * static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Row-wise log-softmax: yᵢⱼ = xᵢⱼ − log Σₖ exp(xᵢₖ), evaluated as xᵢⱼ − m − log Σₖ exp(xᵢₖ − m) with
/// m the row maximum, so it neither overflows nor underflows. dx = dy − exp(y) ⊙ Σⱼ dyⱼ per row.
/// x: [m,n] → [m,n].
template <class T>
Var<T> log_softmax(const Var<T>& x) {
  return apply_op<detail::LogSoftmaxOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::LogSoftmaxOp)
