// remat::set_flush_denormal: subnormal floats become zero on the calling thread, on every thread of the teams
// remat's kernels use (including threads made after the call), and in an op whose blocks go to that team;
// off again, the same op keeps them bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "remat/remat.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace flush_denormal_test {

using remat::Index;
using remat::Matrix;

/// Puts the thread setting and IEEE gradual underflow back after a test (both are process-wide).
struct RestoreModes {
  int threads = remat::num_threads();
  ~RestoreModes() {
    remat::set_flush_denormal(false);
    remat::set_num_threads(threads);
  }
};

/// 1e-39f: a float subnormal (below 1.18e-38) whose double, 2e-39f, is exact and still subnormal.
constexpr float subnormal = 1e-39f;

/// x + x on the calling thread, through volatile so that the compiler cannot fold it.
float doubled_here(float x) {
  volatile float a = x;
  return a + a;
}

/// Whether each thread of an OpenMP team of n threads flushes (one entry per thread).
std::vector<bool> team_flushes(int n) {
  std::vector<bool> flushes(static_cast<std::size_t>(n), false);
#ifdef _OPENMP
#pragma omp parallel num_threads(n)
  flushes[static_cast<std::size_t>(omp_get_thread_num())] = remat::detail::flushes_denormal_on_this_thread();
#else
  flushes[0] = remat::detail::flushes_denormal_on_this_thread();
#endif
  return flushes;
}

/// add(x, x) of a [800,45] tensor of subnormals at `threads` threads: 36000 elements, above the parallel grain.
Matrix<float> doubled_on_team(int threads) {
  remat::set_num_threads(threads);
  remat::Tape<float> tape;
  const remat::Var<float> x = tape.constant(Matrix<float>::Constant(800, 45, subnormal));
  return remat::add(x, x).value();
}

bool all_equal(const Matrix<float>& m, float expected) {
  return (m.array() == expected).all();
}

#if defined(__x86_64__) || defined(__i386__)
TEST(SetFlushDenormal, IsSupportedOnX86WithSse3) {
  const RestoreModes restore;
  EXPECT_EQ(remat::set_flush_denormal(true), static_cast<bool>(__builtin_cpu_supports("sse3")));
}
#endif

TEST(SetFlushDenormal, FlushesOnTheCallingThreadAndEveryTeamThreadAndOffRestoresGradualUnderflow) {
  const RestoreModes restore;
  // A team of 3 ran before the call and the setting is 2 now. (libgomp ends a pool's threads beyond a smaller
  // team's; a runtime that keeps them is why set_flush_denormal covers every earlier set_num_threads value.)
  remat::set_num_threads(3);
  for (bool flushes : team_flushes(3)) ASSERT_FALSE(flushes);
  remat::set_num_threads(2);
  ASSERT_FALSE(remat::detail::flushes_denormal_on_this_thread());
  ASSERT_EQ(doubled_here(subnormal), 2 * subnormal);
  ASSERT_NE(2 * subnormal, 0.0f);
  if (!remat::set_flush_denormal(true)) GTEST_SKIP() << "this CPU has no flush-to-zero mode";
  EXPECT_EQ(doubled_here(subnormal), 0.0f);
  // Teams of 1-3 reuse the pool's threads the call set; 4 and 5 add threads created after it (inherited).
  for (int n = 1; n <= 5; ++n)
    for (bool flushes : team_flushes(n)) EXPECT_TRUE(flushes) << "a thread of a team of " << n;
  remat::set_flush_denormal(false);
  EXPECT_EQ(doubled_here(subnormal), 2 * subnormal);
  for (int n = 1; n <= 5; ++n)
    for (bool flushes : team_flushes(n)) EXPECT_FALSE(flushes) << "a thread of a team of " << n;
}

// End to end: an op whose row blocks go to the team. (Which thread takes a block is not fixed, so this alone
// cannot show that every team thread flushes; the test above does.)
TEST(SetFlushDenormal, AnOpOnTheTeamFlushesSubnormalsAndKeepsThemBitwiseWhenOff) {
  const RestoreModes restore;
  ASSERT_GT(remat::detail::row_blocks(800, 45, 1).count, 1);  // the op's row blocks go to the team
  for (int threads : {1, 2, 3}) {
    const Matrix<float> ieee = doubled_on_team(threads);
    EXPECT_TRUE(all_equal(ieee, 2 * subnormal)) << threads << " threads, flushing off";
    if (!remat::set_flush_denormal(true)) GTEST_SKIP() << "this CPU has no flush-to-zero mode";
    EXPECT_TRUE(all_equal(doubled_on_team(threads), 0.0f)) << threads << " threads, flushing on";
    remat::set_flush_denormal(false);
  }
}

}  // namespace flush_denormal_test
