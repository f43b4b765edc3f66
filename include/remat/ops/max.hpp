// max: the largest element over dims (torch.amax), the gradient shared equally by tied maxima.
#pragma once

#include <vector>

#include "remat/detail/reduce_dims.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct MaxDimsOp : OpBase {
  static constexpr const char* name = "max";
  static constexpr OpKind kind = OpKind::reduction;
  using Params = ReduceDimsParams;
  /// dx finds each output element's maxima again from x and y.
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_input0 | reads_output : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) { return reduce_dims_shape(in[0], p); }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const ReduceGeometry geo(c.in_shape(0), params_of<Params>(c).mask);
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for_each_output(geo, 1, [&](Index j, Index base) {
      T m = x[base];
      geo.for_each(base, [&](Index i) {
        const T v = x[i];
        if (!(m != m) && (v > m || v != v)) m = v;  // a NaN wins and stays, as in torch.amax
      });
      y[j] = m;
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const ReduceGeometry geo(c.in_shape(0), params_of<Params>(c).mask);
    const T* x = c.in(0).data();
    const T* y = c.out().data();
    const T* g = c.grad_out().data();
    GradTarget<T> t = c.grad_target(0);
    T* dx = t.map.data();
    for_each_output(geo, 1, [&](Index j, Index base) {
      const T m = y[j];
      Index ties = 0;
      geo.for_each(base, [&](Index i) { ties += x[i] == m ? 1 : 0; });
      const T share = ties > 0 ? g[j] / static_cast<T>(ties) : T(0);
      geo.for_each(base, [&](Index i) {
        const T v = x[i] == m ? share : T(0);
        if (t.accumulate)
          dx[i] += v;
        else
          dx[i] = v;
      });
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// torch.amax(x, dims, keepdim): the largest element over the dimensions `dims` (negative ones count from the
/// end; an empty list reduces every dimension, to a rank-0 result without keepdim); a NaN among them gives NaN.
/// x: [d₀,…,d_{r−1}] → x's shape without the reduced dims, or with each of them 1 if `keepdim`. dx = dy/k at
/// each of the k elements equal to their maximum (tied maxima share the gradient equally, as PyTorch 1.13's
/// amax), 0 elsewhere. Keeps x and y as residuals. Throws index_error naming max for a dim out of [−r, r) or
/// given twice.
template <class T>
Var<T> max(const Var<T>& x, ArrayRef<int> dims, bool keepdim = false) {
  return apply_op<detail::MaxDimsOp>(detail::reduce_dims_params("max", dims, x.shape("max").rank(), keepdim), x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MaxDimsOp)
