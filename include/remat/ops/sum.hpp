// sum: the sum of all elements (to [1,1]), or over a list of dims (torch.sum).
#pragma once

#include <vector>

#include "remat/detail/reduce_dims.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SumOp : OpBase {
  static constexpr const char* name = "sum";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape*, const Params&) { return {1, 1}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    c.out()(0, 0) =
        sum_row_blocks<T>(x.rows(), x.cols(), 1, [&](Index r0, Index n) { return x.middleRows(r0, n).sum(); });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Index cols = c.in_shape(0).cols();
    const T g = c.grad_out()(0, 0);
    add_grad_rows(c, 0, 1, [&](Index, Index n) { return Matrix<T>::Constant(n, cols, g); });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

// sum over dims (torch.sum(x, dims, keepdim)).
struct SumDimsOp : OpBase {
  static constexpr const char* name = "sum";
  static constexpr OpKind kind = OpKind::reduction;
  using Params = ReduceDimsParams;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) { return reduce_dims_shape(in[0], p); }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const ReduceGeometry geo(c.in_shape(0), params_of<Params>(c).mask);
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for_each_output(geo, 1, [&](Index j, Index base) {
      const T total = geo.sum(x, base);
      y[j] = total;
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const ReduceGeometry geo(c.in_shape(0), params_of<Params>(c).mask);
    const T* g = c.grad_out().data();
    GradTarget<T> t = c.grad_target(0);
    T* dx = t.map.data();
    for_each_output(geo, 1, [&](Index j, Index base) {
      const T gj = g[j];
      if (t.accumulate)
        geo.for_each(base, [&](Index i) { dx[i] += gj; });
      else
        geo.for_each(base, [&](Index i) { dx[i] = gj; });
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// y = Σᵢⱼ xᵢⱼ. x: [m,n] → [1,1]; dy/dx = 1 everywhere.
template <class T>
Var<T> sum(const Var<T>& x) {
  return apply_op<detail::SumOp>(x);
}

/// torch.sum(x, dims, keepdim): the sum over the dimensions `dims` (negative ones count from the end; an empty
/// list reduces every dimension, to a rank-0 result without keepdim). x: [d₀,…,d_{r−1}] → x's shape without the
/// reduced dims, or with each of them 1 if `keepdim`; dx = dy broadcast back over the reduced dims. Each output
/// element adds its terms in a fixed order (ReduceGeometry::sum): the same bits at every thread count. Throws
/// index_error naming sum for a dim out of [−r, r) or given twice.
template <class T>
Var<T> sum(const Var<T>& x, ArrayRef<int> dims, bool keepdim = false) {
  return apply_op<detail::SumDimsOp>(detail::reduce_dims_params("sum", dims, x.shape("sum").rank(), keepdim), x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SumOp)
REMAT_OP_KERNELS(remat::detail::SumDimsOp)
