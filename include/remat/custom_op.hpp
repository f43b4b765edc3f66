// The op recipe as a public API: how a user adds an op with their own forward and backward (the role of
// jax.custom_vjp and torch.autograd.Function). Checkpoint policies, replay, memory accounting and the
// schedules treat such an op exactly like a built-in one, because built-in ops are written the same way.
//
// An op is a struct deriving from remat::OpBase with:
//   static constexpr const char* name;            reported in errors, OpInfo::name and print_saved_residuals
//                                                 (non-empty: a null or empty name does not compile)
//   static constexpr remat::OpKind kind;          what policies see (dot, elementwise, ...)
//   struct Params { ... };                        optional: its attributes, trivially copyable, ≤ 40 bytes
//   static constexpr bool batch_dims;             optional: a dot with batch dimensions
//   static constexpr bool stops_gradient;         optional: its output requires no gradient (detach); the
//                                                 sweep never runs its backward
//   static constexpr bool estimable;              optional, default true: false if the program depends, at
//                                                 record time, on what its forward computes (a shapes-only
//                                                 tape, remat::estimate_memory, then refuses it: shapes_only_error)
//   static unsigned reads(remat::GradInputs g);   what its backward reads for the gradients in g:
//                                                 reads_input0..2, reads_output, reads_extra (residuals by need)
//   static remat::Shape output_shape(const remat::Shape* in, const Params&);    throws remat::shape_error
//   static remat::Shape extra_shape(const remat::Shape* in, const Params&);     optional extra residual
//   static remat::Shape scratch_shape(const remat::Shape* in, const Params&);   optional temporary of its
//       forward and backward (c.scratch()), from the tape's pool, never saved: the kernels must not allocate
//       (apply_op throws shape_error naming the op for an output without a row or column, or an extra or
//       scratch shape that is neither [0,0], none, nor at least [1,1], or of more than 2^48 bytes)
//   template <class T> static void forward(const remat::ForwardContext<T>& c);  writes c.out() (and c.extra())
//   template <class T> static void backward(const remat::BackwardContext<T>& c);
//       for each k with c.wants_grad(k): c.add_grad(k, expression) or writes every element of
//       c.grad_target(k); reads only what reads() declared (the rest may have been freed)
//   static double flops(const remat::Shape* in, int arity, const remat::Shape& out);   forward FLOPs
//       (or flops(in, arity, out, const Params&) for a cost that depends on the attributes)
//
// and is recorded with remat::apply_op<Op>(inputs...), apply_op<Op>(params, inputs...) or
// apply_op<Op>(OpCall<Op>{params, indices, count, tag}, inputs...) (at most remat::max_inputs inputs,
// all on one tape). The forward must be deterministic (a replay must reproduce it bitwise) and should
// not throw; if it does while it is recorded, the op is not recorded. The backward, and the forward when
// a checkpoint replay re-runs it, must not throw: the sweep cannot stop halfway, so an exception from them
// ends the program (std::terminate). Verify the backward with remat::gradcheck
// (remat/gradcheck.hpp). docs/design.md §5 has a complete example (swiglu), which
// tests/ops/custom_op_test.cpp checks.
#pragma once

#include "remat/detail/apply.hpp"
#include "remat/detail/contexts.hpp"
#include "remat/op_info.hpp"
