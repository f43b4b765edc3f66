// permute: the dimensions of x in another order (torch.permute).
#pragma once

#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

struct PermuteOp : OpBase {
  static constexpr const char* name = "permute";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    int dims[Shape::max_rank] = {};
    int count = 0;  ///< how many dims were given
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Permutation permutation(const Shape& in, const Params& p) {
    return checked_permutation(name, in, p.dims, p.count);
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
    const Permutation back = inverse(permutation(c.in_shape(0), params_of<Params>(c)), c.in_shape(0).rank());
    GradTarget<T> d = c.grad_target(0);
    permute_copy(c.grad_out().data(), c.out_shape(), back.data(), d.map.data(), d.accumulate);
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// torch.permute: y's dimension k is x's dimension dims[k] (negative ones counted from the end); dims lists each of
/// x's dimensions once. x: [d0, …, d_{r-1}] → [d_dims[0], …, d_dims[r-1]]; dx is dy permuted back (by the inverse
/// permutation). Copies the values, in contiguous runs where the innermost dimension stays innermost and by tiles
/// otherwise. Throws shape_error naming permute for another number of dims than x's rank, index_error for a dim out
/// of range or repeated.
template <class T>
Var<T> permute(const Var<T>& x, ArrayRef<int> dims) {
  detail::PermuteOp::Params p;
  if (dims.size() > static_cast<std::size_t>(Shape::max_rank))
    throw shape_error("permute: " + std::to_string(dims.size()) + " dims for x " + to_string(x.shape()) + " of rank " +
                      std::to_string(x.dim()) + "; list each of its dimensions once");
  p.count = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), p.dims);
  return apply_op<detail::PermuteOp>(p, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::PermuteOp)
