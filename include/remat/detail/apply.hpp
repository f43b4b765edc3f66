// apply<Op>(): records one op on the inputs' tape. The one place where an op struct meets the tape.
#pragma once

#include <cstdint>
#include <string>

#include "remat/detail/contexts.hpp"
#include "remat/detail/tape_state.hpp"
#include "remat/var.hpp"

namespace remat::detail {

/// Defaults an op struct may override.
struct OpBase {
  /// Shape of the op-specific residual its backward reads (empty: none).
  static Shape extra_shape(const Shape* /*inputs*/, const Attributes& /*attributes*/) { return {}; }
  /// A dot with batch dimensions (a batched product); dots_with_no_batch_dims_saveable does not save it.
  static constexpr bool batch_dims = false;
};

/// The static table describing Op for scalar type T.
template <class Op, class T>
inline const OpTable<T> op_table = {
    Op::name, Op::kind, Op::batch_dims, &Op::reads, &Op::template forward<T>, &Op::template backward<T>, &Op::flops};

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

/// Checks the inputs, infers the shape (Op::output_shape throws shape_error), records and runs Op.
template <class Op, class T, class... Rest>
Var<T> apply(const Attributes& attributes, const Var<T>& first, const Rest&... rest) {
  constexpr std::size_t arity = 1 + sizeof...(Rest);
  static_assert(arity <= max_inputs, "an op takes at most max_inputs inputs");
  const Var<T>* vars[arity] = {&first, &rest...};
  TapeState<T>* state = common_tape(Op::name, vars);
  Shape shapes[arity];
  std::int32_t ids[arity];
  for (std::size_t k = 0; k < arity; ++k) {
    shapes[k] = vars[k]->shape();
    ids[k] = vars[k]->id();
  }
  const Shape out = Op::output_shape(shapes, attributes);
  const Shape extra = Op::extra_shape(shapes, attributes);
  const std::int32_t id = state->record(&op_table<Op, T>, ids, static_cast<int>(arity), attributes, out, extra);
  return Var<T>::adopt(state, id);
}

template <class Op, class T, class... Rest>
Var<T> apply(const Var<T>& first, const Rest&... rest) {
  return apply<Op>(Attributes{}, first, rest...);
}

/// Base of one-input elementwise ops: Derived supplies name, residuals (reads_input0 or reads_output:
/// what its derivative reads), flops_per_element, value(x, attributes) and derivative(x, y, g, attributes)
/// on Eigen arrays (y = output, g = dL/dy).
template <class Derived>
struct UnaryElementwise : OpBase {
  static constexpr OpKind kind = OpKind::elementwise;
  static Shape output_shape(const Shape* in, const Attributes&) { return in[0]; }
  static unsigned reads(GradInputs g) { return wants(g, 0) ? Derived::residuals : reads_nothing; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    c.out().array() = Derived::value(c.in(0).array(), c.attributes());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    c.add_grad(0, Derived::derivative(c.in(0).array(), c.out().array(), c.grad_out().array(), c.attributes()));
  }
  static double flops(const Shape*, int, const Shape& out) {
    return Derived::flops_per_element * static_cast<double>(out.size());
  }
};

}  // namespace remat::detail
