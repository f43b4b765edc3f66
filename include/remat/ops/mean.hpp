// mean: the mean of all elements (to [1,1]), or over a list of dims (torch.mean).
#pragma once

#include <vector>

#include "remat/detail/reduce_dims.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct MeanOp : OpBase {
  static constexpr const char* name = "mean";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape*, const Params&) { return {1, 1}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    c.out()(0, 0) =
        sum_row_blocks<T>(x.rows(), x.cols(), 1, [&](Index r0, Index n) { return x.middleRows(r0, n).sum(); }) /
        static_cast<T>(x.size());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Shape s = c.in_shape(0);
    const T g = c.grad_out()(0, 0) / static_cast<T>(s.numel());
    add_grad_rows(c, 0, 1, [&](Index, Index n) { return Matrix<T>::Constant(n, s.cols(), g); });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

// mean over dims (torch.mean(x, dims, keepdim)): the sum over dims (in SumDimsOp's order) divided by the count.
struct MeanDimsOp : OpBase {
  static constexpr const char* name = "mean";
  static constexpr OpKind kind = OpKind::reduction;
  using Params = ReduceDimsParams;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) { return reduce_dims_shape(in[0], p); }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const ReduceGeometry geo(c.in_shape(0), params_of<Params>(c).mask);
    const T count = static_cast<T>(geo.inner());
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for_each_output(geo, 1, [&](Index j, Index base) {
      const T total = geo.sum(x, base);
      y[j] = total / count;
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const ReduceGeometry geo(c.in_shape(0), params_of<Params>(c).mask);
    const T count = static_cast<T>(geo.inner());
    const T* g = c.grad_out().data();
    GradTarget<T> t = c.grad_target(0);
    T* dx = t.map.data();
    for_each_output(geo, 1, [&](Index j, Index base) {
      const T gj = g[j] / count;
      if (t.accumulate)
        geo.for_each(base, [&](Index i) { dx[i] += gj; });
      else
        geo.for_each(base, [&](Index i) { dx[i] = gj; });
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// y = (1/(mn)) Σᵢⱼ xᵢⱼ. x: [m,n] → [1,1]; dy/dx = 1/(mn) everywhere.
template <class T>
Var<T> mean(const Var<T>& x) {
  return apply_op<detail::MeanOp>(x);
}

/// torch.mean(x, dims, keepdim): the mean over the dimensions `dims` (negative ones count from the end; an empty
/// list reduces every dimension, to a rank-0 result without keepdim), the sum divided by the number n of reduced
/// elements. x: [d₀,…,d_{r−1}] → x's shape without the reduced dims, or with each of them 1 if `keepdim`;
/// dx = dy/n broadcast back over the reduced dims. Each output element adds its terms in a fixed order
/// (ReduceGeometry::sum): the same bits at every thread count. Throws index_error naming mean for a dim out of [−r, r)
/// or given twice.
template <class T>
Var<T> mean(const Var<T>& x, ArrayRef<int> dims, bool keepdim = false) {
  return apply_op<detail::MeanDimsOp>(detail::reduce_dims_params("mean", dims, x.shape("mean").rank(), keepdim), x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MeanOp)
REMAT_OP_KERNELS(remat::detail::MeanDimsOp)
