// matmul: matrix product through Eigen's GEMM (OpenBLAS when REMAT_USE_BLAS is on).
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct MatmulOp : OpBase {
  static constexpr const char* name = "matmul";
  static constexpr OpKind kind = OpKind::dot;
  /// dA reads B, dB reads A.
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static Shape output_shape(const Shape* in, const Params&) {
    require_rank(name, "A", in[0], 2);
    require_rank(name, "B", in[1], 2);
    if (in[0].cols() != in[1].rows())
      throw shape_error("matmul: A is " + to_string(in[0]) + " but B is " + to_string(in[1]) +
                        "; A.cols must equal B.rows");
    return {in[0].rows(), in[1].cols()};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    assign_product(c.out(), c.in(0) * c.in(1));
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (c.wants_grad(0)) c.add_grad(0, c.grad_out() * c.in(1).transpose());
    if (c.wants_grad(1)) c.add_grad(1, c.in(0).transpose() * c.grad_out());
  }
  static double flops(const Shape* in, int, const Shape& out) {
    return 2.0 * static_cast<double>(in[0].rows()) * static_cast<double>(in[0].cols()) *
           static_cast<double>(out.cols());
  }
};

}  // namespace detail

/// C = A·B. A: [m,k], B: [k,n] → [m,n]; dA = dC·Bᵀ, dB = Aᵀ·dC. 2mkn FLOPs forward.
/// Throws shape_error if A.cols() ≠ B.rows(), tape_error for invalid Vars or Vars of different tapes.
template <class T>
Var<T> matmul(const Var<T>& a, const Var<T>& b) {
  return apply_op<detail::MatmulOp>(a, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MatmulOp)
