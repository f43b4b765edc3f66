// revolve(): binomial checkpointing (Griewank & Walther, Algorithm 799) of a loop of identical steps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "remat/checkpoint.hpp"
#include "remat/errors.hpp"

namespace remat {
namespace detail {

/// C(n, k) for the small arguments of the binomial schedule (exact in 64 bits for the ranges used here).
inline std::int64_t binomial(std::int64_t n, std::int64_t k) {
  if (k < 0 || n < 0 || k > n) return 0;
  k = std::min(k, n - k);
  std::int64_t result = 1;
  for (std::int64_t i = 1; i <= k; ++i) result = result * (n - k + i) / i;  // exact: C(n−k+i, i) each step
  return result;
}

/// r(n, s): the smallest r with C(s + r, s) ≥ n, the number of times the busiest step is evaluated.
inline std::int64_t revolve_repetitions(std::int64_t steps, std::int64_t checkpoints) {
  std::int64_t r = 0, range = 1;  // range = C(s + r, s)
  while (range < steps) {
    ++r;
    range = range * (checkpoints + r) / r;
  }
  return r;
}

/// The first checkpoint position of the binomial schedule for `steps` steps from a stored state with
/// `checkpoints` states storable (the stored one included): advance m steps, store the state, treat the
/// last steps − m steps with checkpoints − 1 states, then the first m with all of them. Any m with
/// C(s+r−2, s) ≤ m ≤ C(s+r−1, s) and C(s+r−2, s−1) ≤ steps − m ≤ C(s+r−1, s−1) is optimal (Griewank &
/// Walther 2000, §3); this returns the smallest, which keeps the recomputed left part shortest.
inline std::int64_t revolve_split(std::int64_t steps, std::int64_t checkpoints) {
  const std::int64_t s = checkpoints;
  const std::int64_t r = revolve_repetitions(steps, s);
  return std::max<std::int64_t>({1, binomial(s + r - 2, s), steps - binomial(s + r - 1, s - 1)});
}

/// Nesting depth of the checkpoint regions revolve() records for (steps, checkpoints).
inline int revolve_depth(std::int64_t steps, std::int64_t checkpoints) {
  int depth = 0;
  while (steps > 1) {
    const std::int64_t m = revolve_split(steps, checkpoints);
    depth = std::max(depth, 1 + revolve_depth(m, checkpoints));
    steps -= m;
    --checkpoints;
  }
  return depth;
}

template <class Step, class T>
Var<T> call_step(const Step& step, std::int64_t index, Var<T> x) {
  if constexpr (std::is_invocable_v<const Step&, std::int64_t, Var<T>>)
    return step(index, std::move(x));
  else
    return step(std::move(x));
}

/// Records steps first … first + steps − 1 from x with the binomial structure: the first m steps in a
/// checkpoint region (recursively structured), the remaining ones at this level with one state fewer.
template <class Step, class T>
Var<T> revolve_record(const Step& step, Var<T> x, std::int64_t first, std::int64_t steps, std::int64_t checkpoints) {
  while (steps > 1) {
    const std::int64_t m = revolve_split(steps, checkpoints);
    x = checkpoint([&step, first, m, checkpoints](Var<T> v) {
      return revolve_record(step, std::move(v), first, m, checkpoints);
    })(x);
    first += m;
    steps -= m;
    --checkpoints;
  }
  return call_step(step, first, std::move(x));
}

}  // namespace detail

/// t(n, s) = r·n − C(s + r, s + 1), r the smallest integer with C(s + r, s) ≥ n: the least number of step
/// evaluations beyond the first forward sweep needed to reverse n steps with s stored states (Griewank &
/// Walther, ACM TOMS 26(1), 2000, Algorithm 799: Revolve). It is what revolve() spends: each of the first
/// n − 1 steps is re-evaluated once with its tape kept, plus the advances between stored states.
/// Throws domain_error unless steps ≥ 1 and checkpoints ≥ 1.
inline std::int64_t revolve_recomputations(std::int64_t steps, std::int64_t checkpoints) {
  if (steps < 1 || checkpoints < 1)
    throw domain_error("revolve_recomputations: need steps ≥ 1 and checkpoints ≥ 1, got " + std::to_string(steps) +
                       " and " + std::to_string(checkpoints));
  const std::int64_t r = detail::revolve_repetitions(steps, checkpoints);
  return r * steps - detail::binomial(checkpoints + r, checkpoints + 1);
}

/// Binomial checkpointing of x_{i+1} = step(x_i), i = 0 … steps − 1 (an RNN cell, an explicit ODE
/// integrator step): returns x_steps; a backward through it re-evaluates exactly
/// revolve_recomputations(steps, checkpoints) steps, the minimum for at most `checkpoints` stored states
/// (x_0 included), after Griewank & Walther, ACM TOMS 26(1), 2000, Algorithm 799 (Revolve).
///
/// `step` is a callable Var<T> → Var<T>, or (std::int64_t i, Var<T>) → Var<T> to receive the step index
/// (e.g. to pick the input of time step i). Every state has the shape of x0. Values the step captures from
/// outside (weights, inputs) are kept and receive gradients as usual.
///
/// How: the first m steps (m from the binomial formula, detail::revolve_split) go into a checkpoint region
/// that is itself structured recursively, the remaining steps are treated the same way at this level with
/// one stored state fewer, and the last step runs unrecorded in any region, so its tape is kept. Nested
/// regions replay innermost-last, which is the binomial schedule: the states stored at any time are the
/// region boundaries of the current replay path, at most `checkpoints`, plus the tape of the one step being
/// reversed. Gradients are bitwise those of the plain tape.
///
/// Throws domain_error unless steps ≥ 1 and checkpoints ≥ 1, or when the schedule would nest regions
/// deeper than the tape allows (about 60: only when checkpoints is 1 or 2 and steps in the thousands; use
/// more checkpoints). Side effects of `step` happen once per step, in the forward pass.
template <class Step, class T>
Var<T> revolve(const Step& step, Var<T> x0, std::int64_t steps, std::int64_t checkpoints) {
  if (steps < 1 || checkpoints < 1)
    throw domain_error("revolve: need steps ≥ 1 and checkpoints ≥ 1, got " + std::to_string(steps) + " and " +
                       std::to_string(checkpoints));
  x0.node("revolve");  // throws tape_error for an empty or stale handle
  const int open = x0.state()->open_depth();
  const int depth = detail::revolve_depth(steps, checkpoints);
  if (open + depth > detail::max_region_depth)
    throw domain_error("revolve: " + std::to_string(steps) + " steps with " + std::to_string(checkpoints) +
                       " checkpoints nest " + std::to_string(depth) + " checkpoint regions; the tape allows " +
                       std::to_string(detail::max_region_depth - open) + " here; use more checkpoints");
  return detail::revolve_record(step, std::move(x0), 0, steps, checkpoints);
}

}  // namespace remat
