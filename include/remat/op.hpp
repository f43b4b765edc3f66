// The op recipe: how an op is written, built-in or a user's, with its own forward and backward (the role of
// jax.custom_vjp and torch.autograd.Function). Every op of remat/ops/ is written with it and nothing else of the
// tape, so checkpoint policies, replay, memory accounting and the schedules treat a user's op exactly like a
// built-in one.
//
// An op is a struct deriving from remat::OpBase with:
//   static constexpr const char* name;            reported in errors, OpInfo::name and print_saved_residuals
//                                                 (non-empty: a null or empty name does not compile)
//   static constexpr remat::OpKind kind;          what policies see (dot, elementwise, ...)
//   struct Params { ... };                        optional: its attributes, trivially copyable, ≤ 40 bytes
//                                                 (≤ 24 bytes for a random op: max_random_params_bytes); a
//                                                 shape it carries is a remat::PackedShape (36 bytes,
//                                                 remat/shape.hpp), never a Shape (72)
//   static constexpr bool batch_dims;             optional: a dot with batch dimensions
//   static constexpr bool stops_gradient;         optional: its output requires no gradient (detach); the
//                                                 sweep never runs its backward
//   static constexpr bool view;                   optional: its output is input 0's buffer read with another
//                                                 shape of as many elements (reshape): no copy, its forward
//                                                 never runs, and the buffer counts once
//   static constexpr unsigned sign_reads;        optional: the reads its backward needs only the sign of (relu's
//                                                 output), served by a one-bit Compression::sign()
//   static constexpr bool estimable;              optional, default true: false if the program depends, at
//                                                 record time, on what its forward computes (a shapes-only
//                                                 tape, remat::estimate_memory, then refuses it: shapes_only_error)
//   static constexpr bool training_only;          optional, default false: true for an op that exists only in
//                                                 training (dropout): in evaluation mode apply_op records nothing
//                                                 and returns the first input
//   static std::uint64_t random_draws(const remat::Shape* in, const remat::Shape& out, const Params&);
//       optional, for kind OpKind::random: draws of c.random() the forward uses (default out.numel())
//   static unsigned reads(remat::GradInputs g);   what its backward reads for the gradients in g:
//                                                 reads_input0..2, reads_output, reads_extra (residuals by need)
//   static remat::Shape output_shape(const remat::Shape* in, const Params&);    throws remat::shape_error
//   static remat::Shape extra_shape(const remat::Shape* in, const Params&);     optional extra residual, in
//       elements of T; or template <class T> static remat::Shape extra_shape_of(in, params) when its element count
//       depends on sizeof(T) (max_pool2d keeps its argmax as bytes)
//   static remat::Shape scratch_shape(const remat::Shape* in, const Params&);   optional temporary of its
//       forward and backward (c.scratch()), from the tape's pool, never saved: the kernels must not allocate
//       (apply_op throws shape_error naming the op for an output without a row or column, or an extra or
//       scratch shape that is neither [0,0], none, nor at least [1,1], or of more than 2^48 bytes)
//   template <class T> static void forward(const remat::ForwardContext<T>& c);  writes c.out() (and c.extra());
//       an op of kind OpKind::random draws from c.random(), a counter-based RandomStream that is the same at
//       every replay, so the draws are never stored
//   template <class T> static void backward(const remat::BackwardContext<T>& c);
//       for each k with c.wants_grad(k): c.add_grad(k, expression) or writes every element of
//       c.grad_target(k); reads only what reads() declared (the rest may have been freed)
//   static double flops(const remat::Shape* in, int arity, const remat::Shape& out);   forward FLOPs
//       (or flops(in, arity, out, const Params&) for a cost that depends on the attributes)
//   static void check_indices(const remat::Shape* in, const int* indices, std::size_t count);   optional: throws
//       for integer data the op cannot take (or check_indices(in, const Params&, indices, count)); without it
//       CapturedStep::set_indices refuses the op
//
// and is recorded with remat::apply_op<Op>(inputs...), apply_op<Op>(params, inputs...) or
// apply_op<Op>(OpCall<Op>{params, indices, count, tag}, inputs...) (at most remat::max_inputs inputs,
// all on one tape). The forward must be deterministic (a replay must reproduce it bitwise), may change
// what the tape does not own only when c.recording() (once per step: not on a replay or a regeneration), and should
// not throw; if it does while it is recorded, the op is not recorded. The backward, and the forward when
// a checkpoint replay re-runs it, must not throw: the sweep cannot stop halfway, so an exception from them
// ends the program (std::terminate). Verify the backward with remat::gradcheck
// (remat/gradcheck.hpp). docs/custom-ops.md has a complete example (swiglu), which
// tests/ops/custom_op_test.cpp checks.
//
// The op's public function checks its arguments (x.shape("op") names the op in the error for a bad handle),
// then returns apply_op's Var. The contexts' kernels may run on remat's thread team with for_row_blocks and
// add_grad_rows; a one-input elementwise op derives from UnaryElementwise and gives only its value and
// derivative. An op made of several records (concat: a tree of joins) checks every input first (check_input,
// same_tape, valid_output_shape of its whole result), then reserve_records for all of them, so that it is recorded
// whole or not at all; tag_in_place names an op's output without a record (checkpoint_name).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "remat/detail/apply.hpp"
#include "remat/detail/parallel.hpp"
#include "remat/op_context.hpp"
#include "remat/op_info.hpp"
#include "remat/var.hpp"

