// matmul: matrix product through Eigen's GEMM (OpenBLAS when REMAT_USE_BLAS is on).
#pragma once

#include "remat/op.hpp"
#include "remat/ops/batched_matmul.hpp"

namespace remat {
namespace detail {

struct MatmulOp : OpBase {
  static constexpr const char* name = "matmul";
  static constexpr OpKind kind = OpKind::dot;
  /// dA reads B, dB reads A.
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "A", in[0], 2);
    check_rank(name, "B", in[1], 2);
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

/// C = A·B with torch.matmul's rules. Matrices: A [m,k], B [k,n] → [m,n]. A vector A [k] is read as [1,k] and
/// B [k] as [k,1], the added dimension removed from the result ([k]·[k] → a scalar, [m,k]·[k] → [m]). Above two
/// dimensions, A [..., m, k] and B [..., k, n] are batches of matrices whose batch dimensions broadcast (NumPy's
/// rule) → [..., m, n], e.g. [64,128,64]·[64,64,128] → [64,128,128] or [2,1,3,4]·[5,4,6] → [2,5,3,6].
/// dA = dC·Bᵀ and dB = Aᵀ·dC per matrix, summed over the batch entries a broadcast operand served. Kind dot;
/// OpInfo::batch_dims is set when the output has batch dimensions. 2·batch·m·k·n FLOPs forward.
/// Throws shape_error if the inner dimensions differ, the batch dimensions do not broadcast or an operand is a
/// scalar; tape_error for invalid Vars or Vars of different tapes.
template <class T>
Var<T> matmul(const Var<T>& a, const Var<T>& b) {
  const Shape sa = a.shape("matmul"), sb = b.shape("matmul");  // errors name matmul
  if (sa.rank() == 2 && sb.rank() == 2) return apply_op<detail::MatmulOp>(a, b);
  if (sa.rank() > 2 || sb.rank() > 2) return apply_op<detail::GeneralMatmulOp<true>>(a, b);
  return apply_op<detail::GeneralMatmulOp<false>>(a, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MatmulOp)
