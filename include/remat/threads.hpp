// remat::set_num_threads / remat::num_threads: the one thread setting, for remat's op kernels (an OpenMP
// team, docs/design.md §6) and OpenBLAS's matrix products together.
#pragma once

#include <algorithm>
#include <atomic>
#include <string>

#include "remat/blas.hpp"  // OpenBLAS's thread functions (weak)
#include "remat/errors.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace remat {
namespace detail {

/// The value set by set_num_threads, 0 until it is called.
inline std::atomic<int> thread_setting{0};
/// The largest value set_num_threads was given (0: never called): the largest team remat's kernels made, so
/// that set_flush_denormal reaches every thread of libgomp's pool that they used.
inline std::atomic<int> largest_thread_setting{0};

/// Whether the program has OpenBLAS's thread functions (linked with OpenBLAS).
inline bool have_openblas_threads() {
  return openblas_set_num_threads != nullptr && openblas_get_num_threads != nullptr;
}
/// Whether the program's OpenBLAS is its OpenMP build: its products then run on the same libgomp team as
/// remat's kernels, and on the calling thread alone inside a parallel region (OpenBLAS checks
/// omp_in_parallel()).
inline bool openblas_uses_openmp() {
  return openblas_get_parallel != nullptr && openblas_get_parallel() == 2;
}

}  // namespace detail

/// The most threads set_num_threads accepts: 1024, or OpenMP's thread limit (OMP_THREAD_LIMIT) if lower.
inline int thread_limit() {
  int limit = 1024;
#ifdef _OPENMP
  limit = std::min(limit, omp_get_thread_limit());
#endif
  return limit;
}

/// The number of threads remat's op kernels use: the last set_num_threads(n), or by default
/// omp_get_max_threads() (the machine's cores, or OMP_NUM_THREADS when it is set) capped at thread_limit(),
/// in a build with OpenMP (REMAT_USE_OPENMP, compiled with -fopenmp); 1 without (every kernel then runs on
/// the calling thread). So set_num_threads(num_threads()) always succeeds.
inline int num_threads() {
  const int n = detail::thread_setting.load(std::memory_order_relaxed);
  if (n > 0) return n;
#ifdef _OPENMP
  return std::min(omp_get_max_threads(), thread_limit());
#else
  return 1;
#endif
}

/// Sets the threads of remat's op kernels and of OpenBLAS's matrix products to n (≥ 1) together: the
/// kernels' OpenMP team has n threads, and openblas_set_num_threads(n) is called when the program is linked
/// with OpenBLAS. The two never work at the same time: a kernel's team runs between products, and the
/// products a kernel makes inside its team (the attention ops') run with OpenBLAS on one thread, so at most
/// n threads compute at any moment. Results are bitwise identical for every n in remat's kernels
/// (docs/design.md §6); OpenBLAS's multi-threaded products may round differently from its one-thread
/// products. Without set_num_threads, remat's team has num_threads() threads (see there) and OpenBLAS its own
/// default (OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, at most the cores): OMP_NUM_THREADS=n pins both.
/// remat itself does not change the user's OpenMP setting (omp_set_num_threads), but OpenBLAS's OpenMP build
/// (the one remat's CMake prefers with REMAT_USE_OPENMP) does: its openblas_set_num_threads(n) also calls
/// omp_set_num_threads(n). Throws remat::domain_error, changing nothing, for n < 1 and n > thread_limit()
/// (a team of 2^30 threads would not be refused by OpenMP until the next kernel, which dies allocating it).
inline void set_num_threads(int n) {
  if (n < 1 || n > thread_limit())
    throw domain_error("set_num_threads: n must be in [1, " + std::to_string(thread_limit()) + "], got " +
                       std::to_string(n));
  detail::thread_setting.store(n, std::memory_order_relaxed);
  int largest = detail::largest_thread_setting.load(std::memory_order_relaxed);
  while (n > largest && !detail::largest_thread_setting.compare_exchange_weak(largest, n)) {
  }
  if (detail::have_openblas_threads()) openblas_set_num_threads(n);
}

}  // namespace remat