namespace remat {

// What docs/custom-ops.md promises of a shape in an op's Params: a PackedShape and one 4-byte attribute fit.
static_assert(sizeof(PackedShape) + sizeof(float) == max_params_bytes, "a PackedShape leaves 4 bytes of Params");

/// Defaults an op struct may override.
struct OpBase {
  /// The op's own attributes, stored by value in each recorded node (trivially copyable, at most
  /// max_params_bytes): an op with attributes declares its own `struct Params`.
  struct Params {};
  /// Shape of the op-specific residual its backward reads (empty: none).
  template <class P>
  static Shape extra_shape(const Shape* /*inputs*/, const P& /*params*/) {
    return {};
  }
  /// Shape of a temporary its forward and backward use (ForwardContext::scratch(); empty: none). It comes
  /// from the tape's pool while the kernel runs and counts in peak_bytes, never in saved_bytes.
  template <class P>
  static Shape scratch_shape(const Shape* /*inputs*/, const P& /*params*/) {
    return {};
  }
  /// A dot with batch dimensions (a batched product); dots_with_no_batch_dims_saveable does not save it.
  static constexpr bool batch_dims = false;
  /// Its output requires no gradient whatever its inputs (detach): the sweep never runs its backward.
  static constexpr bool stops_gradient = false;
  /// Its output is input 0's elements as they are, read with another shape of as many elements (reshape, view,
  /// flatten, squeeze, unsqueeze: PyTorch's views of a contiguous tensor). Then the output shares input 0's buffer:
  /// nothing is copied, the forward is never called (a replay re-points the output instead), the buffer counts
  /// once in memory() and stays while either value is wanted, and a memory budget evicts neither while the view
  /// refers to it. apply_op throws shape_error naming the op if the output's element count is not input 0's. The
  /// backward runs as for any op (a view's copies dy into dx).
  static constexpr bool view = false;
  /// Which of its reads (reads_input0..2, reads_output) its backward needs only the sign of (x > 0), as relu's
  /// reads its output: such a read is served by a value a policy stores as Compression::sign() (one bit an
  /// element), decoded as 1 where x > 0 and 0 elsewhere — so the backward must read it only through x > 0.
  static constexpr unsigned sign_reads = reads_nothing;
  /// A shapes-only tape (remat::estimate_memory) may record it without running its forward. Every op that
  /// keeps to the recipe is: its buffers follow from its shapes. Declare false for an op whose forward the
  /// program depends on at record time (it writes, through a pointer in its Params, something the program
  /// reads to decide what to record next, such as a data-dependent size): an estimate would go on without
  /// it, so recording it there throws shapes_only_error naming the op.
  static constexpr bool estimable = true;
  /// Exists only in training, as dropout: in evaluation mode (Tape::set_training(false)) apply_op records
  /// nothing and returns its first input as it is (it throws shape_error naming the op if the op's output shape is
  /// not its first input's).
  static constexpr bool training_only = false;
  /// For an op of kind OpKind::random: how many draws of its RandomStream (ForwardContext::random()) it uses.
  /// The tape's random offset advances by that much when the op is recorded, so the next random op draws new
  /// numbers. Default: one per output element.
  template <class P>
  static std::uint64_t random_draws(const Shape* /*inputs*/, const Shape& output, const P& /*params*/) {
    return static_cast<std::uint64_t>(output.numel());
  }
};

/// Everything a recorded op carries besides its inputs: its Params, integer data copied to the tape
/// (token ids, class labels: read back with the contexts' indices()), and a name tag for the name
/// policies (OpInfo::tag; checkpoint_name sets it).
template <class Op>
struct OpCall {
  typename Op::Params params{};  ///< the op's attributes
  const int* indices = nullptr;  ///< integer data copied to the tape (null for none)
  std::size_t index_count = 0;   ///< entries of indices
  std::string_view tag{};        ///< a name for the name policies (copied; empty for none)
};

namespace detail {

/// What a training_only op returns in evaluation: its first input, as it is. Throws shape_error naming the op if
/// its output shape for these inputs would not be the first input's (it could not then be the identity).
template <class Op, class T, class P>
Var<T> evaluation_identity(const Var<T>& first, const Shape* shapes, const P& params) {
  const Shape out = Op::output_shape(shapes, params);
  if (!(out == shapes[0]))
    throw shape_error(std::string(Op::name) + ": a training_only op is the identity in evaluation, but its output " +
                      "shape " + to_string(out) + " is not its first input's " + to_string(shapes[0]));
  return first;
}

/// Throws shape_error naming a view op (OpBase::view) whose output would not hold as many elements as its input 0
/// (it reads that buffer as it is), or that declares an extra or a temporary (a view computes nothing).
inline void check_view_shapes(const char* op, const Shape& input, const OpShapes& shapes) {
  if (shapes.output.numel() != input.numel())
    throw shape_error(std::string(op) + ": a view op's output " + to_string(shapes.output) + " must hold as many " +
                      "elements as its input 0 " + to_string(input) + ", whose buffer it reads as it is");
  if (shapes.extra.numel() != 0 || shapes.scratch.numel() != 0)
    throw shape_error(std::string(op) + ": a view op computes nothing, so it has no extra residual or temporary");
}

/// For an op of kind OpKind::random: keeps the tape's current (seed, offset) in the op's node (its RandomStream)
/// and returns how far the tape's offset must advance once the op is recorded. 0 for any other op.
template <class Op, class T, class P>
std::uint64_t take_random_stream(const TapeState<T>& state, const Shape* inputs, const Shape& output, const P& params,
                                 Attributes& attributes) {
  if constexpr (Op::kind == OpKind::random) {
    static_assert(sizeof(P) <= max_random_params_bytes,
                  "a random op's Params must fit in max_random_params_bytes: its RandomStream takes the rest");
    store_random_stream(attributes, RandomStream(state.random_seed(), state.random_offset()));
    return Op::random_draws(inputs, output, params);
  } else {
    return 0;
  }
}

}  // namespace detail

/// Checks the inputs, infers the shape (Op::output_shape throws shape_error), records Op and runs its
/// forward (not on a shapes-only tape). Throws tape_error for an empty, stale or foreign input,
/// shapes_only_error for an op declaring estimable = false on a shapes-only tape, what output_shape throws, shape_error
/// naming the op for an output shape without a row or a column, an extra or temporary shape that is
/// neither [0,0] (none) nor at least [1,1], or a shape of more than 2^48 bytes (detail::max_value_bytes), and
/// std::bad_alloc; the tape is unchanged then.
template <class Op, class T, class... Rest>
Var<T> apply_op(const OpCall<Op>& call, const Var<T>& first, const Rest&... rest) {
  constexpr std::size_t arity = 1 + sizeof...(Rest);
  static_assert(arity <= max_inputs, "an op takes at most max_inputs inputs");
  const Var<T>* vars[arity] = {&first, &rest...};
  using detail::VarAccess;
  detail::TapeState<T>* state = detail::common_tape(Op::name, vars);
  // Valid handles (common_tape checked them).
  const std::int32_t ids[arity] = {VarAccess::id(first), VarAccess::id(rest)...};
  // Copied as they are (not a default Shape then assigned: a Shape is 72 bytes), contiguous for the op's recipe.
  const Shape shapes[arity] = {state->node(VarAccess::id(first)).shape, state->node(VarAccess::id(rest)).shape...};
  if constexpr (Op::training_only)
    if (!state->training()) return detail::evaluation_identity<Op>(first, shapes, call.params);
  if (!Op::estimable && state->shapes_only()) detail::throw_not_estimable(Op::name);
  const detail::OpShapes op_shapes{Op::output_shape(shapes, call.params),
                                   detail::extra_shape_on<Op, T>(shapes, call.params),
                                   Op::scratch_shape(shapes, call.params)};
  detail::check_op_shapes<T>(Op::name, op_shapes);
  if constexpr (Op::view) detail::check_view_shapes(Op::name, shapes[0], op_shapes);
  detail::Attributes attributes;
  attributes.set_params(call.params);
  if (!call.tag.empty()) attributes.tag = state->intern_tag(call.tag);
  const std::uint64_t draws = detail::take_random_stream<Op>(*state, shapes, op_shapes.output, call.params, attributes);
  const std::int32_t id = state->record(detail::op_table_of<Op, T>(), ids, shapes, static_cast<int>(arity), attributes,
                                        op_shapes, call.indices, call.index_count);
  state->advance_random_offset(draws);  // only once the op is recorded: a refused op draws nothing
  return VarAccess::adopt(state, id);
}

/// Records an op that reads no tensor (arity 0: its output is written from its Params alone, as full_like's)
/// on the tape of `on_tape_of`, whose value it does not read: nothing the op computes depends on a value, so a
/// checkpoint's replay regenerates it from nothing, and it never keeps a value alive. Its output requires no
/// gradient. Throws what apply_op throws.
template <class Op, class T>
Var<T> apply_op_without_inputs(const typename Op::Params& params, const Var<T>& on_tape_of) {
  static_assert(!Op::training_only, "a training_only op returns its first input in evaluation: it needs one");
  static_assert(!Op::view, "a view op reads its input 0's buffer: it needs one");
  using detail::VarAccess;
  VarAccess::node(on_tape_of, Op::name);
  detail::TapeState<T>* state = VarAccess::state(on_tape_of);
  if (!Op::estimable && state->shapes_only()) detail::throw_not_estimable(Op::name);
  const detail::OpShapes op_shapes{Op::output_shape(nullptr, params), detail::extra_shape_on<Op, T>(nullptr, params),
                                   Op::scratch_shape(nullptr, params)};
  detail::check_op_shapes<T>(Op::name, op_shapes);
  detail::Attributes attributes;
  attributes.set_params(params);
  const std::uint64_t draws = detail::take_random_stream<Op>(*state, nullptr, op_shapes.output, params, attributes);
  const std::int32_t id =
      state->record(detail::op_table_of<Op, T>(), nullptr, nullptr, 0, attributes, op_shapes, nullptr, 0);
  state->advance_random_offset(draws);
  return VarAccess::adopt(state, id);
}

/// apply_op with Params only.
template <class Op, class T, class... Rest>
Var<T> apply_op(const typename Op::Params& params, const Var<T>& first, const Rest&... rest) {
  OpCall<Op> call;
  call.params = params;
  return apply_op<Op>(call, first, rest...);
}

/// apply_op with default Params.
template <class Op, class T, class... Rest>
Var<T> apply_op(const Var<T>& first, const Rest&... rest) {
  return apply_op<Op>(OpCall<Op>{}, first, rest...);
}

// ---- ops recorded as several records, and naming in place ----
// apply_op records one op whole or not at all. An op made of several records (concat of k parts is a tree of
// three-input joins) keeps that guarantee by checking every input (check_input, same_tape) and reserving room for
// every record (reserve_records) before the first: then a bad part or a std::bad_alloc leaves nothing recorded.

/// Throws, naming `op`, what apply_op would throw for `v` as an input of `op`, and changes nothing: tape_error
/// for an empty Var or one whose tape was cleared or destroyed, freed_value_error for a freed value, tape_error
/// for a value computed inside a checkpointed function that did not return it, stale_value_error for a
/// Parameter modified since it was recorded. For an op recorded as several records, which checks each input
/// before the first record (a bad input found at the third record would leave the first two on the tape).
template <class T>
void check_input(const char* op, const Var<T>& v) {
  detail::VarAccess::node(v, op);  // valid, and its tape live
  detail::VarAccess::state(v)->check_input(op, detail::VarAccess::id(v));
}

/// Whether `a` and `b` are valid handles (Var::valid()) on one tape, as every input of one op must be (apply_op
/// throws tape_error otherwise): an op of several records checks it first, to name the part that is not.
template <class T>
bool same_tape(const Var<T>& a, const Var<T>& b) {
  return a.valid() && b.valid() && detail::VarAccess::state(a) == detail::VarAccess::state(b);
}

/// Whether apply_op accepts `shape` as the output shape of an op on a tape of T: every dimension at least 1 and at
/// most 2^48 bytes. An op of several records checks its whole result's shape with it before the first record: the
/// partial results of a tree of joins are then valid too, and none of the records throws shape_error halfway.
template <class T>
bool valid_output_shape(const Shape& shape) {
  return detail::valid_op_shape(shape, false, sizeof(T));
}

/// Room, on the tape of `on_tape_of` (whose value is not read), for `count` records whose outputs have the shapes
/// `outputs[0 … count)`, each without extra, temporary or indices: their nodes, their buffers from the tape's
/// pool and, inside checkpoint regions, what closing the regions needs. Those records, made next with
/// apply_op, then throw no std::bad_alloc (only what a policy or a forward throws, and under a memory budget what
/// an eviction trial throws), so an op of several records whose inputs and whole shape were checked first
/// (check_input) is recorded whole or not at all. Allocates nothing once the tape's stores have grown (a
/// steady training step). Throws tape_error naming `op` for an empty or stale `on_tape_of` or a tape a
/// CapturedStep holds, freed_value_error for a freed one, shape_error naming `op` for a shape apply_op would
/// refuse as an output (a dimension below 1, more than 2^48 bytes), std::bad_alloc with the tape's memory()
/// figures unchanged.
template <class T>
void reserve_records(const char* op, const Var<T>& on_tape_of, const Shape* outputs, std::size_t count) {
  detail::VarAccess::node(on_tape_of, op);
  for (std::size_t i = 0; i < count; ++i)
    if (!valid_output_shape<T>(outputs[i]))
      detail::throw_op_shape_error(op, detail::OpShapes{outputs[i], {}, {}}, sizeof(T));
  detail::VarAccess::state(on_tape_of)->reserve_records(op, outputs, count);
}

/// Names `x` itself `name` (OpInfo::tag, what the name policies select) when `x` is an op's output that no op has
/// read yet and that has no name: nothing has been decided from its name then, so the policies of the open
/// checkpoint regions enclosing it are asked again with the name, and no record is made (checkpoint_name's first
/// choice: the named value is x's, neither copied nor replayed). Returns false, changing nothing, otherwise (a
/// leaf, a value already read or named); the caller then records an op whose OpCall::tag is the name. Whether it
/// names in place depends on neither regions nor memory, so a program names the same values with checkpoints as
/// without. Throws domain_error naming `op` for an empty name, tape_error naming `op` for an empty or stale `x`
/// or a tape a CapturedStep holds, freed_value_error for a freed `x`, what a policy throws, std::bad_alloc, with
/// the tape unchanged.
template <class T>
bool tag_in_place(const char* op, const Var<T>& x, std::string_view name) {
  if (name.empty()) throw domain_error(std::string(op) + ": the name must not be empty");
  detail::VarAccess::node(x, op);
  return detail::VarAccess::state(x)->name_in_place(op, detail::VarAccess::id(x), name);
}

/// Base of one-input elementwise ops: Derived supplies name, residuals (reads_input0, reads_output or
/// reads_nothing: what its derivative reads), flops_per_element, value(x, params) and derivative(x, y, g, params)
/// on Eigen arrays (y = output, g = dL/dy).
template <class Derived>
struct UnaryElementwise : OpBase {
  static constexpr OpKind kind = OpKind::elementwise;  ///< what policies see
  /// The input's shape.
  template <class P>
  static Shape output_shape(const Shape* in, const P&) {
    return in[0];
  }
  /// Derived::residuals when the input's gradient is asked for, else nothing.
  static unsigned reads(GradInputs g) { return wants(g, 0) ? Derived::residuals : reads_nothing; }
  /// y = value(x) by row blocks on remat's team.
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    auto y = c.out();
    const auto p = params_of<typename Derived::Params>(c);
    detail::for_row_blocks(y.rows(), y.cols(), Derived::flops_per_element, [&](Index r0, Index n) {
      y.middleRows(r0, n).array() = Derived::value(x.middleRows(r0, n).array(), p);
    });
  }
  /// Row blocks of the one residual the derivative reads (it is passed as both x and y: the other one may
  /// have been freed), of dL/dy itself when it reads none.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    static_assert(
        Derived::residuals == reads_output || Derived::residuals == reads_input0 || Derived::residuals == reads_nothing,
        "a UnaryElementwise derivative reads its input, its output or neither");
    const auto p = params_of<typename Derived::Params>(c);
    const auto g = c.grad_out();
    const auto r = Derived::residuals == reads_output ? c.out() : Derived::residuals == reads_input0 ? c.in(0) : g;
    detail::add_grad_rows(c, 0, Derived::flops_per_element, [&](Index r0, Index n) {
      return Derived::derivative(r.middleRows(r0, n).array(), r.middleRows(r0, n).array(), g.middleRows(r0, n).array(),
                                 p);
    });
  }
  /// flops_per_element per output element.
  static double flops(const Shape*, int, const Shape& out) {
    return Derived::flops_per_element * static_cast<double>(out.numel());
  }
};

/// f(begin, count) over the row blocks of a [rows, cols] matrix view on remat's thread team (remat::set_num_threads),
/// `cost` FLOPs per element deciding whether it is worth splitting: an op's forward writes each block of rows.
using detail::for_row_blocks;
/// BackwardContext::add_grad(k, e) by row blocks on remat's team: make(begin, count) returns rows
/// [begin, begin + count) of the gradient's Eigen expression (not a matrix product).
using detail::add_grad_rows;

}  // namespace remat
