// checkpoint(): records a function as a region whose residuals a policy may drop and replay regenerates.
#pragma once

#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/policies.hpp"
#include "remat/var.hpp"

namespace remat {
namespace detail {

template <class A>
struct is_var : std::false_type {};
template <class T>
struct is_var<Var<T>> : std::true_type {};

template <class A, class... Rest>
auto region_tape(const A& a, const Rest&... rest) {
  if constexpr (is_var<std::decay_t<A>>::value) {
    detail::VarAccess::node(a, "checkpoint");
    return detail::VarAccess::state(a);
  } else {
    static_assert(sizeof...(Rest) > 0, "checkpoint: the checkpointed function needs at least one remat::Var argument");
    return region_tape(rest...);
  }
}

template <class P>
policies::Decision call_policy(const void* policy, const OpInfo& op) {
  return policies::Decision((*static_cast<const P*>(policy))(op));
}

/// How many Vars a checkpointed function's result (a Var or a std::tuple) holds.
template <class R>
struct var_count : std::integral_constant<std::size_t, 0> {};
template <class T>
struct var_count<Var<T>> : std::integral_constant<std::size_t, 1> {};
template <class... Vs>
struct var_count<std::tuple<Vs...>>
    : std::integral_constant<std::size_t, (var_count<std::decay_t<Vs>>::value + ... + 0)> {};

template <class T>
void collect_outputs(const TapeState<T>* state, std::vector<std::int32_t>& ids, const Var<T>& v) {
  if (detail::VarAccess::state(v) == state && v.valid()) ids.push_back(detail::VarAccess::id(v));
}
template <class T, class... Vs>
void collect_outputs(const TapeState<T>* state, std::vector<std::int32_t>& ids, const std::tuple<Vs...>& t) {
  std::apply([&](const auto&... v) { (collect_outputs(state, ids, v), ...); }, t);
}

}  // namespace detail

/// The callable checkpoint() returns; same signature as the wrapped function.
template <class F, class Policy>
class Checkpointed {
 public:
  /// Wraps f with its policy (checkpoint() makes one).
  Checkpointed(F f, Policy policy) : f_(std::move(f)), policy_(std::move(policy)) {}

  /// Calls f(args...) recorded as a checkpoint region on the tape of its Var arguments and returns what f
  /// returns (see checkpoint()). Throws what f throws, with the region removed; tape_error if f clears or
  /// destroys the tape.
  template <class... Args>
  auto operator()(Args&&... args) const {
    auto* state = detail::region_tape(args...);
    const std::uint32_t generation = state->generation();
    // Room for the outputs before the region opens: closing it cannot fail once f has returned.
    using Result = std::decay_t<std::invoke_result_t<const F&, Args&&...>>;
    state->output_scratch().reserve(detail::var_count<Result>::value);
    const std::int32_t region = state->open_region(&detail::call_policy<Policy>, &policy_);
    state->add_ref();  // the state outlives a Tape destroyed inside f
    struct Release {
      decltype(state) s;
      ~Release() { s->drop_ref(); }
    } release{state};
    try {
      auto result = f_(std::forward<Args>(args)...);
      if (!state->region_is_innermost(region, generation))
        throw tape_error("checkpoint: the tape was cleared or destroyed while the checkpointed function ran");
      std::vector<std::int32_t>& outputs = state->output_scratch();
      outputs.clear();
      detail::collect_outputs(state, outputs, result);  // within the capacity reserved above
      state->close_region(outputs);                     // does not throw
      return result;
    } catch (...) {
      if (state->region_is_innermost(region, generation)) state->abort_region();
      throw;
    }
  }

 private:
  F f_;
  Policy policy_;
};

/// Gradient checkpointing (rematerialization), like jax.checkpoint(f, policy=...).
///
/// Returns a callable with f's signature. f takes one or more Var<T> (other arguments pass through)
/// and returns a Var<T> or a std::tuple of Var<T>. Each call records f's ops as a region on the tape
/// of its Var arguments. The policy (see remat::policies) decides per op whether its output may be
/// saved; what it does not save is freed after the forward pass. When the backward sweep enters the
/// region it replays the recorded ops (it does not call f again) to regenerate what the region's
/// backward needs, runs that backward, and frees the replayed values.
///
/// Consequences: side effects in f happen once per call; dropout inside f regenerates the same mask;
/// values captured by f (weights not passed as arguments) are kept by reference and receive gradients.
/// Values computed inside f may be used outside only if f returns them (else tape_error). Regions nest.
/// Memory after the forward pass: what JAX's partial evaluation keeps — the values the policy saves
/// that a backward or the replay reads, the inputs the replay reads, the outputs a backward reads
/// (docs/checkpointing.md). Time: one replay of the dropped values the backward needs.
template <class F, class Policy = policies::NothingSaveable>
Checkpointed<F, Policy> checkpoint(F f, Policy policy = policies::nothing_saveable) {
  return Checkpointed<F, Policy>(std::move(f), std::move(policy));
}

}  // namespace remat
