// apply_op<Op>(): records one op on the inputs' tape. The one place where an op struct meets the tape.
// The op recipe (OpBase, OpCall, apply_op, the contexts) is public: remat/custom_op.hpp documents it.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "remat/detail/contexts.hpp"
#include "remat/detail/op_kernels.hpp"
#include "remat/detail/parallel.hpp"
#include "remat/detail/tape_state.hpp"
#include "remat/var.hpp"

namespace remat {

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
  /// A shapes-only tape (remat::estimate_memory) may record it without running its forward. Every op that
  /// keeps to the recipe is: its buffers follow from its shapes. Declare false for an op whose forward the
  /// program depends on at record time (it writes, through a pointer in its Params, something the program
  /// reads to decide what to record next, such as a data-dependent size): an estimate would go on without
  /// it, so recording it there throws shapes_only_error naming the op.
  static constexpr bool estimable = true;
};

/// Everything a recorded op carries besides its inputs: its Params, integer data copied to the tape
/// (token ids, class labels: read back with the contexts' indices()), and a name tag for the name
/// policies (OpInfo::tag; checkpoint_name sets it).
template <class Op>
struct OpCall {
  typename Op::Params params{};
  const int* indices = nullptr;
  std::size_t index_count = 0;
  std::string_view tag{};
};

