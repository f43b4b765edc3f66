// remat::openblas_corename and the OPENBLAS_CORETYPE suggested when OpenBLAS does not recognise the CPU,
// against the kernel's view of the CPU (/proc/cpuinfo) and against scripts/openblas-coretype.sh.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <remat/blas.hpp>

namespace blas_test {

using remat::detail::CpuFeatures;
using remat::detail::suggested_openblas_coretype;

/// The first "flags" line of /proc/cpuinfo, padded with spaces; "" where there is none.
std::string cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return " " + line.substr(line.find(':') + 1) + " ";
  return {};
}
bool has(const std::string& flags, const char* flag) {
  return flags.find(" " + std::string(flag) + " ") != std::string::npos;
}

/// Output of a shell command, without its last newline.
std::string shell(const std::string& command) {
  std::string out;
  if (FILE* p = popen(command.c_str(), "r")) {
    char buffer[256];
    while (std::fgets(buffer, sizeof buffer, p)) out += buffer;
    pclose(p);
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

/// Restores OPENBLAS_CORETYPE as it was when the test started.
class CoretypeVariable : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* v = std::getenv("OPENBLAS_CORETYPE");
    was_set_ = v != nullptr;
    if (v) was_ = v;
  }
  void TearDown() override {
    if (was_set_)
      setenv("OPENBLAS_CORETYPE", was_.c_str(), 1);
    else
      unsetenv("OPENBLAS_CORETYPE");
  }
  bool was_set_ = false;
  std::string was_;
};

TEST(BlasKernels, NameTheKernelsOpenBlasRuns) {
  if (openblas_get_corename == nullptr) GTEST_SKIP() << "this build does not link OpenBLAS (REMAT_USE_BLAS=OFF)";
  EXPECT_FALSE(remat::openblas_corename().empty());
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

TEST(BlasKernels, SuggestNothingWhereTheVariableWouldNotHelp) {
  const CpuFeatures bf16{true, true, true};
  ASSERT_EQ(suggested_openblas_coretype("Prescott", bf16, true, nullptr), "Cooperlake");  // the case that flips
  EXPECT_EQ(suggested_openblas_coretype("Prescott", bf16, true, ""), "Cooperlake");       // set but empty: unset
  EXPECT_EQ(suggested_openblas_coretype("Prescott", bf16, true, "Prescott"), "");         // the user chose
  EXPECT_EQ(suggested_openblas_coretype("Prescott", bf16, false, nullptr), "");           // no DYNAMIC_ARCH
}

TEST(BlasKernels, CpuFeaturesAgreeWithTheKernelsView) {
  const std::string flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo (not x86 Linux)";
  const CpuFeatures f = remat::detail::cpu_features();
  EXPECT_EQ(f.avx2_fma, has(flags, "avx2") && has(flags, "fma")) << flags;
  const bool avx512 =
      has(flags, "avx512f") && has(flags, "avx512bw") && has(flags, "avx512dq") && has(flags, "avx512vl");
  EXPECT_EQ(f.avx512, avx512) << flags;
  EXPECT_EQ(f.avx512_bf16, avx512 && has(flags, "avx512_bf16")) << flags;
}

TEST_F(CoretypeVariable, TheScriptChoosesWhatTheLibrarySuggests) {
  if (openblas_get_corename == nullptr) GTEST_SKIP() << "this build does not link OpenBLAS (REMAT_USE_BLAS=OFF)";
  if (was_set_) GTEST_SKIP() << "OPENBLAS_CORETYPE is set, so this process does not run OpenBLAS's own choice";
  const std::string script = std::string(REMAT_SOURCE_DIR) + "/scripts/openblas-coretype.sh";
  const std::string chosen = shell("bash -c 'set -euo pipefail; source \"" + script + "\"; openblas_coretype_choice'");
  EXPECT_EQ(chosen, remat::suggested_openblas_coretype()) << "OpenBLAS runs " << remat::openblas_corename();
}

TEST_F(CoretypeVariable, TheUsersSettingIsNeverSecondGuessed) {
  setenv("OPENBLAS_CORETYPE", "Prescott", 1);  // what bench/probes/run_kernels.sh asks for on purpose
  EXPECT_EQ(remat::suggested_openblas_coretype(), "");
  const std::string script = std::string(REMAT_SOURCE_DIR) + "/scripts/openblas-coretype.sh";
  EXPECT_EQ(shell("bash -c 'set -euo pipefail; source \"" + script +
                  "\"; openblas_coretype_apply 2>/dev/null; echo \"$OPENBLAS_CORETYPE\"'"),
            "Prescott");
}

}  // namespace blas_test
