// gtest helpers around remat::gradcheck (include/remat/gradcheck.hpp):
//
//   auto result = remat_test::gradcheck(
//       [](remat::Tape<double>&, const std::vector<remat::Var<double>>& v) { return remat::sum(remat::tanh(v[0])); },
//       {x});
//   EXPECT_TRUE(remat_test::passes(result));   // max relative error ≤ 1e-6
#pragma once

#include <gtest/gtest.h>

#include "remat/gradcheck.hpp"

namespace remat_test {

using remat::gradcheck;
using remat::GradcheckOptions;
using remat::GradcheckResult;
using remat::LossFunction;

/// gtest assertion: success when the maximum relative error is ≤ tolerance (default 1e-6).
inline ::testing::AssertionResult passes(const GradcheckResult& result, double tolerance = 1e-6) {
  if (result.checked > 0 && result.max_error <= tolerance) return ::testing::AssertionSuccess() << result.describe();
  return ::testing::AssertionFailure() << "gradcheck failed (tolerance " << tolerance << "): " << result.describe();
}

}  // namespace remat_test
