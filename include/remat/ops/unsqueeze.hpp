// unsqueeze: a size-1 dimension inserted (torch.unsqueeze).
#pragma once

#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

struct UnsqueezeOp : SameElementsOp {
  static constexpr const char* name = "unsqueeze";
  struct Params {
    int dim = 0;
  };
  static Shape output_shape(const Shape* in, const Params& p) {
    const Shape& x = in[0];
    const int dim = wrap_dim(p.dim, x.rank() + 1, name);
    if (x.rank() == Shape::max_rank)
      throw shape_error(std::string(name) + ": x " + to_string(x) + " already has " + std::to_string(x.rank()) +
                        " dimensions, the most a remat shape holds; reshape it to fewer first");
    return insert_dim(x, dim, 1);
  }
};

}  // namespace detail

/// torch.unsqueeze: x with a size-1 dimension inserted at `dim`, in [-rank-1, rank] (negative counts from the end
/// of the result: -1 appends). x: [d0, …] → [d0, .., 1, ..]; dx is dy read back as x's shape. It is a view: the result
/// shares x's buffer, nothing is copied. Throws index_error naming unsqueeze for a dim out of range,
/// shape_error for an x of Shape::max_rank dimensions.
template <class T>
Var<T> unsqueeze(const Var<T>& x, int dim) {
  return apply_op<detail::UnsqueezeOp>(detail::UnsqueezeOp::Params{dim}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::UnsqueezeOp)
