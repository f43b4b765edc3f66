// index_select: entries of one dimension picked by integer indices (torch.index_select).
#pragma once

#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

struct IndexSelectOp : OpBase {
  static constexpr const char* name = "index_select";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    int dim = 0;
    Index count = 0;  ///< number of indices
  };
  /// The gradient scatters by index: it reads the indices (kept with the op), no tensor.
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) {
    require_not_scalar(name, in[0]);
    Shape out = in[0];
    out[wrap_dim(p.dim, in[0].rank(), name)] = p.count;
    return out;
  }
  /// Throws shape_error naming index_select for a scalar x or no indices, index_error for a dim out of range or an
  /// index outside [0, n) of dimension dim, naming it and its position.
  static void check(const Shape& x, int dim, const int* indices, std::size_t count) {
    require_not_scalar(name, x);
    const int d = wrap_dim(dim, x.rank(), name);
    if (count == 0) throw shape_error(std::string(name) + ": no indices (x " + to_string(x) + "); pass at least one");
    check_values(x, d, indices, count);
  }
  /// Throws index_error naming index_select, the index, its position and x's size in dim `d` (wrapped) for an index
  /// outside [0, x[d]).
  static void check_values(const Shape& x, int d, const int* indices, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i)
      if (indices[i] < 0 || indices[i] >= x[d])
        throw index_error(std::string(name) + ": index " + std::to_string(indices[i]) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(x[d]) + ") for dim " +
                          std::to_string(d) + " of x " + to_string(x) + "; every index must be in [0, " +
                          std::to_string(x[d]) + "), x's size in dim " + std::to_string(d));
  }
  struct Layout {
    Index blocks, size, inner;
  };
  static Layout layout(const Shape& x, const Params& p) {
    const int d = wrap_dim(p.dim, x.rank(), name);
    return {x.numel(0, d), x[d], x.numel(d + 1, x.rank())};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const Layout l = layout(c.in_shape(0), p);
    const int* index = c.indices();
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for (Index o = 0; o < l.blocks; ++o)
      for (Index j = 0; j < p.count; ++j)
        std::copy_n(x + (o * l.size + index[j]) * l.inner, l.inner, y + (o * p.count + j) * l.inner);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto p = params_of<Params>(c);
    const Layout l = layout(c.in_shape(0), p);
    const int* index = c.indices();
    GradTarget<T> d = c.grad_target(0);
    if (!d.accumulate) d.map.setZero();
    const T* g = c.grad_out().data();
    T* dx = d.map.data();
    for (Index o = 0; o < l.blocks; ++o)  // in order: repeated indices accumulate the same way at every thread count
      for (Index j = 0; j < p.count; ++j)
        copy_or_add(g + (o * p.count + j) * l.inner, dx + (o * l.size + index[j]) * l.inner, l.inner, true);
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
  /// New indices for CapturedStep::set_indices: index_error as index_select() throws for an index out of range.
  static void check_indices(const Shape* in, const Params& p, const int* indices, std::size_t count) {
    check_values(in[0], wrap_dim(p.dim, in[0].rank(), name), indices, count);
  }
};

}  // namespace detail

/// torch.index_select: entries indices[0], indices[1], … of dimension `dim` of x (negative dim counts from the
/// end), in that order; an index may repeat. x: [.., n, ..], k indices in [0, n) → [.., k, ..]; dx is dy's entries
/// added back at their indices (a scatter-add: repeated indices accumulate), 0 elsewhere. The indices are copied to
/// the tape; a CapturedStep may set new ones (set_indices of the output), checked as here. Throws shape_error naming
/// index_select for a scalar x or no indices, index_error for a dim out of range or an index outside [0, n) (naming
/// it, its position and n).
template <class T>
Var<T> index_select(const Var<T>& x, int dim, const std::vector<int>& indices) {
  const Shape s = x.shape();
  detail::IndexSelectOp::check(s, dim, indices.data(), indices.size());
  using Op = detail::IndexSelectOp;
  OpCall<Op> call;
  call.params.dim = dim;
  call.params.count = static_cast<Index>(indices.size());
  call.indices = indices.data();
  call.index_count = indices.size();
  return apply_op<Op>(call, x);
}

}  // namespace remat
REMAT_OP_KERNELS(remat::detail::IndexSelectOp)