namespace detail {

/// Op::flops(inputs, arity, output[, params]): an op whose cost depends on its Params takes them.
template <class Op>
double flops_of(const Shape* inputs, int arity, const Shape& output, const Attributes& attributes) {
  using P = typename Op::Params;
  if constexpr (std::is_invocable_r_v<double, decltype(&Op::flops), const Shape*, int, const Shape&, const P&>)
    return Op::flops(inputs, arity, output, attributes.template get_params<P>());
  else
    return Op::flops(inputs, arity, output);
}

/// Op::check_indices(inputs, indices, count), or null for an op without one.
template <class Op, class = void>
inline constexpr void (*check_indices_of)(const Shape*, const int*, std::size_t) = nullptr;
template <class Op>
inline constexpr void (*check_indices_of<Op, std::void_t<decltype(&Op::check_indices)>>)(
    const Shape*, const int*, std::size_t) = &Op::check_indices;

/// Whether `name` can name an op: not null, not empty (every error message and OpInfo::name starts with it).
constexpr bool valid_op_name(const char* name) {
  return name != nullptr && name[0] != '\0';
}

/// The static table describing Op for scalar type T (constant-initialised: no guard at run time). A
/// function template, not an inline variable, so that an explicit instantiation declaration
/// (REMAT_OP_KERNELS, remat/detail/op_kernels.hpp) keeps a translation unit from instantiating the op's
/// kernels, which are its only users.
template <class Op, class T>
const OpTable<T>* op_table_of() {
  static_assert(valid_op_name(Op::name),
                "an op's name must be a non-empty string: errors, OpInfo::name and the diagnostics report it");
  static constexpr OpTable<T> table = {Op::name,
                                       Op::kind,
                                       Op::batch_dims,
                                       Op::stops_gradient,
                                       &Op::reads,
                                       &Op::template forward<T>,
                                       &Op::template backward<T>,
                                       &flops_of<Op>,
                                       check_indices_of<Op>};
  return &table;
}

/// The shape_error check_op_shapes throws for the first invalid shape of `s`.
[[noreturn]] inline void throw_op_shape_error(const char* op, const OpShapes& s, std::size_t element_bytes) {
  const Shape* shapes[3] = {&s.output, &s.extra, &s.scratch};
  const char* what[3] = {"output_shape", "extra_shape", "scratch_shape"};
  for (int i = 0; i < 3; ++i) {
    const Shape& shape = *shapes[i];
    const bool may_be_none = i > 0;
    if (valid_op_shape(shape, may_be_none, element_bytes)) continue;
    if (std::any_of(shape.begin(), shape.end(), [](Index d) { return d < 1; }))
      throw shape_error(std::string(op) + ": its " + what[i] + " is " + to_string(shape) +
                        (may_be_none ? "; every dimension must be at least 1, or every one 0 (Shape{}) for none"
                                     : "; every dimension of a tensor must be at least 1"));
    throw shape_error(std::string(op) + ": its " + what[i] + " " + to_string(shape) +
                      " needs more than the 2^48 bytes a tensor may have (" + std::to_string(element_bytes) +
                      " bytes an element)");
  }
  assert(false && "throw_op_shape_error called on valid shapes");
  std::abort();
}

/// Throws shape_error naming `op` unless every dimension of its output shape is at least 1 (as every tensor of
/// remat), of its extra and temporary shapes too or every one 0 (none), and no shape has more than
/// max_value_bytes (2^48) bytes of T: a user op's output_shape, extra_shape or scratch_shape must not make the tape
/// allocate or map a buffer of an empty, negative or overflowing shape. (Runs on every record: the test
/// inlines, the message does not.)
template <class T>
void check_op_shapes(const char* op, const OpShapes& s) {
  constexpr std::size_t b = sizeof(T);
  if (!valid_op_shape(s.output, false, b) || !valid_op_shape(s.extra, true, b) || !valid_op_shape(s.scratch, true, b))
    throw_op_shape_error(op, s, b);
}

[[noreturn]] inline void throw_not_estimable(const char* op) {
  throw shapes_only_error(std::string(op) +
                          ": this op cannot be estimated (its struct declares estimable = false: the program "
                          "depends on what its forward computes), so a shapes-only tape (remat::estimate_memory) "
                          "cannot record it; measure this step with a tape that computes");
}

/// The tape shared by `vars`; throws tape_error naming `op` if a Var is empty, stale, or from another tape.
template <class T, std::size_t N>
TapeState<T>* common_tape(const char* op, const Var<T>* const (&vars)[N]) {
  TapeState<T>* state = nullptr;
  for (const Var<T>* v : vars) {
    v->node(op);
    if (!state)
      state = v->state();
    else if (v->state() != state)
      throw tape_error(std::string(op) + ": its inputs belong to different tapes");
  }
  return state;
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
  detail::TapeState<T>* state = detail::common_tape(Op::name, vars);
  if (!Op::estimable && state->shapes_only()) detail::throw_not_estimable(Op::name);
  const std::int32_t ids[arity] = {first.id(), rest.id()...};  // valid handles (common_tape checked them)
  // Copied as they are (not a default Shape then assigned: a Shape is 72 bytes), contiguous for the op's recipe.
  const Shape shapes[arity] = {state->node(first.id()).shape, state->node(rest.id()).shape...};
  const detail::OpShapes op_shapes{Op::output_shape(shapes, call.params), Op::extra_shape(shapes, call.params),
                                   Op::scratch_shape(shapes, call.params)};
  detail::check_op_shapes<T>(Op::name, op_shapes);
  detail::Attributes attributes;
  attributes.set_params(call.params);
  if (!call.tag.empty()) attributes.tag = state->intern_tag(call.tag);
  const std::int32_t id = state->record(detail::op_table_of<Op, T>(), ids, static_cast<int>(arity), attributes,
                                        op_shapes, call.indices, call.index_count);
  return Var<T>::adopt(state, id);
}

/// Records an op that reads no tensor (arity 0: its output is written from its Params alone, as full_like's)
/// on the tape of `on_tape_of`, whose value it does not read: nothing the op computes depends on a value, so a
/// checkpoint's replay regenerates it from nothing, and it never keeps a value alive. Its output requires no
/// gradient. Throws what apply_op throws.
template <class Op, class T>
Var<T> apply_op_without_inputs(const typename Op::Params& params, const Var<T>& on_tape_of) {
  on_tape_of.node(Op::name);
  detail::TapeState<T>* state = on_tape_of.state();
  if (!Op::estimable && state->shapes_only()) detail::throw_not_estimable(Op::name);
  const detail::OpShapes op_shapes{Op::output_shape(nullptr, params), Op::extra_shape(nullptr, params),
                                   Op::scratch_shape(nullptr, params)};
  detail::check_op_shapes<T>(Op::name, op_shapes);
  detail::Attributes attributes;
  attributes.set_params(params);
  const std::int32_t id = state->record(detail::op_table_of<Op, T>(), nullptr, 0, attributes, op_shapes, nullptr, 0);
  return Var<T>::adopt(state, id);
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

namespace detail {

/// Base of one-input elementwise ops: Derived supplies name, residuals (reads_input0, reads_output or
/// reads_nothing: what its derivative reads), flops_per_element, value(x, params) and derivative(x, y, g, params)
/// on Eigen arrays (y = output, g = dL/dy).
template <class Derived>
struct UnaryElementwise : OpBase {
  static constexpr OpKind kind = OpKind::elementwise;
  template <class P>
  static Shape output_shape(const Shape* in, const P&) {
    return in[0];
  }
  static unsigned reads(GradInputs g) { return wants(g, 0) ? Derived::residuals : reads_nothing; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto x = c.in(0);
    auto y = c.out();
    const auto p = params_of<typename Derived::Params>(c);
    for_row_blocks(y.rows(), y.cols(), Derived::flops_per_element, [&](Index r0, Index n) {
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
    add_grad_rows(c, 0, Derived::flops_per_element, [&](Index r0, Index n) {
      return Derived::derivative(r.middleRows(r0, n).array(), r.middleRows(r0, n).array(), g.middleRows(r0, n).array(),
                                 p);
    });
  }
  static double flops(const Shape*, int, const Shape& out) {
    return Derived::flops_per_element * static_cast<double>(out.numel());
  }
};

}  // namespace detail
}  // namespace remat
