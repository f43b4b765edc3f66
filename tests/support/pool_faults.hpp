// Fault injection through the pool's test hook remat::detail::allocation_hook (as
// tests/alloc/exception_safety_test.cpp does): counts the system allocations of tensor buffers (pool misses) and
// makes the `fail_at`-th throw std::bad_alloc, to check that an op leaves the tape as it was whichever allocation
// fails.
#pragma once

#include <cstddef>
#include <new>

#include "remat/remat.hpp"

namespace remat_test::pool_faults {

inline long misses = 0;    ///< pool misses since the Scope began
inline long fail_at = -1;  ///< the miss that throws (1 for the first; -1: none, only counting)

inline void hook(std::size_t) {
  ++misses;
  if (misses == fail_at) throw std::bad_alloc();
}

/// Counts the pool misses while it lives, failing the `fail`-th (-1: none).
struct Scope {
  explicit Scope(long fail) {
    misses = 0;
    fail_at = fail;
    remat::detail::allocation_hook = &hook;
  }
  ~Scope() { remat::detail::allocation_hook = nullptr; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

}  // namespace remat_test::pool_faults
