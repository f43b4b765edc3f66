// slice: a contiguous range of one dimension (torch.narrow).
#pragma once

#include <string>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

struct SliceOp : OpBase {
  static constexpr const char* name = "slice";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    int dim = 0;
    Index begin = 0, count = 0;  ///< begin as given (negative counts from the end of the dimension)
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  /// The range's first index in [0, size) after the checks; throws index_error or shape_error naming slice.
  static Index first(const Shape& x, int d, const Params& p) {
    const Index size = x[d];
    if (p.begin < -size || p.begin >= size)
      throw index_error(std::string(name) + ": begin " + std::to_string(p.begin) + " is out of range for dim " +
                        std::to_string(p.dim) + " of x " + to_string(x) + " (size " + std::to_string(size) +
                        "); it must be in [" + std::to_string(-size) + ", " + std::to_string(size - 1) + "]");
    const Index b = p.begin < 0 ? p.begin + size : p.begin;
    // b > size − count, not b + count > size: the sum may overflow (count ≥ 1 here, so the difference cannot).
    if (p.count < 1 || b > size - p.count)
      throw shape_error(std::string(name) + ": " + std::to_string(p.count) + " elements from index " +
                        std::to_string(b) + " of dim " + std::to_string(p.dim) + " of x " + to_string(x) +
                        "; need count >= 1 and begin + count <= " + std::to_string(size));
    return b;
  }
  static Shape output_shape(const Shape* in, const Params& p) {
    require_not_scalar(name, in[0]);
    const int d = wrap_dim(p.dim, in[0].rank(), name);
    first(in[0], d, p);
    Shape out = in[0];
    out[d] = p.count;
    return out;
  }
  /// The layout: `blocks` blocks of x of `block` elements, each giving `run` elements from `skip` on.
  struct Layout {
    Index blocks, block, skip, run;
  };
  static Layout layout(const Shape& x, const Params& p) {
    const int d = wrap_dim(p.dim, x.rank(), name);
    const Index inner = x.numel(d + 1, x.rank());
    return {x.numel(0, d), x[d] * inner, first(x, d, p) * inner, p.count * inner};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Layout l = layout(c.in_shape(0), params_of<Params>(c));
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for (Index o = 0; o < l.blocks; ++o) std::copy_n(x + o * l.block + l.skip, l.run, y + o * l.run);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Layout l = layout(c.in_shape(0), params_of<Params>(c));
    GradTarget<T> d = c.grad_target(0);
    const T* g = c.grad_out().data();
    T* dx = d.map.data();
    for (Index o = 0; o < l.blocks; ++o) {
      T* block = dx + o * l.block;
      if (!d.accumulate) {
        zero(block, l.skip);
        zero(block + l.skip + l.run, l.block - l.skip - l.run);
      }
      copy_or_add(g + o * l.run, block + l.skip, l.run, d.accumulate);
    }
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// torch.narrow: indices begin … begin + count − 1 of dimension `dim` of x (negative dim and begin count from the
/// end). x: [.., n, ..] → [.., count, ..]; dx is dy in that range, 0 elsewhere. Throws index_error naming slice for
/// a dim out of range or a begin outside [-n, n), shape_error for a scalar x, count < 1 or begin + count > n.
template <class T>
Var<T> slice(const Var<T>& x, int dim, Index begin, Index count) {
  detail::SliceOp::Params p;
  p.dim = dim;
  p.begin = begin;
  p.count = count;
  return apply_op<detail::SliceOp>(p, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SliceOp)
