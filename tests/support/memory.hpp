// Helpers for exact-byte memory tests: write the expected count analytically with bytes<T>(rows, cols)
// and compare it with Tape::memory(); describe() prints every field on failure.
#pragma once

#include <cstddef>
#include <sstream>
#include <string>

#include "remat/matrix.hpp"
#include "remat/memory.hpp"

namespace remat_test {

/// Bytes of one tape-owned buffer of rows × cols elements of T (the unit tape.memory() counts in).
template <class T>
constexpr std::size_t bytes(remat::Index rows, remat::Index cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * sizeof(T);
}

/// "live=… peak=… saved=… replayed=… (… ops) cached=… evictions=… rematerialized=… (… ops)", for failure
/// messages.
inline std::string describe(const remat::MemoryStats& m) {
  std::ostringstream s;
  s << "live=" << m.live_bytes << " peak=" << m.peak_bytes << " saved=" << m.saved_bytes
    << " replayed=" << m.replayed_bytes << " (" << m.replayed_ops << " ops) cached=" << m.cached_bytes
    << " evictions=" << m.evictions << " rematerialized=" << m.rematerialized_bytes << " (" << m.rematerialized_ops
    << " ops)";
  return s.str();
}

}  // namespace remat_test
