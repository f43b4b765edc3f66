// minimum: the elementwise smaller of two broadcast operands (torch.minimum).
#pragma once

#include "remat/detail/binary_extremum.hpp"

namespace remat {
namespace detail {

struct MinimumOp : BinaryExtremumOp<MinimumOp, false> {
  static constexpr const char* name = "minimum";
};

}  // namespace detail

/// torch.minimum(a, b): the elementwise smaller of a and b, broadcast together as in add() (a NaN in either gives
/// NaN). da = dy where a < b, dy/2 where a = b (ties share the gradient, as PyTorch), 0 where a > b; db likewise;
/// each summed over its broadcast dimensions. Keeps a and b as residuals. Throws shape_error naming minimum for
/// shapes that do not broadcast.
template <class T>
Var<T> minimum(const Var<T>& a, const Var<T>& b) {
  return apply_op<detail::MinimumOp>(a, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MinimumOp)
