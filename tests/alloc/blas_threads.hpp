// The allocation tests run OpenBLAS on one thread: OpenBLAS's threaded GEMM (level3_thread.c, built with
// USE_ALLOC_HEAP as Debian's libopenblas is) mallocs a job array of MAX_CPU_NUMBER entries (512 KB here)
// on every product it splits across threads, and exits the process if that malloc fails. That is
// OpenBLAS's, documented in docs/design.md §2.5; the tests check remat's own allocations.
//
// CTest also sets OPENBLAS_NUM_THREADS=1 (tests/CMakeLists.txt), so that OpenBLAS starts no worker
// threads at all when it loads: the counters count every thread, and under AddressSanitizer a thread's
// start-up allocates at a moment of its own (rarely, inside a measured step of a test run by hand).
#pragma once

#ifdef EIGEN_USE_BLAS
extern "C" void openblas_set_num_threads(int num_threads);  // OpenBLAS's API (cblas.h is not on the path)

namespace remat_alloc_test {
inline const bool blas_single_threaded = (openblas_set_num_threads(1), true);
}  // namespace remat_alloc_test
#endif
