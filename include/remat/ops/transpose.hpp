// transpose: xᵀ of a matrix, or two dimensions of any x swapped (torch.transpose).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "remat/detail/shape_ops.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct TransposeOp : OpBase {
  static constexpr const char* name = "transpose";
  static constexpr OpKind kind = OpKind::data_movement;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "x", in[0], 2);
    return {in[0].cols(), in[0].rows()};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out() = c.in(0).transpose();
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    c.add_grad(0, c.grad_out().transpose());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

/// transpose(x, dim0, dim1): a permutation that swaps two dimensions.
struct TransposeDimsOp : OpBase {
  static constexpr const char* name = "transpose";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    int dim0 = 0, dim1 = 1;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  /// The permutation (its own inverse); a scalar takes dims 0 and -1, as in PyTorch.
  static Permutation permutation(const Shape& in, const Params& p) {
    const int a = wrap_dim_or_scalar(p.dim0, in.rank(), name), b = wrap_dim_or_scalar(p.dim1, in.rank(), name);
    Permutation perm;
    for (int k = 0; k < in.rank(); ++k) perm.dims[k] = k;
    if (in.rank() > 0) std::swap(perm.dims[a], perm.dims[b]);
    return perm;
  }
  static Shape output_shape(const Shape* in, const Params& p) { return permuted(in[0], permutation(in[0], p)); }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Permutation perm = permutation(c.in_shape(0), params_of<Params>(c));
    permute_copy(c.in(0).data(), c.in_shape(0), perm.data(), c.out().data(), false);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Permutation perm = permutation(c.in_shape(0), params_of<Params>(c));
    GradTarget<T> d = c.grad_target(0);
    permute_copy(c.grad_out().data(), c.out_shape(), perm.data(), d.map.data(), d.accumulate);
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// y = xᵀ. x: [m,n] → [n,m]; dx = dyᵀ.
template <class T>
Var<T> transpose(const Var<T>& x) {
  return apply_op<detail::TransposeOp>(x);
}

/// torch.transpose: x with dimensions dim0 and dim1 swapped (negative ones counted from the end; equal ones copy x
/// unchanged). x: [.., a, .., b, ..] → [.., b, .., a, ..]; dx is dy with the same two dimensions swapped back.
/// Copies the values, in contiguous runs where the last dimension stays last and by tiles otherwise. Throws
/// index_error naming transpose for a dim out of range (a scalar takes 0 and -1).
template <class T>
Var<T> transpose(const Var<T>& x, int dim0, int dim1) {
  return apply_op<detail::TransposeDimsOp>(detail::TransposeDimsOp::Params{dim0, dim1}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::TransposeOp)
REMAT_OP_KERNELS(remat::detail::TransposeDimsOp)
