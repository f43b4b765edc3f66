// What a benchmark's output says about the machine it ran on (Google Benchmark's custom context): which
// BLAS really computes the products, and the environment variables that change its speed (bench/README.md,
// Environment: a machine-specific OPENBLAS_CORETYPE can halve OpenBLAS's GEMM). Shared by step_benchmark and distributed_step.
#pragma once

#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#ifdef EIGEN_USE_BLAS
extern "C" char* openblas_get_config();
extern "C" char* openblas_get_corename();
#endif

namespace bench {

/// The shared library that provides `symbol` in this process (which BLAS really runs).
inline std::string library_of(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info;
  if (!address || !dladdr(address, &info) || !info.dli_fname) return "not found";
  return info.dli_fname;
}

inline std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "(unset)";
}

/// Adds "sgemm_ from", "openblas" and the speed-relevant environment variables to the benchmark context.
inline void add_blas_context() {
  benchmark::AddCustomContext("sgemm_ from", library_of("sgemm_"));
#ifdef EIGEN_USE_BLAS
  benchmark::AddCustomContext("openblas", std::string(openblas_get_config()) + " core " + openblas_get_corename());
#else
  benchmark::AddCustomContext("openblas", "not used (Eigen's own GEMM)");
#endif
  for (const char* name : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "GLIBC_TUNABLES", "OMP_WAIT_POLICY"})
    benchmark::AddCustomContext(name, environment(name));
}

}  // namespace bench
