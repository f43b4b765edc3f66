// remat::set_flush_denormal: flush-to-zero for subnormal floats on the calling thread and remat's thread
// team, as torch.set_flush_denormal does for PyTorch.
#pragma once

#include <algorithm>

#include "remat/threads.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define REMAT_HAVE_MXCSR 1
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

namespace remat::detail {

#ifdef REMAT_HAVE_MXCSR
/// MXCSR's flush-to-zero (results) and denormals-are-zero (inputs) bits (Intel SDM vol. 1, §10.2.3).
inline constexpr unsigned mxcsr_flush_to_zero = 1u << 15;
inline constexpr unsigned mxcsr_denormals_are_zero = 1u << 6;
#endif

/// Whether this CPU has both bits: every CPU with SSE3 has DAZ (PyTorch's test too); setting DAZ where it is
/// missing would fault.
inline bool cpu_can_flush_denormal() {
#ifdef REMAT_HAVE_MXCSR
  return __builtin_cpu_supports("sse3");
#else
  return false;
#endif
}

/// Sets or clears both bits on the calling thread only.
inline void set_flush_denormal_on_this_thread(bool on) {
#ifdef REMAT_HAVE_MXCSR
  constexpr unsigned bits = mxcsr_flush_to_zero | mxcsr_denormals_are_zero;
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | bits) : (csr & ~bits));
#else
  (void)on;
#endif
}

/// Whether the calling thread flushes subnormal inputs and results to zero (both bits set).
inline bool flushes_denormal_on_this_thread() {
#ifdef REMAT_HAVE_MXCSR
  constexpr unsigned bits = mxcsr_flush_to_zero | mxcsr_denormals_are_zero;
  return (_mm_getcsr() & bits) == bits;
#else
  return false;
#endif
}

}  // namespace remat::detail

namespace remat {

/// Makes float and double arithmetic treat subnormal numbers (|x| < 1.18e-38 for float, 2.2e-308 for
/// double) as zero, inputs and results, when `on`; restores IEEE gradual underflow when not. Returns
/// whether the CPU supports the mode (x86 with SSE3: the MXCSR FTZ and DAZ bits); elsewhere it changes
/// nothing and returns false. The default, as in PyTorch and C++, is off.
///
/// Why: an x86 core takes a microcode assist (of the order of 100 cycles) for a vector operation that reads
/// or makes a subnormal. Adam's first moment of a weight whose gradient is 0 step after step following a
/// non-zero one (the weights of pixels black in almost every Fashion-MNIST image, of ReLU units that rarely
/// fire) decays by β₁ = 0.9 a step, from 1e-3 into the subnormal range in about 770 steps and on to zero in
/// about 150 more: unflushed, each epoch of the MLP example is slower than the one before, the fourth 1.31–1.36×
/// as long as the first at 1 thread (bench/probes/README.md). Flushing changes only
/// values below the smallest normal number, to zero; it is not IEEE arithmetic, so a gradcheck or a test of tiny values
/// may want it off.
///
/// The mode belongs to each thread. This sets it on the calling thread and on each thread of an OpenMP team
/// as large as the largest of num_threads(), every earlier set_num_threads(n), omp_get_max_threads() and
/// omp_get_num_procs() — every team remat's kernels made, and the OpenMP build of OpenBLAS's, which share
/// libgomp's pool — and threads the calling thread creates afterwards inherit it (POSIX pthread_create).
/// Threads that exist already outside that team (a pthreads build of OpenBLAS, your own thread pools, a
/// larger OpenMP team of your own made earlier) keep their mode. Call it outside any OpenMP parallel region
/// (inside one it sets the calling thread only).
inline bool set_flush_denormal(bool on) {
  if (!detail::cpu_can_flush_denormal()) return false;
  detail::set_flush_denormal_on_this_thread(on);
#ifdef _OPENMP
  if (!omp_in_parallel()) {
    const int team = std::max({num_threads(), detail::largest_thread_setting.load(std::memory_order_relaxed),
                               omp_get_max_threads(), omp_get_num_procs()});
#pragma omp parallel num_threads(team)
    detail::set_flush_denormal_on_this_thread(on);
  }
#endif
  return true;
}

}  // namespace remat
