// reshape: the same elements in row-major order, read as another shape.
#pragma once

#include <string>

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct ReshapeOp : OpBase {
  static constexpr const char* name = "reshape";
  static constexpr OpKind kind = OpKind::data_movement;
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

}  // namespace detail

/// The elements of x in row-major order, as a [rows, cols] matrix (numpy/torch reshape of a contiguous
/// row-major tensor). x: [m,n] → [rows,cols] with rows·cols = m·n; dx is dy read back as [m,n].
/// Throws shape_error if rows·cols ≠ m·n or a dimension is not positive.
template <class T>
Var<T> reshape(const Var<T>& x, Index rows, Index cols) {
  return apply_op<detail::ReshapeOp>(detail::ReshapeOp::Params{rows, cols}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ReshapeOp)
