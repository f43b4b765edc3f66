// add: elementwise sum with broadcasting.
#pragma once

#include "remat/detail/broadcast.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct AddOp : OpBase {
  static constexpr const char* name = "add";
  static constexpr OpKind kind = OpKind::elementwise;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return broadcast_shape(name, in[0], in[1]); }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    broadcast_apply<T>(c, [](const auto& a, const auto& b) { return a + b; });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!matrix_broadcast_grads(c)) {
      add_broadcast_grad<T>(
          c, 0, 0u, [](const auto& g, [[maybe_unused]] const auto& a, [[maybe_unused]] const auto& b) { return g; });
      add_broadcast_grad<T>(
          c, 1, 0u, [](const auto& g, [[maybe_unused]] const auto& a, [[maybe_unused]] const auto& b) { return g; });
      return;
    }
    add_reduced_grad<T>(c, 0, c.grad_out());
    add_reduced_grad<T>(c, 1, c.grad_out());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// a + b elementwise. Shapes broadcast: each dimension equal or 1 (a 1×n row, an m×1 column or a 1×1
/// scalar stretches). Gradients are summed over broadcast dimensions. Throws shape_error otherwise.
template <class T>
Var<T> add(const Var<T>& a, const Var<T>& b) {
  return apply_op<detail::AddOp>(a, b);
}
template <class T>
Var<T> operator+(const Var<T>& a, const Var<T>& b) {
  return add(a, b);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::AddOp)
