// The state a chain of layers passes along: one Var<T>, or a std::tuple of Var<T> (an LSTM's (h, c)).
// The schedules (checkpoint_sequential, revolve, run_schedule, checkpoint_sequential_auto) are written once
// over it: a layer maps a state to a state of the same type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "remat/checkpoint.hpp"
#include "remat/errors.hpp"
#include "remat/var.hpp"

namespace remat::detail {

/// chain_state<S>: whether S is a chain's state, its scalar type and how many Vars it holds (`width`).
template <class S>
struct chain_state : std::false_type {};
template <class T>
struct chain_state<Var<T>> : std::true_type {
  using scalar = T;
  static constexpr std::size_t width = 1;
};
template <class T, class... Rest>
struct chain_state<std::tuple<Var<T>, Rest...>> : std::bool_constant<(std::is_same_v<Rest, Var<T>> && ...)> {
  using scalar = T;
  static constexpr std::size_t width = 1 + sizeof...(Rest);
};

template <class S>
constexpr void check_chain_state() {
  static_assert(chain_state<S>::value,
                "a chain's state is a remat::Var<T> or a std::tuple of remat::Var<T> (one T for all): pass x as "
                "one of these, and make every layer return the same type");
}

/// Calls `visit(k, var)` for each Var of the state, k = 0 … width − 1.
template <class T, class Visit>
void for_each_var(const Var<T>& v, Visit&& visit) {
  visit(std::size_t{0}, v);
}
template <class... Vs, class Visit>
void for_each_var(const std::tuple<Vs...>& s, Visit&& visit) {
  std::size_t k = 0;
  std::apply([&](const auto&... v) { (visit(k++, v), ...); }, s);
}

/// The tape every Var of the state is on. Throws tape_error naming `op` for an empty or stale Var, or for Vars
/// of different tapes.
template <class S>
auto chain_tape(const S& s, const char* op) {
  check_chain_state<S>();
  using T = typename chain_state<S>::scalar;
  TapeState<T>* state = nullptr;
  for_each_var(s, [&](std::size_t k, const Var<T>& v) {
    detail::VarAccess::node(v, op);  // throws tape_error for an empty or stale handle
    if (!state) state = detail::VarAccess::state(v);
    if (detail::VarAccess::state(v) != state)
      throw tape_error(std::string(op) + ": Var " + std::to_string(k) +
                       " of the state is on another tape than Var 0; record the whole state on one tape");
  });
  return state;
}

/// Layer `layer` applied to state `s`: layer(s), or for a tuple state layer(vars...) if it takes them unpacked.
/// The result must be of the state's type.
template <class Layer, class S>
S call_layer(const Layer& layer, S s) {
  if constexpr (std::is_invocable_v<const Layer&, S>) {
    static_assert(std::is_convertible_v<std::invoke_result_t<const Layer&, S>, S>,
                  "a layer of a chain returns the state it takes (a Var<T>, or the same std::tuple of Var<T>)");
    return layer(std::move(s));
  } else {
    static_assert(chain_state<S>::width > 1 || !chain_state<S>::value,
                  "a layer of a chain is callable with the state (a Var<T> or a std::tuple of Var<T>)");
    return std::apply(layer, std::move(s));
  }
}

/// Step `step` applied to state `s` at index i: step(i, s) or step(s) (for a tuple state also step(i, vars...)
/// or step(vars...)).
template <class Step, class S>
S call_step(const Step& step, std::int64_t index, S s) {
  if constexpr (std::is_invocable_v<const Step&, std::int64_t, S>) {
    return step(index, std::move(s));
  } else if constexpr (std::is_invocable_v<const Step&, S>) {
    return step(std::move(s));
  } else {
    return std::apply(
        [&](auto&&... v) -> S {
          if constexpr (std::is_invocable_v<const Step&, std::int64_t, decltype(v)...>)
            return step(index, std::forward<decltype(v)>(v)...);
          else
            return step(std::forward<decltype(v)>(v)...);
        },
        std::move(s));
  }
}

/// checkpoint(f, policy) applied to state `s`, where f maps a state to a state: for a tuple state the
/// region's arguments and outputs are its Vars.
template <class F, class Policy, class S>
S checkpoint_state(F&& f, Policy policy, S s) {
  if constexpr (chain_state<S>::width == 1 && std::is_same_v<S, Var<typename chain_state<S>::scalar>>) {
    return checkpoint([&](S v) -> S { return f(std::move(v)); }, std::move(policy))(std::move(s));
  } else {
    auto region = checkpoint([&](auto... v) -> S { return f(S(std::move(v)...)); }, std::move(policy));
    return std::apply([&](auto&&... v) -> S { return region(std::forward<decltype(v)>(v)...); }, std::move(s));
  }
}

}  // namespace remat::detail
