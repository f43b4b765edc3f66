// transpose: xᵀ.
#pragma once

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct TransposeOp : OpBase {
  static constexpr const char* name = "transpose";
  static constexpr OpKind kind = OpKind::data_movement;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    require_rank(name, "x", in[0], 2);
    return {in[0].cols(), in[0].rows()};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out() = c.in(0).transpose();
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    c.add_grad(0, c.grad_out().transpose());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// y = xᵀ. x: [m,n] → [n,m]; dx = dyᵀ.
template <class T>
Var<T> transpose(const Var<T>& x) {
  return apply_op<detail::TransposeOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::TransposeOp)
