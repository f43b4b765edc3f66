// multiply: elementwise (Hadamard) product with broadcasting.
#pragma once

#include "remat/detail/broadcast.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct MultiplyOp : OpBase {
  static constexpr const char* name = "multiply";
  static constexpr OpKind kind = OpKind::elementwise;
  /// da reads b, db reads a.
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static Shape output_shape(const Shape* in, const Params&) { return broadcast_shape(name, in[0], in[1]); }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    broadcast_apply<T>(c, [](const auto& a, const auto& b) { return a * b; });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!matrix_broadcast_grads(c)) {
      add_broadcast_grad<T>(
          c, 0, 2u,
          [](const auto& g, [[maybe_unused]] const auto& a, [[maybe_unused]] const auto& b) { return g * b; });
      add_broadcast_grad<T>(
          c, 1, 1u,
          [](const auto& g, [[maybe_unused]] const auto& a, [[maybe_unused]] const auto& b) { return g * a; });
      return;
    }
    const auto g = c.grad_out();
    const Shape s = c.out_shape();
    if (c.in_shape(0) == s && c.in_shape(1) == s) {
      if (c.wants_grad(0)) {
        const auto b = c.in(1);
        add_grad_rows(c, 0, 1,
                      [&](Index r0, Index n) { return g.middleRows(r0, n).array() * b.middleRows(r0, n).array(); });
      }
      if (c.wants_grad(1)) {
        const auto a = c.in(0);
        add_grad_rows(c, 1, 1,
                      [&](Index r0, Index n) { return g.middleRows(r0, n).array() * a.middleRows(r0, n).array(); });
      }
      return;
    }
    if (c.wants_grad(0)) add_reduced_grad<T>(c, 0, (g.array() * broadcast_view(c.in(1), s).array()).matrix());
    if (c.wants_grad(1)) add_reduced_grad<T>(c, 1, (g.array() * broadcast_view(c.in(0), s).array()).matrix());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// a ⊙ b elementwise with broadcasting as in add(); da = dy ⊙ b, db = dy ⊙ a (summed over broadcast
/// dimensions). Throws shape_error for shapes that do not broadcast.
template <class T>
Var<T> multiply(const Var<T>& a, const Var<T>& b) {
  return apply_op<detail::MultiplyOp>(a, b);
}
template <class T>
Var<T> operator*(const Var<T>& a, const Var<T>& b) {
  return multiply(a, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::MultiplyOp)
