// where: elementwise selection between two broadcast operands by a condition (torch.where).
#pragma once

#include "remat/detail/broadcast.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct WhereOp : OpBase {
  static constexpr const char* name = "where";
  static constexpr OpKind kind = OpKind::elementwise;
  /// da and db read the condition; it receives no gradient.
  static unsigned reads(GradInputs g) { return wants(g, 1) || wants(g, 2) ? reads_input0 : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    const Shape ab = broadcast_shape(name, in[1], in[2]);
    if (broadcast_shape_or_empty(in[0], ab) == Shape{})
      throw shape_error(std::string(name) + ": cannot broadcast cond " + to_string(in[0]) + " with a " +
                        to_string(in[1]) + " and b " + to_string(in[2]));
    return broadcast_shape(name, in[0], ab);
  }
  /// broadcast_shape(a, b), or Shape{} where it would throw.
  static Shape broadcast_shape_or_empty(const Shape& a, const Shape& b) {
    const int rank = std::max(a.rank(), b.rank());
    for (int d = 0; d < rank; ++d) {
      const Index x = d < rank - a.rank() ? 1 : a[d - (rank - a.rank())];
      const Index y = d < rank - b.rank() ? 1 : b[d - (rank - b.rank())];
      if (x != y && x != 1 && y != 1) return Shape{};
    }
    return Shape::scalar();
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Shape os = c.out_shape();
    const BroadcastRows mc(c.in_shape(0), os), ma(c.in_shape(1), os), mb(c.in_shape(2), os);
    const T *cond = c.in(0).data(), *a = c.in(1).data(), *b = c.in(2).data();
    auto out = c.out();
    const Index cols = out.cols();
    for_row_blocks(out.rows(), cols, 1, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i)
        out.row(i).array() = (broadcast_row(cond, mc, i, cols) != T(0))
                                 .select(broadcast_row(a, ma, i, cols), broadcast_row(b, mb, i, cols));
    });
  }
  /// da = dy where cond, db = dy where not, each summed over its broadcast dimensions (in output order, serial:
  /// the same sums at every thread count); cond's gradient, if asked for, is 0.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (c.wants_grad(0)) {
      GradTarget<T> t = c.grad_target(0);
      if (!t.accumulate) t.map.setZero();
    }
    if (!c.wants_grad(1) && !c.wants_grad(2)) return;
    const Shape os = c.out_shape();
    const auto g = c.grad_out();
    const BroadcastRows mc(c.in_shape(0), os);
    const T* cond = c.in(0).data();
    const Index cols = g.cols();
    for (int k = 1; k <= 2; ++k) {
      if (!c.wants_grad(k)) continue;
      const bool taken = k == 1;  // a where cond holds, b where it does not
      GradTarget<T> t = c.grad_target(k);
      if (c.in_shape(k) == os) {
        for_row_blocks(g.rows(), cols, 1, [&](Index r0, Index n) {
          for (Index i = r0; i < r0 + n; ++i) {
            const auto v = ((broadcast_row(cond, mc, i, cols) != T(0)) == taken).select(g.row(i).array(), T(0));
            assign_or_add(t.map.row(i).array(), v, t.accumulate);
          }
        });
        continue;
      }
      if (!t.accumulate) t.map.setZero();
      const BroadcastRows mk(c.in_shape(k), os);
      T* dst = t.map.data();
      for (Index i = 0; i < g.rows(); ++i) {
        const auto v = ((broadcast_row(cond, mc, i, cols) != T(0)) == taken).select(g.row(i).array(), T(0));
        const Index off = mk.offset(i);
        if (mk.full_row())
          Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>(dst + off, cols) += v;
        else
          dst[off] += v.sum();
      }
    }
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// torch.where(cond, a, b): a where cond is nonzero (NaN counts as nonzero), b elsewhere; cond, a and b broadcast
/// together as in add(). da = dy where cond holds and db = dy where it does not, each summed over its broadcast
/// dimensions; cond receives no gradient (0 if it is a variable). Keeps cond as its residual. Throws shape_error
/// naming where for shapes that do not broadcast.
template <class T>
Var<T> where(const Var<T>& cond, const Var<T>& a, const Var<T>& b) {
  return apply_op<detail::WhereOp>(cond, a, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::WhereOp)
