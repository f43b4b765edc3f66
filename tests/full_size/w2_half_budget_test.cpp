// The full-size W2 of bench/workloads.hpp (2048 × 256, ~0.4 GB, a few seconds optimised) under
// checkpoint_sequential_auto() with half the plain peak (tests/support/w2_half_budget.hpp; tests/schedule runs the
// same check on a reduced W2). Its own program so that scripts/test.sh's optimised build compiles only this and
// tests/alloc (under the sanitizers it would take minutes, and it exercises no code the reduced case does not).
#include <gtest/gtest.h>

#include "w2_half_budget.hpp"

namespace {

TEST(CheckpointSequentialAuto, W2FullSizeWithHalfThePlainPeak) {
  w2_half_budget::check_w2_at_half_budget(2048, 256);
}

}  // namespace
