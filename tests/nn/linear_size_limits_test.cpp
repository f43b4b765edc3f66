// nn::Linear's initialisation with sizes whose sum overflows an Index: a typed exception, never signed
// overflow (a regression test).
// Programs that would hit UB or a crash under -fno-sanitize-recover run in a death-test child (ExitedWithCode(0)
// means the documented typed exception, or a correct result, came back), so that the rest of this program runs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>

#include "remat/nn/linear.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace linear_size_limits_test {

using remat::Index;

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

// Regression (UB): nn::Linear's glorot_uniform bound computes inputs + outputs in Index arithmetic, which overflows for
// sizes whose sum exceeds INT64_MAX (include/remat/nn/linear.hpp:65; UBSan: "signed integer overflow:
// 9223372036854775807 + 1"). Expected: a typed exception (shape_error for sizes no matrix can have, or the
// std::bad_alloc the he_uniform path throws for the same sizes), no UB. Without the sanitizers the child exits 0
// (the wrapped sum goes unnoticed and the allocation throws), so this fails only in the sanitizer build.
TEST(LinearSizeLimits, LinearGlorotWithSizesWhoseSumOverflowsIsNotUndefinedBehaviour) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                remat::nn::Generator generator(1);
                try {
                  remat::nn::Linear<float> layer(std::numeric_limits<Index>::max(), 1, generator,
                                                 remat::nn::Init::glorot_uniform);
                  std::_Exit(2);  // no exception: impossible sizes accepted
                } catch (const remat::shape_error&) {
                } catch (const std::bad_alloc&) {
                }
              }),
              ::testing::ExitedWithCode(0), "");
}

}  // namespace linear_size_limits_test
