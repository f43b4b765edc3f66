// squeeze: a size-1 dimension removed (torch.squeeze(x, dim)).
#pragma once

#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

struct SqueezeOp : SameElementsOp {
  static constexpr const char* name = "squeeze";
  struct Params {
    int dim = 0;
  };
  static Shape output_shape(const Shape* in, const Params& p) {
    const Shape& x = in[0];
    const int dim = wrap_dim_or_scalar(p.dim, x.rank(), name);
    if (x.rank() == 0 || x[dim] != 1) return x;
    Index dims[Shape::max_rank];
    for (int d = 0, k = 0; d < x.rank(); ++d)
      if (d != dim) dims[k++] = x[d];
    return make_shape(dims, x.rank() - 1);
  }
};

}  // namespace detail

/// torch.squeeze(x, dim): x without dimension `dim` (negative counts from the end) if its size is 1; x's shape
/// unchanged otherwise, as in PyTorch (a scalar takes dim 0 or -1 and stays a scalar). x: [.., 1, ..] → [.., ..];
/// dx is dy read back as x's shape. It is a view: the result shares x's buffer, nothing is copied. Throws
/// index_error naming squeeze for a dim outside [-rank, rank).
template <class T>
Var<T> squeeze(const Var<T>& x, int dim) {
  return apply_op<detail::SqueezeOp>(detail::SqueezeOp::Params{dim}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SqueezeOp)
