// mse_loss: mean squared error.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct MseLossOp : OpBase {
  static constexpr const char* name = "mse_loss";
  static constexpr OpKind kind = OpKind::loss;
  static unsigned reads(GradInputs g) { return g ? reads_input0 | reads_input1 : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    if (in[0] != in[1])
      throw shape_error("mse_loss: prediction is " + to_string(in[0]) + " but target is " + to_string(in[1]) +
                        "; they must have the same shape");
    return {1, 1};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto a = c.in(0), b = c.in(1);
    const T total = sum_row_blocks<T>(a.rows(), a.cols(), 3, [&](Index r0, Index n) {
      return (a.middleRows(r0, n) - b.middleRows(r0, n)).squaredNorm();
    });
    c.out()(0, 0) = total / static_cast<T>(a.size());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0) && !c.wants_grad(1)) return;
    const T scale = T(2) * c.grad_out()(0, 0) / static_cast<T>(c.in_shape(0).numel());
    const auto a = c.in(0), b = c.in(1);
    add_grad_rows(c, 0, 2, [&](Index r0, Index n) { return scale * (a.middleRows(r0, n) - b.middleRows(r0, n)); });
    add_grad_rows(c, 1, 2, [&](Index r0, Index n) { return scale * (b.middleRows(r0, n) - a.middleRows(r0, n)); });
  }
  static double flops(const Shape* in, int, const Shape&) { return 3.0 * static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// L = (1/(mn)) Σᵢⱼ (predᵢⱼ − targetᵢⱼ)². pred, target: [m,n] → [1,1];
/// dL/dpred = 2 (pred − target) / (mn) = −dL/dtarget. Throws shape_error if the shapes differ.
template <class T>
Var<T> mse_loss(const Var<T>& prediction, const Var<T>& target) {
  return apply_op<detail::MseLossOp>(prediction, target);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MseLossOp)
