// What remat knows of the BLAS behind Eigen's products: OpenBLAS's thread functions (remat/threads.hpp uses
// them) and which of its kernel sets it runs, so that a program can tell its user when OpenBLAS fell back to
// generic kernels on a CPU it does not recognise (docs/design.md §6, "OpenBLAS's kernels").
#pragma once

#include <cstdlib>
#include <cstring>
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
char* openblas_get_config(void) __attribute__((weak));
}

namespace remat {
namespace detail {

/// The instruction sets that decide which OpenBLAS kernels a CPU can run.
struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA3: OpenBLAS's Haswell kernels
  bool avx512 = false;       // AVX-512 F, BW, DQ and VL: its SkylakeX kernels
  bool avx512_bf16 = false;  // and AVX-512 BF16: its Cooperlake kernels
};

/// This CPU's features, read with CPUID by the compiler's __builtin_cpu_supports (all false off x86-64 or
/// without GCC or Clang, where no OpenBLAS x86 kernels apply).
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

/// The OPENBLAS_CORETYPE to run instead of the kernel set `corename` on a CPU with `cpu`, or "" when
/// `corename` is not the fallback, OpenBLAS is not a DYNAMIC_ARCH build (`dynamic_arch` false) or the user
/// set OPENBLAS_CORETYPE (`user_setting`, its value or null). OpenBLAS's DYNAMIC_ARCH build picks its kernels by the
/// CPU's vendor, family and model (OpenBLAS, driver/others/dynamic.c, get_coretype); for a model it does not know it
/// falls back to "Prescott" (SSE3). Debian 12's 0.3.21 does so on Intel Xeon family 6 model 207, where the W0–W2 steps
/// take 2–5 × as long as with its AVX-512 kernels (bench/probes/README.md). The suggestion is the newest kernel set the
/// CPU's instructions allow.
inline std::string_view suggested_openblas_coretype(std::string_view corename, const CpuFeatures& cpu,
                                                    bool dynamic_arch = true, const char* user_setting = nullptr) {
  if (user_setting != nullptr && *user_setting != '\0') return {};  // the user chose
  if (!dynamic_arch || corename != "Prescott") return {};           // the variable would do nothing
  if (cpu.avx512_bf16) return "Cooperlake";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return {};
}

/// Whether the program's OpenBLAS chooses its kernels at run time (a DYNAMIC_ARCH build): only then does
/// OPENBLAS_CORETYPE change them.
inline bool openblas_dynamic_arch() {
  if (openblas_get_config == nullptr) return false;
  const char* config = openblas_get_config();
  return config != nullptr && std::strstr(config, "DYNAMIC_ARCH") != nullptr;
}

}  // namespace detail

/// OpenBLAS's name for the kernel set it runs in this program ("Haswell", "SkylakeX", "Zen", "Prescott",
/// ...: the values OPENBLAS_CORETYPE takes), from openblas_get_corename(); "" when the program is not linked
/// with the shared libopenblas. Throws std::bad_alloc.
inline std::string openblas_corename() {
  if (openblas_get_corename == nullptr) return {};
  const char* name = openblas_get_corename();
  return name ? std::string(name) : std::string();
}

/// When OpenBLAS (a DYNAMIC_ARCH build) runs its generic Prescott fallback on a CPU with AVX2 or AVX-512
/// because it did not recognise the CPU, and OPENBLAS_CORETYPE is not set, the value of OPENBLAS_CORETYPE
/// that selects the fast kernels ("Haswell", "SkylakeX" or "Cooperlake"); otherwise "". OpenBLAS reads the
/// variable when it loads, so it must be set before the program starts (scripts/openblas-coretype.sh does it
/// for the examples' scripts and the benchmarks, with the same choice). The W0–W2 steps run 2–5 × faster
/// with it on such a CPU (bench/probes/README.md). Throws std::bad_alloc.
inline std::string suggested_openblas_coretype() {
  return std::string(detail::suggested_openblas_coretype(
      openblas_corename(), detail::cpu_features(), detail::openblas_dynamic_arch(), std::getenv("OPENBLAS_CORETYPE")));
}

}  // namespace remat
