// gather: values of x picked along one dimension by an index tensor (torch.gather).
#pragma once

#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

struct GatherOp : OpBase {
  static constexpr const char* name = "gather";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    PackedShape index;  ///< the index's shape: the output's
    int dim = 0;
  };
  /// The gradient scatters by index: it reads the index (kept with the op), no tensor.
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) {
    const Shape index = p.index.unpack();
    check_shapes(in[0], p.dim, index);
    return index;
  }
  /// Throws shape_error naming gather for a scalar x, an index of another rank than x's or larger than x in a
  /// dimension but dim, index_error for a dim out of range.
  static void check_shapes(const Shape& x, int dim, const Shape& index) {
    require_not_scalar(name, x);
    const int d = wrap_dim(dim, x.rank(), name);
    bool fits = index.rank() == x.rank();
    for (int e = 0; fits && e < x.rank(); ++e) fits = index[e] >= 1 && (e == d || index[e] <= x[e]);
    if (!fits)
      throw shape_error(std::string(name) + ": index " + to_string(index) + " does not fit x " + to_string(x) +
                        " for dim " + std::to_string(dim) + "; the index needs x's rank, and sizes from 1 to x's " +
                        "in every dimension but dim");
  }
  /// Throws index_error naming gather, the value, its position and x's size in dim `d` (wrapped) for an index value
  /// outside [0, x[d]).
  static void check_values(const Shape& x, int d, const int* values, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i)
      if (values[i] < 0 || values[i] >= x[d])
        throw index_error(std::string(name) + ": index value " + std::to_string(values[i]) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(x[d]) + ") for dim " +
                          std::to_string(d) + " of x " + to_string(x) + "; every index value must be in [0, " +
                          std::to_string(x[d]) + "), x's size in dim " + std::to_string(d));
  }
  /// The output value at every position p of the index: x at p with dimension dim replaced by index[p]. Calls
  /// f(x offset, position) in row-major order of the index.
  template <class F>
  static void for_each(const Shape& x, const Shape& index, int dim, const int* values, F&& f) {
    const int rank = x.rank(), d = wrap_dim(dim, rank, name);
    Index stride[Shape::max_rank];
    Index s = 1;
    for (int e = rank - 1; e >= 0; --e) {
      stride[e] = s;
      s *= x[e];
    }
    // Every row of the index (its dimensions but the last): the x offset of its dimensions but d.
    Index sizes[Shape::max_rank], in_strides[Shape::max_rank], unused[Shape::max_rank] = {};
    for (int e = 0; e + 1 < rank; ++e) {
      sizes[e] = index[e];
      in_strides[e] = e == d ? 0 : stride[e];
    }
    const Index cols = index[rank - 1];
    const bool along_last = d == rank - 1;
    Index position = 0;
    for_each_offset(rank - 1, sizes, in_strides, unused, [&](Index base, Index) {
      for (Index j = 0; j < cols; ++j, ++position)
        f(base + (along_last ? 0 : j) + values[position] * stride[d], position);
    });
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for_each(c.in_shape(0), c.out_shape(), p.dim, c.indices(), [&](Index from, Index to) { y[to] = x[from]; });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto p = params_of<Params>(c);
    GradTarget<T> d = c.grad_target(0);
    if (!d.accumulate) d.map.setZero();
    const T* g = c.grad_out().data();
    T* dx = d.map.data();
    // In the index's order: repeated positions accumulate the same way at every thread count.
    for_each(c.in_shape(0), c.out_shape(), p.dim, c.indices(), [&](Index to, Index from) { dx[to] += g[from]; });
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
  /// New index values for CapturedStep::set_indices: index_error as gather() throws for a value out of range.
  static void check_indices(const Shape* in, const Params& p, const int* values, std::size_t count) {
    check_values(in[0], wrap_dim(p.dim, in[0].rank(), name), values, count);
  }
};

}  // namespace detail

/// torch.gather(x, dim, index): y[p] = x[p with dimension dim replaced by index[p]] for every position p of the
/// index, whose values are `index` (row-major, index_shape.numel() of them, each in [0, n) for n = x's size in
/// dim) and whose shape `index_shape` has x's rank and, in every dimension but dim, at most x's size (negative dim
/// counts from the end). x: [.., n, ..] → index_shape; dx is dy added back at the gathered positions (a
/// scatter-add: a position gathered twice accumulates), 0 elsewhere. The index is copied to the tape; a
/// CapturedStep may set new values (set_indices of the output), checked as here. Throws shape_error naming gather
/// for a scalar x, an index_shape that does not fit x or another number of values than index_shape holds;
/// index_error for a dim out of range or an index value outside [0, n) (naming it, its position and n).
template <class T>
Var<T> gather(const Var<T>& x, int dim, const std::vector<int>& index, const Shape& index_shape) {
  using Op = detail::GatherOp;
  const Shape s = x.shape();
  Op::check_shapes(s, dim, index_shape);  // index_shape's dimensions are then in [1, x's]: packable
  if (static_cast<Index>(index.size()) != index_shape.numel())
    throw shape_error(std::string(Op::name) + ": " + std::to_string(index.size()) + " index values for an index of " +
                      to_string(index_shape) + "; pass " + std::to_string(index_shape.numel()) + " values, row-major");
  const int d = wrap_dim(dim, s.rank(), Op::name);
  if (!PackedShape::packable(index_shape))
    throw shape_error(std::string(Op::name) + ": index " + to_string(index_shape) + " has more elements than a tensor");
  Op::check_values(s, d, index.data(), index.size());
  OpCall<Op> call;
  call.params.index = PackedShape(index_shape);
  call.params.dim = dim;
  call.indices = index.data();
  call.index_count = index.size();
  return apply_op<Op>(call, x);
}

}  // namespace remat
REMAT_OP_KERNELS(remat::detail::GatherOp)
