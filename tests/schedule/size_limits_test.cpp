// revolve(), revolve_recomputations() and plan_schedule() with arguments at the limits of their integer types:
// a typed exception or a correct result, never signed overflow or a stack overflow (regression tests).
// Programs that would hit UB or a crash under -fno-sanitize-recover run in a death-test child (ExitedWithCode(0)
// means the documented typed exception, or a correct result, came back), so that the rest of this program runs.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace size_limits_test {

using remat::Index;
using remat::Matrix;
using remat::MemoryStats;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using M = Matrix<float>;

/// The most derived of remat's typed errors `e` is, or null.
const char* typed(const std::exception& e) {
  if (dynamic_cast<const remat::memory_budget_error*>(&e)) return "memory_budget_error";
  if (dynamic_cast<const remat::shape_error*>(&e)) return "shape_error";
  if (dynamic_cast<const remat::index_error*>(&e)) return "index_error";
  if (dynamic_cast<const remat::domain_error*>(&e)) return "domain_error";
  if (dynamic_cast<const remat::stale_value_error*>(&e)) return "stale_value_error";
  if (dynamic_cast<const remat::freed_value_error*>(&e)) return "freed_value_error";
  if (dynamic_cast<const remat::shapes_only_error*>(&e)) return "shapes_only_error";
  if (dynamic_cast<const remat::tape_error*>(&e)) return "tape_error";
  return nullptr;
}

// A death-test child: runs `body` with an alarm (a hang fails instead of blocking the suite) and exits 0 when it
// returns (the documented exception was caught inside, or a correct result came back); UBSan's report
// (-fno-sanitize-recover), ASan's stack overflow or an uncaught exception ends it otherwise.
template <class Body>
void run_in_child(Body body) {
  alarm(10);
  body();
  std::fflush(stdout);
  std::_Exit(0);
}

// Regression (UB): revolve() and revolve_recomputations() compute C(s + r, s) with checkpoints + r and range·(s + r)
// in std::int64_t (include/remat/schedule/revolve.hpp:30, revolve_repetitions), which overflow for a huge number
// of checkpoints (INT64_MAX, "as many as you like") and for many steps: UBSan reports "signed integer overflow:
// 1 + 9223372036854775807" for revolve(step, x, 10, INT64_MAX) before anything is recorded, and "86252 *
// 106936523423125" for revolve_recomputations(10^18, 3), whose true value (about 1.8e24) no int64 holds.
// Built at -O2 without the sanitizers, both calls do not return (a child was still looping after 20 s).
// Expected: revolve(…, 10, INT64_MAX) records the 10 steps (every state fits; or a domain_error naming revolve);
// revolve_recomputations throws a typed error naming it when the result does not fit; never UB.
TEST(ScheduleSizeLimits, RevolveWithAHugeNumberOfCheckpointsIsNotUndefinedBehaviour) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                Tape<float> tape;
                Var<float> x = tape.variable(M::Constant(2, 2, 0.5f));
                try {
                  Var<float> y = remat::revolve([](Var<float> v) { return remat::tanh(v); }, x, 10,
                                                std::numeric_limits<std::int64_t>::max());
                  tape.backward(remat::sum(y));
                } catch (const remat::domain_error& e) {
                  if (std::string(e.what()).find("revolve") == std::string::npos) std::_Exit(3);
                }
              }),
              ::testing::ExitedWithCode(0), "");
}

TEST(ScheduleSizeLimits, RevolveRecomputationsThatDoNotFitInt64ThrowInsteadOfOverflowing) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                try {
                  const std::int64_t t = remat::revolve_recomputations(1000000000000000000LL, 3);
                  if (t <= 0) std::_Exit(2);  // a wrapped result
                  std::_Exit(4);              // no int64 holds the true count (about 1.8e24)
                } catch (const std::exception& e) {
                  if (!typed(e) && !dynamic_cast<const std::overflow_error*>(&e)) std::_Exit(5);
                }
              }),
              ::testing::ExitedWithCode(0), "");
}

// Regression (crash): revolve(step, x, steps, 1) documents domain_error when the schedule would nest regions deeper
// than the tape allows, and gives it for 1,000 and 10,000 steps on the default 8 MiB stack; but revolve_depth
// recurses once per step (include/remat/schedule/revolve.hpp:51) before the depth check can throw, so 100,000
// steps overflow the default stack (ASan: stack-overflow in revolve_depth, after 16 s of its O(steps²) loops),
// and 10,000 steps overflow a 1 MiB stack (a worker thread's size on many systems), which this test sets to stay
// fast. (Built at -O2 without the sanitizers, the frames are smaller: 10,000 steps then fit in 1 MiB and this test
// passes, while revolve(…, 100000, 1) was still running after 20 s.) Expected: domain_error naming revolve,
// without recursing once per step.
TEST(ScheduleSizeLimits, RevolveOfManyStepsWithOneCheckpointThrowsDomainErrorInsteadOfOverflowingTheStack) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                rlimit stack{};
                getrlimit(RLIMIT_STACK, &stack);
                stack.rlim_cur = std::min<rlim_t>(stack.rlim_cur, rlim_t{1} << 20);
                setrlimit(RLIMIT_STACK, &stack);
                Tape<float> tape;
                Var<float> x = tape.variable(M::Constant(2, 2, 0.5f));
                try {
                  remat::revolve([](Var<float> v) { return remat::tanh(v); }, x, 10000, 1);
                  std::_Exit(2);
                } catch (const remat::domain_error& e) {
                  if (std::string(e.what()).find("revolve") == std::string::npos) std::_Exit(3);
                  if (tape.size() != 1) std::_Exit(4);
                }
              }),
              ::testing::ExitedWithCode(0), "");
}

// Regression (UB): plan_schedule accepts any non-negative sizes (Chain::validate) and bounds only the budget (2^40),
// then adds sizes in std::int64_t: for sizes of 2^62 UBSan reports "signed integer overflow:
// 4611686018427387904 + 4611686018427387904" (include/remat/schedule/planner.hpp:285); at -O2 without the
// sanitizers the wrapped sums happen to give an infeasible schedule (this test then passes). Expected: a typed
// error (domain_error naming the Chain or plan_schedule) for sizes whose sums overflow, or an infeasible schedule
// (they cannot fit a budget ≤ 2^40); never UB.
TEST(ScheduleSizeLimits, PlanScheduleWithHugeSizesIsNotUndefinedBehaviour) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                const std::int64_t big = std::int64_t{1} << 62;
                const remat::Chain chain{{1, 1}, {1, 1}, {big, big, big}, {big, big}, {}, {}, {}, {}, {}, {}};
                try {
                  const remat::Schedule s = remat::plan_schedule(chain, 100);
                  if (s.feasible) std::_Exit(2);
                } catch (const remat::domain_error&) {
                }
              }),
              ::testing::ExitedWithCode(0), "");
}

}  // namespace size_limits_test
