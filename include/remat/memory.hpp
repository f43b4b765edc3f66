// Memory statistics of a tape (the pooling allocator behind them is detail/buffers.hpp).
#pragma once

#include <cstddef>

namespace remat {

/// Exact byte counts of tape-owned tensor buffers (rows * cols * sizeof(T) each; pool rounding and
/// bookkeeping are not included). Parameters referenced with Tape::variable(Parameter&) are not
/// tape-owned and are not counted. A Parameter's gradient is the tape's, and counted, from its first
/// contribution until the backward of the last op that adds to it (its earliest reader that receives a
/// gradient); then it goes to the Parameter (Parameter::grad(), PyTorch's AccumulateGrad) and is no longer
/// counted, wherever the Parameter was recorded (docs/design.md §2.4).
struct MemoryStats {
  std::size_t live_bytes = 0;      ///< buffers allocated now: values, op residual extras, gradients
  std::size_t peak_bytes = 0;      ///< maximum of live_bytes since the tape was created or cleared
  std::size_t saved_bytes = 0;     ///< buffers held now because a pending backward (or replay) needs them
  std::size_t replayed_bytes = 0;  ///< bytes recomputed by checkpoint replay in the last backward
  std::size_t replayed_ops = 0;    ///< ops re-executed by checkpoint replay in the last backward
  double replayed_flops = 0;       ///< their FLOPs (the ops' estimates, OpInfo::flops)
  std::size_t cached_bytes = 0;    ///< bytes kept in the pool's free lists for reuse
  // Under a memory budget (Tape::set_memory_budget), since the tape was created or cleared (forward and
  // backward passes together; 0 without a budget):
  std::size_t evictions = 0;             ///< value buffers evicted to stay within the budget
  std::size_t rematerialized_ops = 0;    ///< ops re-run to regenerate evicted values (not checkpoint replays)
  std::size_t rematerialized_bytes = 0;  ///< output and extra bytes those re-runs wrote
  double rematerialized_flops = 0;       ///< their FLOPs (the ops' estimates, OpInfo::flops)
};

/// How a tape under a memory budget picks the value to evict (Kirisame et al., "Dynamic Tensor
/// Rematerialization", ICLR 2021, §4). Each scores a resident value t as cost / (bytes(t) · staleness(t)) and
/// evicts the lowest score; staleness is the tape's logical clock (one tick per value read or written) since
/// t was last accessed, never wall time, so every choice is deterministic and a backward's dry run makes the
/// same choices as its real pass. An op's cost is its FLOP estimate (OpInfo::flops), rounded up, plus 2^16
/// FLOPs for running an op at all (a kernel call and the tape's bookkeeping take a fixed time; the paper's
/// costs are measured times, which include it). Ties go to the lowest node id.
enum class EvictionHeuristic {
  /// h_DTR: cost = t's cost + the costs of its evicted neighbourhood e*(t): the absent inputs t's eviction
  /// makes evicted (and theirs), and the evicted values connected to t or to those through evicted values
  /// (what t's regeneration needs, and what needs t), each once. Exact: the connected components are kept as
  /// classes that merge on eviction and are rebuilt after a value leaves them. The rebuild walks the class:
  /// on a long chain under a budget of a few values, where every read regenerates a long run of evicted
  /// values, its time grows about as the cube of the chain's length, an order of magnitude beyond dtr_eq's at
  /// a few thousand ops; prefer dtr_eq there.
  dtr,
  /// h_DTR^eq (the default): the same, with the components approximated by union-find classes of adjacent
  /// evicted values that merge on eviction and never split (a regenerated member takes its cost out).
  dtr_eq,
  /// h_local: cost = t's own cost, ignoring what else its regeneration would need.
  local,
};

}  // namespace remat
