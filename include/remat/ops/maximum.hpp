// maximum: the elementwise larger of two broadcast operands (torch.maximum).
#pragma once

#include "remat/detail/binary_extremum.hpp"

namespace remat {
namespace detail {

struct MaximumOp : BinaryExtremumOp<MaximumOp, true> {
  static constexpr const char* name = "maximum";
};

}  // namespace detail

/// torch.maximum(a, b): the elementwise larger of a and b, broadcast together as in add() (a NaN in either gives
/// NaN). da = dy where a > b, dy/2 where a = b (ties share the gradient, as PyTorch), 0 where a < b; db likewise;
/// each summed over its broadcast dimensions. Keeps a and b as residuals. Throws shape_error naming maximum for
/// shapes that do not broadcast.
template <class T>
Var<T> maximum(const Var<T>& a, const Var<T>& b) {
  return apply_op<detail::MaximumOp>(a, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MaximumOp)
