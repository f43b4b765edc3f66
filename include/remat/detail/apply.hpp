// What apply_op (remat/op.hpp) needs besides the public recipe: the static table of an op, the checks of its
// shapes and inputs. The one place where an op struct meets the tape's internals.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "remat/detail/op_kernels.hpp"
#include "remat/detail/tape_state.hpp"
#include "remat/op_context.hpp"
#include "remat/var.hpp"

namespace remat::detail {

/// Op::flops(inputs, arity, output[, params]): an op whose cost depends on its Params takes them.
template <class Op>
double flops_of(const Shape* inputs, int arity, const Shape& output, const Attributes& attributes) {
  using P = typename Op::Params;
  if constexpr (std::is_invocable_r_v<double, decltype(&Op::flops), const Shape*, int, const Shape&, const P&>)
    return Op::flops(inputs, arity, output, attributes.template get_params<P>());
  else
    return Op::flops(inputs, arity, output);
}

/// Op::check_indices(inputs, indices, count), or Op::check_indices(inputs, params, indices, count) for an op whose
/// check depends on its attributes (the dim of gather and index_select).
template <class Op>
void check_indices_with(const Shape* inputs, const Attributes& attributes, const int* indices, std::size_t count) {
  using P = typename Op::Params;
  if constexpr (std::is_invocable_v<decltype(&Op::check_indices), const Shape*, const P&, const int*, std::size_t>)
    Op::check_indices(inputs, attributes.template get_params<P>(), indices, count);
  else
    Op::check_indices(inputs, indices, count);
}

/// check_indices_with<Op>, or null for an op that declares no check_indices.
/// The op's extra shape on a tape of T: Op::extra_shape_of<T> where the op declares it (an extra whose element count
/// depends on sizeof(T): max_pool2d's argmax bytes), else Op::extra_shape.
template <class Op, class T, class = void>
struct TypedExtra : std::false_type {};
template <class Op, class T>
struct TypedExtra<Op, T,
                  std::void_t<decltype(Op::template extra_shape_of<T>(static_cast<const Shape*>(nullptr),
                                                                      std::declval<const typename Op::Params&>()))>>
    : std::true_type {};
template <class Op, class T>
Shape extra_shape_on(const Shape* in, const typename Op::Params& params) {
  if constexpr (TypedExtra<Op, T>::value)
    return Op::template extra_shape_of<T>(in, params);
  else
    return Op::extra_shape(in, params);
}

template <class Op, class = void>
inline constexpr void (*check_indices_of)(const Shape*, const Attributes&, const int*, std::size_t) = nullptr;
template <class Op>
inline constexpr void (*check_indices_of<Op, std::void_t<decltype(&Op::check_indices)>>)(
    const Shape*, const Attributes&, const int*, std::size_t) = &check_indices_with<Op>;

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
                                       Op::view,
                                       &Op::reads,
                                       Op::sign_reads,
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
    VarAccess::node(*v, op);
    if (!state)
      state = VarAccess::state(*v);
    else if (VarAccess::state(*v) != state)
      throw tape_error(std::string(op) + ": its inputs belong to different tapes");
  }
  return state;
}

}  // namespace remat::detail
