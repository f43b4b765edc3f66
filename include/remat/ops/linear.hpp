// linear: x·W + b with the bias added in the same pass over the output.
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct LinearOp : OpBase {
  static constexpr const char* name = "linear";
  static constexpr OpKind kind = OpKind::dot;
  /// dx reads W, dW reads x, db reads nothing.
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static Shape output_shape(const Shape* in, const Params&) {
    if (in[0].rank() == 0) check_rank(name, "x", in[0], 1);
    check_rank(name, "W", in[1], 2);
    if (in[0].cols() != in[1].rows())
      throw shape_error("linear: x is " + to_string(in[0]) + " but W is " + to_string(in[1]) +
                        "; x.cols must equal W.rows");
    if (in[2].rank() > 2 || in[2].rows() != 1 || in[2].cols() != in[1].cols())
      throw shape_error("linear: W is " + to_string(in[1]) + " but b is " + to_string(in[2]) + "; b must be [1," +
                        std::to_string(in[1].cols()) + "] or [" + std::to_string(in[1].cols()) + "]");
    Shape out = in[0];
    out[out.rank() - 1] = in[1].cols();
    return out;
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    auto out = c.out();
    assign_product(out, c.in(0) * c.in(1));
    const auto b = c.in(2).row(0);
    for_row_blocks(out.rows(), out.cols(), 1, [&](Index r0, Index n) { out.middleRows(r0, n).rowwise() += b; });
  }
  /// The products go to the GEMM (OpenBLAS's threads); db = Σ_rows dy by column_sums on remat's team.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const auto g = c.grad_out();
    if (c.wants_grad(0)) c.add_grad(0, g * c.in(1).transpose());
    if (c.wants_grad(1)) c.add_grad(1, c.in(0).transpose() * g);
    add_grad_column_sums(c, 2, g);
  }
  static double flops(const Shape* in, int, const Shape& out) {
    return 2.0 * static_cast<double>(in[0].rows()) * static_cast<double>(in[0].cols()) *
               static_cast<double>(out.cols()) +
           static_cast<double>(out.numel());
  }
};

}  // namespace detail

/// y = x·W + b, the bias broadcast over rows. x: [m,k], W: [k,n], b: [1,n] or [n] → [m,n]; x may have any
/// leading dimensions, [..., k] → [..., n], read as m = their product (torch.nn.functional.linear, but with
/// W as [in, out], not PyTorch's [out, in]: W is what x multiplies). dx = dy·Wᵀ, dW = xᵀ·dy, db = Σ_rows dy.
/// Kind dot (dots_saveable saves it). 2mkn + mn FLOPs. Throws shape_error for mismatched shapes or a scalar x.
template <class T>
Var<T> linear(const Var<T>& x, const Var<T>& w, const Var<T>& b) {
  return apply_op<detail::LinearOp>(x, w, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::LinearOp)
