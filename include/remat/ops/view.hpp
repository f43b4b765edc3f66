// view: torch.Tensor.view, the same elements read as another shape (remat's values are contiguous, so any shape
// with as many elements; it is reshape under its own name).
#pragma once

#include <vector>

#include "remat/ops/reshape.hpp"

namespace remat {
namespace detail {

struct ViewOp : ReshapeNdOp {
  static constexpr const char* name = "view";
  static Shape output_shape(const Shape* in, const Params& p) {
    const Shape out = p.shape.unpack();
    if (out.numel() != in[0].numel())
      throw shape_error(std::string(name) + ": x " + to_string(in[0]) + " cannot be read as " + to_string(out));
    return out;
  }
};

}  // namespace detail

/// torch.Tensor.view: x's elements in row-major order read as `shape`, exactly as reshape(x, shape) (one -1
/// inferred; {} for a scalar). PyTorch's view needs a contiguous x; remat's values always are, so every x with as
/// many elements has the view. x: any shape → `shape`; dx is dy read back as x's shape. As PyTorch's view, the
/// result shares x's buffer (OpBase::view): nothing is copied, and memory() counts the buffer once. Throws shape_error
/// naming view, x's shape and the shape asked for, for more than one -1, a dimension below 1 other than -1, or another
/// number of elements.
template <class T>
Var<T> view(const Var<T>& x, ArrayRef<Index> shape) {
  const Shape out = detail::resolve_shape(detail::ViewOp::name, x.shape(), shape);
  return apply_op<detail::ViewOp>(detail::ViewOp::Params{PackedShape(out)}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ViewOp)
