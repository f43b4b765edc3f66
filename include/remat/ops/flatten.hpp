// flatten: dimensions start_dim … end_dim merged into one (torch.flatten).
#pragma once

#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

struct FlattenOp : SameElementsOp {
  static constexpr const char* name = "flatten";
  struct Params {
    int start = 0, end = -1;
  };
  static Shape output_shape(const Shape* in, const Params& p) {
    const Shape& x = in[0];
    const int start = wrap_dim_or_scalar(p.start, x.rank(), name), end = wrap_dim_or_scalar(p.end, x.rank(), name);
    if (start > end)
      throw index_error(std::string(name) + ": start_dim " + std::to_string(p.start) + " (dimension " +
                        std::to_string(start) + ") comes after end_dim " + std::to_string(p.end) + " (dimension " +
                        std::to_string(end) + ") of x " + to_string(x) + "; pass start_dim <= end_dim");
    if (x.rank() == 0) return Shape{1};
    Index dims[Shape::max_rank];
    int rank = 0;
    for (int d = 0; d < start; ++d) dims[rank++] = x[d];
    dims[rank++] = x.numel(start, end + 1);
    for (int d = end + 1; d < x.rank(); ++d) dims[rank++] = x[d];
    return make_shape(dims, rank);
  }
};

}  // namespace detail

/// torch.flatten: dimensions start_dim … end_dim of x (negative ones counted from the end) merged into one whose
/// size is their product; the default flattens x into a vector, and a scalar becomes [1]. x: [.., d_start, ..,
/// d_end, ..] → [.., d_start·…·d_end, ..]; dx is dy read back as x's shape. It is a view: the result shares x's
/// buffer (OpBase::view), nothing is copied. Throws index_error naming flatten for a dim out of range or start_dim
/// after end_dim.
template <class T>
Var<T> flatten(const Var<T>& x, int start_dim = 0, int end_dim = -1) {
  return apply_op<detail::FlattenOp>(detail::FlattenOp::Params{start_dim, end_dim}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::FlattenOp)
