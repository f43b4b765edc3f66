// What remat knows of the BLAS behind Eigen's products: OpenBLAS's thread functions (remat/threads.hpp uses
// them) and which of its kernels it runs, so that a program can tell its user when OpenBLAS fell back to
// generic kernels on a CPU it does not recognise (docs/design.md §6, "OpenBLAS's kernels").
#pragma once

#include <string>
#include <string_view>

// OpenBLAS's own functions, declared weak: remat is header-only and does not link OpenBLAS. In a program
// linked with the shared libopenblas (remat::blas, or -lopenblas) these resolve to OpenBLAS's functions;
// otherwise they are null and remat leaves BLAS alone. (A static libopenblas.a contributes them only if
// something else pulls in their object file: call openblas_set_num_threads yourself then.)
extern "C" {
void openblas_set_num_threads(int num_threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
int openblas_get_parallel(void) __attribute__((weak));  // 0 sequential, 1 pthreads, 2 OpenMP build
char* openblas_get_corename(void) __attribute__((weak));
}

namespace remat {
namespace detail {

/// The instruction sets that decide which OpenBLAS kernels a CPU can run.
struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA3: OpenBLAS's Haswell kernels
  bool avx512 = false;       // AVX-512 F, BW, DQ and VL: its SkylakeX kernels
  bool avx512_bf16 = false;  // and AVX-512 BF16: its Cooperlake kernels
};

inline CpuFeatures cpu_features() {
  CpuFeatures f;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

/// The OPENBLAS_CORETYPE to run instead of `kernels` on a CPU with `cpu`, or "" when `kernels` are not the
/// fallback. OpenBLAS's DYNAMIC_ARCH build picks its kernels by the CPU's model number; for a model it does
/// not know (0.3.21, Debian 12's, on Intel Xeon family 6 model 207, 2026) it falls back to "Prescott"
/// (SSE3), with which the W0–W2 steps took 2–5 × as long as with its AVX-512 kernels on the same CPU
/// (bench/RESULTS.md §9). The suggestion is the newest kernel set the CPU's instructions allow.
inline std::string_view suggested_openblas_coretype(std::string_view kernels, const CpuFeatures& cpu) {
  if (kernels != "Prescott") return {};
  if (cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return {};
}

}  // namespace detail

/// The name of the kernel set OpenBLAS runs in this program ("Haswell", "SkylakeX", "Zen", ...; what
/// OPENBLAS_CORETYPE sets), or "" when the program is not linked with the shared libopenblas.
inline std::string blas_kernels() {
  if (openblas_get_corename == nullptr) return {};
  const char* name = openblas_get_corename();
  return name ? std::string(name) : std::string();
}

/// When OpenBLAS runs its generic fallback kernels on a CPU with AVX2 or AVX-512 (it did not recognise the
/// CPU), the OPENBLAS_CORETYPE value that selects the fast ones ("Haswell", "SkylakeX" or "Cooperlake");
/// otherwise "". The variable is read when libopenblas loads, so it must be set before the program starts
/// (scripts/train.sh does). The W0–W2 steps ran 2–5 × faster with it on such a machine (bench/RESULTS.md §9).
inline std::string suggested_openblas_coretype() {
  return std::string(detail::suggested_openblas_coretype(blas_kernels(), detail::cpu_features()));
}

}  // namespace remat
