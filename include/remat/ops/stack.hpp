// stack: tensors of one shape joined along a new dimension (torch.stack).
#pragma once

#include <initializer_list>
#include <vector>

#include "remat/ops/concat.hpp"

namespace remat {
namespace detail {

struct StackOp : JoinOp {
  static constexpr const char* name = "stack";
  static Shape output_shape(const Shape* in, const Params& p) { return joined_shape(name, in, p); }
};

}  // namespace detail

/// torch.stack: the parts, all of one shape S (scalars too), joined along a new dimension inserted at `dim`, in
/// [-rank-1, rank] of S (negative counts from the end of the result). k parts of S → S with k inserted at dim;
/// part i's gradient is slice i of dy along dim. Records a tree of joins of at most three parts each (⌈log₃ k⌉
/// levels; one part makes one record). Throws shape_error naming stack for no parts, parts of different shapes
/// (naming the part and both shapes), a result of more than Shape::max_rank dimensions or 2^48 bytes; index_error
/// for a dim out of range; tape_error for an empty or stale part or parts of different tapes; stale_value_error for
/// a modified Parameter; std::bad_alloc: all before recording anything, so the tape is unchanged then.
template <class T>
Var<T> stack(const std::vector<Var<T>>& parts, int dim) {
  return detail::join<detail::StackOp>(detail::StackOp::name, parts, dim, true);
}

/// stack({a, b, …}, dim).
template <class T>
Var<T> stack(std::initializer_list<Var<T>> parts, int dim) {
  return stack(std::vector<Var<T>>(parts), dim);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::StackOp)
