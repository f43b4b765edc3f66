// gelu: Gaussian error linear unit, tanh approximation (Hendrycks & Gimpel 2016, eq. for GELU ≈).
#pragma once

#include <algorithm>

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct GeluOp : UnaryElementwise<GeluOp> {
  static constexpr const char* name = "gelu";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 20;
  static constexpr double k = 0.7978845608028654;  // √(2/π)
  static constexpr double c = 0.044715;
  /// t = tanh(√(2/π) (x + 0.044715 x³)), on Eigen arrays.
  template <class X>
  static auto tanh_term(const X& x) {
    using T = typename X::Scalar;
    return (T(k) * (x + T(c) * x.cube())).tanh();
  }
  template <class X>
  static auto value(const X& x, const Params&) {
    using T = typename X::Scalar;
    return T(0.5) * x * (T(1) + tanh_term(x));
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y& t, const G& g) {
    using T = typename X::Scalar;
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t.square()) * T(k) * (T(1) + T(3 * c) * x.square()));
  }
  /// Elements of the stack buffer for t in the backward.
  static constexpr Index chunk = 1024;
  /// dx = dy ⊙ gelu'(x), row block by row block; t is computed once per element into a stack buffer, chunk
  /// by chunk (as one expression, Eigen would evaluate its tanh twice: for 1 + t and for 1 − t²).
  template <class T>
  static void backward(const BackwardContext<T>& context) {
    if (!context.wants_grad(0)) return;
    using Flat = Eigen::Array<T, Eigen::Dynamic, 1>;
    const auto x = context.in(0);
    const auto g = context.grad_out();
    GradTarget<T> d = context.grad_target(0);
    const Index cols = x.cols();
    for_row_blocks(x.rows(), cols, flops_per_element, [&](Index r0, Index n) {
      alignas(64) T t_buffer[chunk];
      for (Index e0 = r0 * cols, end = (r0 + n) * cols; e0 < end; e0 += chunk) {
        const Index m = std::min(chunk, end - e0);
        const Eigen::Map<const Flat> xs(x.data() + e0, m), gs(g.data() + e0, m);
        Eigen::Map<Flat> t(t_buffer, m);
        t = tanh_term(xs);
        assign_or_add(Eigen::Map<Flat>(d.map.data() + e0, m), derivative(xs, t, gs), d.accumulate);
      }
    });
  }
};

}  // namespace detail

/// y = ½ x (1 + tanh(√(2/π) (x + 0.044715 x³))), the tanh form of GELU (Hendrycks & Gimpel 2016);
/// with t = tanh(√(2/π)(x + 0.044715x³)), dy/dx = ½(1 + t) + ½ x (1 − t²) √(2/π) (1 + 3·0.044715 x²).
/// x: [m,n] → [m,n].
template <class T>
Var<T> gelu(const Var<T>& x) {
  return apply_op<detail::GeluOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::GeluOp)
