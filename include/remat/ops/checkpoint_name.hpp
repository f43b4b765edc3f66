// checkpoint_name: tags a value so that name-based policies can select it (like jax.ad_checkpoint.checkpoint_name).
#pragma once

#include <string>
#include <string_view>

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct CheckpointNameOp : OpBase {
  static constexpr const char* name = "checkpoint_name";
  static constexpr OpKind kind = OpKind::identity;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out() = c.in(0);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (c.wants_grad(0)) c.add_grad(0, c.grad_out());
  }
  static double flops(const Shape*, int, const Shape&) { return 0; }
};

}  // namespace detail

/// Names x `name` (OpInfo::tag), so save_only_these_names and save_any_names_but_these can select it, as
/// jax.ad_checkpoint.checkpoint_name does. When x is an op's output that no op has read yet — the usual
/// `checkpoint_name(linear(h, W, b), "name")` — the value itself is named: the policies of the open regions
/// enclosing it are asked again with the name, x is returned, and print_saved_residuals lists x under its name;
/// nothing is copied or replayed for it. (A region that now drops it keeps saving it if its replay could not
/// regenerate it: an input of its op has gone.) Otherwise (a leaf, a value already read or named) it records
/// an identity op whose output, a copy of x, carries the name ([m,n] → [m,n]; dy/dx = 1). Throws
/// remat::domain_error for an empty name, and what a policy throws. Takes a string_view so that a long name
/// given as a literal does not build a std::string (a heap allocation) on every call of a training step.
template <class T>
Var<T> checkpoint_name(const Var<T>& x, std::string_view name) {
  if (tag_in_place(detail::CheckpointNameOp::name, x, name)) return x;
  OpCall<detail::CheckpointNameOp> call;
  call.tag = name;
  return apply_op<detail::CheckpointNameOp>(call, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::CheckpointNameOp)
