// mean_cols: the mean of each column.
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct MeanColsOp : OpBase {
  static constexpr const char* name = "mean_cols";
  static constexpr OpKind kind = OpKind::reduction;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return {1, in[0].cols}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out().noalias() = c.in(0).colwise().mean();
  }
  /// Row by row: replicate() of the expression dy / m would evaluate it into a heap temporary first (a
  /// malloc in the sweep, which must not allocate: a std::bad_alloc there would end the program).
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Index m = c.in_shape(0).rows;
    const auto g = c.grad_out();
    GradTarget<T> d = c.grad_target(0);
    for (Index i = 0; i < m; ++i) assign_or_add(d.map.row(i), g / T(m), d.accumulate);
  }
  static double flops(const Shape* in, int, const Shape&) { return static_cast<double>(in[0].size() + in[0].cols); }
};

}  // namespace detail

/// Column means: yⱼ = (1/m) Σᵢ xᵢⱼ. x: [m,n] → [1,n]; dxᵢⱼ = dyⱼ / m.
template <class T>
Var<T> mean_cols(const Var<T>& x) {
  return apply_op<detail::MeanColsOp>(x);
}

}  // namespace remat
