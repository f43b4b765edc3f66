// revolve(): binomial checkpointing (Griewank & Walther, Algorithm 799) of a loop of identical steps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "remat/checkpoint.hpp"
#include "remat/errors.hpp"
#include "remat/schedule/chain_state.hpp"

namespace remat {
namespace detail {

// The binomial counts below can exceed 64 bits for huge step or checkpoint counts (C(s + r, s) for s near
// 2^62, say), so they are computed in 128 bits and saturated: every caller only compares them with a step
// count, or checks that its result fits.
__extension__ typedef unsigned __int128 Wide;
constexpr Wide wide_saturated = static_cast<Wide>(INT64_MAX) + 1;  // "more than any step count"

/// min(C(n, k), 2^63) for 0 ≤ k ≤ n < 2^63 (0 for k outside [0, n]).
inline Wide binomial_saturated(std::int64_t n, std::int64_t k) {
  if (k < 0 || n < 0 || k > n) return 0;
  k = std::min(k, n - k);
  Wide result = 1;
  // C(n−k+i, i) grows at least twofold per i here (n − k ≥ k), so at most 64 rounds before it saturates.
  for (std::int64_t i = 1; i <= k; ++i) {
    result = result * static_cast<Wide>(n - k + i) / static_cast<Wide>(i);  // < 2^63 · 2^63: no overflow
    if (result >= wide_saturated) return wide_saturated;
  }
  return result;
}

/// min(C(n, k), INT64_MAX): exact for the schedule's split points, and larger than any step count otherwise.
inline std::int64_t binomial(std::int64_t n, std::int64_t k) {
  return static_cast<std::int64_t>(std::min<Wide>(binomial_saturated(n, k), INT64_MAX));
}

/// r(n, s): the smallest r with C(s + r, s) ≥ n, the number of times the busiest step is evaluated. A
/// binary search over r ∈ [0, n − 1] (C(s + n − 1, s) ≥ n always), so huge n cost O(log n) evaluations.
inline std::int64_t revolve_repetitions(std::int64_t steps, std::int64_t checkpoints) {
  std::int64_t low = 0, high = std::max<std::int64_t>(steps - 1, 0);
  checkpoints = std::min(checkpoints, steps);  // more states than steps change nothing (r = 1 either way)
  while (low < high) {
    const std::int64_t r = low + (high - low) / 2;
    std::int64_t n;  // C(n, s) ≥ n > INT64_MAX ≥ steps when s + r overflows
    if (__builtin_add_overflow(checkpoints, r, &n) || binomial_saturated(n, checkpoints) >= static_cast<Wide>(steps))
      high = r;
    else
      low = r + 1;
  }
  return low;
}

/// The first checkpoint position of the binomial schedule for `steps` steps from a stored state with
/// `checkpoints` states storable (the stored one included): advance m steps, store the state, treat the
/// last steps − m steps with checkpoints − 1 states, then the first m with all of them. Any m with
/// C(s+r−2, s) ≤ m ≤ C(s+r−1, s) and C(s+r−2, s−1) ≤ steps − m ≤ C(s+r−1, s−1) is optimal (Griewank &
/// Walther 2000, §3); this returns the smallest, which keeps the recomputed left part shortest.
inline std::int64_t revolve_split(std::int64_t steps, std::int64_t checkpoints) {
  const std::int64_t s = std::min(checkpoints, steps);  // the same split: r = 1 for every s ≥ steps − 1
  const std::int64_t r = revolve_repetitions(steps, s);
  return std::max<std::int64_t>({1, binomial(s + r - 2, s), steps - binomial(s + r - 1, s - 1)});
}

/// Nesting depth of the checkpoint regions revolve() records for (steps, checkpoints) when it is at most
/// `limit`; otherwise some value above `limit` (the walk stops there, so it recurses at most limit + 1
/// deep: with one checkpoint the depth is steps − 1).
inline int revolve_depth(std::int64_t steps, std::int64_t checkpoints, int limit) {
  int depth = 0;
  while (steps > 1) {
    if (limit < 1) return limit + 1;  // another region at least: deeper than the limit
    const std::int64_t m = revolve_split(steps, checkpoints);
    depth = std::max(depth, 1 + revolve_depth(m, checkpoints, limit - 1));
    if (depth > limit) return depth;
    steps -= m;
    --checkpoints;
  }
  return depth;
}

/// Records steps first … first + steps − 1 from x with the binomial structure: the first m steps in a
/// checkpoint region (recursively structured), the remaining ones at this level with one state fewer.
template <class Step, class S>
S revolve_record(const Step& step, S x, std::int64_t first, std::int64_t steps, std::int64_t checkpoints) {
  while (steps > 1) {
    const std::int64_t m = revolve_split(steps, checkpoints);
    x = checkpoint_state(
        [&step, first, m, checkpoints](S v) { return revolve_record(step, std::move(v), first, m, checkpoints); },
        policies::nothing_saveable, std::move(x));
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
/// Throws domain_error unless steps ≥ 1 and checkpoints ≥ 1, or when the count exceeds 2^63 − 1.
inline std::int64_t revolve_recomputations(std::int64_t steps, std::int64_t checkpoints) {
  if (steps < 1 || checkpoints < 1)
    throw domain_error("revolve_recomputations: need steps ≥ 1 and checkpoints ≥ 1, got " + std::to_string(steps) +
                       " and " + std::to_string(checkpoints));
  if (checkpoints >= steps - 1) return steps - 1;  // r = 1 (or 0 for one step): each step but the last once
  const std::int64_t r = detail::revolve_repetitions(steps, checkpoints);
  // r·n − C(s + r, s + 1) in 128 bits: C(s + r, s + 1) ≤ r·n (each of its terms is one evaluation), so
  // only the result can exceed an int64.
  const detail::Wide evaluations = static_cast<detail::Wide>(r) * static_cast<detail::Wide>(steps),
                     overlap = detail::binomial_saturated(checkpoints + r, checkpoints + 1);
  if (overlap >= detail::wide_saturated || evaluations - overlap > static_cast<detail::Wide>(INT64_MAX))
    throw domain_error("revolve_recomputations: " + std::to_string(steps) + " steps with " +
                       std::to_string(checkpoints) + " checkpoints take more than 2^63 − 1 recomputations");
  return static_cast<std::int64_t>(evaluations - overlap);
}

/// Binomial checkpointing of x_{i+1} = step(x_i), i = 0 … steps − 1 (an RNN cell, an explicit ODE
/// integrator step): returns x_steps; a backward through it re-evaluates exactly
/// revolve_recomputations(steps, checkpoints) steps, the minimum for at most `checkpoints` stored states
/// (x_0 included), after Griewank & Walther, ACM TOMS 26(1), 2000, Algorithm 799 (Revolve).
///
/// `step` is a callable S → S, or (std::int64_t i, S) → S to receive the step index (e.g. to pick the input
/// of time step i). The state S is a Var<T>, or a std::tuple of Var<T> for a multi-value state (an LSTM's
/// (h, c)), which `step` may also take unpacked: (i, h, c) → std::tuple(h, c). Every state has the shapes of x0. Values
/// the step captures from outside (weights, inputs) are kept and receive gradients as usual.
///
/// How: the first m steps (m from the binomial formula, detail::revolve_split) go into a checkpoint region
/// that is itself structured recursively, the remaining steps are treated the same way at this level with
/// one stored state fewer, and the last step runs unrecorded in any region, so its tape is kept. Nested
/// regions replay innermost-last, which is the binomial schedule: the states stored at any time are the
/// region boundaries of the current replay path, at most `checkpoints`, plus the tape of the one step being
/// reversed. Gradients are bitwise those of the plain tape.
///
/// Throws domain_error unless steps ≥ 1 and checkpoints ≥ 1, or when the schedule would nest regions
/// deeper than the tape allows (62 levels: from 64 steps with 1 checkpoint, 2 017 with 2, 43 681 with 3,
/// fewer inside open regions; use more checkpoints). Side effects of `step` happen once per step, in the forward pass.
template <class Step, class S>
S revolve(const Step& step, S x0, std::int64_t steps, std::int64_t checkpoints) {
  detail::check_chain_state<S>();
  if (steps < 1 || checkpoints < 1)
    throw domain_error("revolve: need steps ≥ 1 and checkpoints ≥ 1, got " + std::to_string(steps) + " and " +
                       std::to_string(checkpoints));
  const int open = detail::chain_tape(x0, "revolve")->open_depth();  // tape_error for an empty or stale handle
  const int allowed = detail::max_region_depth - open;
  if (detail::revolve_depth(steps, std::min(checkpoints, steps), allowed) > allowed)
    throw domain_error("revolve: " + std::to_string(steps) + " steps with " + std::to_string(checkpoints) +
                       " checkpoints nest more checkpoint regions than the " + std::to_string(allowed) +
                       " the tape allows here; use more checkpoints");
  // More states than steps change nothing (revolve_split), and fewer keep the counts small.
  return detail::revolve_record(step, std::move(x0), 0, steps, std::min(checkpoints, steps));
}

}  // namespace remat
