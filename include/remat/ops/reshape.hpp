// reshape: the same elements in row-major order, read as another shape (a [rows, cols] matrix, or any shape as
// torch.reshape).
#pragma once

#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct ReshapeOp : OpBase {
  static constexpr const char* name = "reshape";
  static constexpr OpKind kind = OpKind::data_movement;
  static constexpr bool view = true;  // the output is x's buffer (OpBase::view)
  struct Params {
    Index rows = 0, cols = 0;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) {
    // By division: rows · cols may overflow (and wrap to m·n).
    if (p.rows <= 0 || p.cols <= 0 || in[0].numel() % p.rows != 0 || in[0].numel() / p.rows != p.cols)
      throw shape_error("reshape: x " + to_string(in[0]) + " has " + std::to_string(in[0].numel()) +
                        " elements; it cannot be read as " + to_string(Shape{p.rows, p.cols}));
    return {p.rows, p.cols};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    std::copy_n(c.in(0).data(), c.out_shape().numel(), c.out().data());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    GradTarget<T> d = c.grad_target(0);
    const ConstAlignedMap<T> g(c.grad_out().data(), d.map.rows(), d.map.cols());  // dy read as x's shape
    assign_or_add(d.map, g, d.accumulate);
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

/// `shape` with its one -1 inferred from x's elements (torch.reshape's rule): throws shape_error naming `op` for
/// more than max_rank dimensions, more than one -1, a dimension below 1 other than -1, or another number of
/// elements than x's.
inline Shape resolve_shape(const char* op, const Shape& x, ArrayRef<Index> shape) {
  // The message's start, built only on the way to a throw: a reshape that succeeds allocates nothing.
  auto asked = [&] {
    return std::string(op) + ": x " + to_string(x) + " (" + std::to_string(x.numel()) +
           " elements) cannot be read as " + to_string_dims(shape);
  };
  if (shape.size() > static_cast<std::size_t>(Shape::max_rank))
    throw shape_error(asked() + ": " + std::to_string(shape.size()) + " dimensions; remat holds at most " +
                      std::to_string(Shape::max_rank));
  int inferred = -1;
  Index known = 1;
  Index dims[Shape::max_rank];
  for (std::size_t d = 0; d < shape.size(); ++d) {
    dims[d] = shape[d];
    if (shape[d] == -1) {
      if (inferred >= 0) throw shape_error(asked() + ": only one dimension may be -1 (inferred)");
      inferred = static_cast<int>(d);
    } else if (shape[d] < 1) {
      throw shape_error(asked() + ": dimension " + std::to_string(d) + " is " + std::to_string(shape[d]) +
                        "; each must be at least 1, or -1 for the one inferred (remat has no empty tensors)");
    } else if (__builtin_mul_overflow(known, shape[d], &known) || known > x.numel()) {
      throw shape_error(asked() + ": that has more elements than x; the dimensions' product must be " +
                        std::to_string(x.numel()));
    }
  }
  if (inferred >= 0) {
    if (x.numel() % known != 0)
      throw shape_error(asked() + ": " + std::to_string(x.numel()) + " is not a multiple of " + std::to_string(known) +
                        ", the product of the other dimensions, so the -1 cannot be inferred");
    dims[inferred] = x.numel() / known;
  } else if (known != x.numel()) {
    throw shape_error(asked() + ": that has " + std::to_string(known) + " elements; the dimensions' product must be " +
                      std::to_string(x.numel()));
  }
  return make_shape(dims, static_cast<int>(shape.size()));
}

/// reshape to any shape: its Params hold the target shape, -1 resolved.
struct ReshapeNdOp : SameElementsOp {
  static constexpr const char* name = "reshape";
  struct Params {
    PackedShape shape;
  };
  static Shape output_shape(const Shape* in, const Params& p) {
    const Shape out = p.shape.unpack();
    if (out.numel() != in[0].numel())
      throw shape_error(std::string(name) + ": x " + to_string(in[0]) + " cannot be read as " + to_string(out));
    return out;
  }
};

}  // namespace detail

/// The elements of x in row-major order, as a [rows, cols] matrix (numpy/torch reshape of a contiguous
/// row-major tensor). x: [m,n] → [rows,cols] with rows·cols = m·n; dx is dy read back as [m,n]. A view: the
/// result shares x's buffer. Throws shape_error if rows·cols ≠ m·n or a dimension is not positive.
template <class T>
Var<T> reshape(const Var<T>& x, Index rows, Index cols) {
  return apply_op<detail::ReshapeOp>(detail::ReshapeOp::Params{rows, cols}, x);
}

/// torch.reshape: the elements of x in row-major order, read as `shape` (at most Shape::max_rank dimensions, one
/// of which may be -1: inferred from x's number of elements; {} makes a scalar of a one-element x). x: any shape
/// with as many elements → `shape`; dx is dy read back as x's shape. As PyTorch's reshape of a contiguous
/// tensor, the result is a view sharing x's buffer (OpBase::view): nothing is copied, memory() counts it once. Throws
/// shape_error naming reshape, x's shape and the shape asked for, for more than one -1, a dimension below 1 other than
/// -1, or another number of elements.
template <class T>
Var<T> reshape(const Var<T>& x, ArrayRef<Index> shape) {
  const Shape out = detail::resolve_shape(detail::ReshapeNdOp::name, x.shape(), shape);
  return apply_op<detail::ReshapeNdOp>(detail::ReshapeNdOp::Params{PackedShape(out)}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ReshapeOp)
REMAT_OP_KERNELS(remat::detail::ReshapeNdOp)
