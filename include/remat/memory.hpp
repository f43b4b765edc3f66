// Memory statistics of a tape (the pooling allocator behind them is detail/buffers.hpp).
#pragma once

#include <cstddef>

namespace remat {

/// Exact byte counts of tape-owned tensor buffers (rows * cols * sizeof(T) each; pool rounding and
/// bookkeeping are not included). Parameters referenced with Tape::variable(Parameter&) are not
/// tape-owned and are not counted.
struct MemoryStats {
  std::size_t live_bytes = 0;      ///< buffers allocated now: values, op residual extras, gradients
  std::size_t peak_bytes = 0;      ///< maximum of live_bytes since the tape was created or cleared
  std::size_t saved_bytes = 0;     ///< buffers held now because a pending backward (or replay) needs them
  std::size_t replayed_bytes = 0;  ///< bytes recomputed by checkpoint replay in the last backward
  std::size_t replayed_ops = 0;    ///< ops re-executed by checkpoint replay in the last backward
  std::size_t cached_bytes = 0;    ///< bytes kept in the pool's free lists for reuse
};

}  // namespace remat
