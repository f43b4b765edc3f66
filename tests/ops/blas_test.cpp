// remat::blas_kernels and the OPENBLAS_CORETYPE suggested when OpenBLAS does not recognise the CPU.
#include <gtest/gtest.h>

#include <string>

#include <remat/blas.hpp>

namespace blas_test {

using remat::detail::CpuFeatures;
using remat::detail::suggested_openblas_coretype;

TEST(BlasKernels, NameTheKernelsOpenBlasRuns) {
  // The tests link the shared libopenblas (remat::blas): the weak declaration must resolve.
  ASSERT_NE(openblas_get_corename, nullptr);
  const std::string kernels = remat::blas_kernels();
  EXPECT_FALSE(kernels.empty());
}

TEST(BlasKernels, SuggestTheNewestKernelsTheCpuRunsOnlyForTheFallback) {
  const CpuFeatures none{}, avx2{true, false, false}, avx512{true, true, false}, bf16{true, true, true};
  EXPECT_EQ(suggested_openblas_coretype("Prescott", bf16), "Cooperlake");
  EXPECT_EQ(suggested_openblas_coretype("Prescott", avx512), "SkylakeX");
  EXPECT_EQ(suggested_openblas_coretype("Prescott", avx2), "Haswell");
  EXPECT_EQ(suggested_openblas_coretype("Prescott", none), "");  // an SSE3 CPU: Prescott is its best
  // Kernels OpenBLAS chose for a CPU it recognised are never second-guessed.
  for (const char* kernels : {"Haswell", "SkylakeX", "Cooperlake", "Zen", ""})
    EXPECT_EQ(suggested_openblas_coretype(kernels, bf16), "") << kernels;
}

TEST(BlasKernels, SuggestForThisMachineOnlyWhenOpenBlasFellBack) {
  const std::string kernels = remat::blas_kernels();
  if (kernels == "Prescott" && remat::detail::cpu_features().avx2_fma)
    EXPECT_NE(remat::suggested_openblas_coretype(), "");
  else
    EXPECT_EQ(remat::suggested_openblas_coretype(), "") << kernels;
}

}  // namespace blas_test
