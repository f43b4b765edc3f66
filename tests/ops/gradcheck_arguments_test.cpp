// remat::gradcheck's own arguments: a non-scalar loss, no inputs, functions that record nothing, NaN inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "api_checks.hpp"
#include "expect_error.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace gradcheck_arguments_test {

using remat::Index;
using remat::Matrix;
using remat::Shape;
using remat::Tape;
using remat::Var;
using MF = Matrix<float>;
using MD = Matrix<double>;
using VF = Var<float>;
using VD = Var<double>;

using remat_test::describe;
using remat_test::expect_error_naming;
using remat_test::passes;
using remat_test::rnd;
using remat_test::rndd;
using remat_test::same_bits;
using remat_test::same_memory;

// ================================================================ gradcheck

TEST(GradcheckArguments, NonScalarLossNoInputsAndFunctionsThatRecordNothing) {
  expect_error_naming<remat::shape_error>(
      [] { remat::gradcheck([](Tape<double>&, const std::vector<VD>& v) { return v[0]; }, {rndd(2, 2, 111)}); },
      {"[1,1]", "[2,2]"});
  // No inputs: nothing checked (a caller's "max_error ≤ tol" must not pass silently: checked == 0, input −1).
  const auto none =
      remat::gradcheck([](Tape<double>& t, const std::vector<VD>&) { return t.constant(MD::Constant(1, 1, 2.0)); }, {});
  EXPECT_EQ(none.checked, 0u);
  EXPECT_EQ(none.input, -1);
  EXPECT_NE(none.describe().find("over 0 elements"), std::string::npos);
  // Records nothing: the input itself is the loss (derivative 1); a fresh constant (derivative 0).
  const auto identity =
      remat::gradcheck([](Tape<double>&, const std::vector<VD>& v) { return v[0]; }, {MD(MD::Constant(1, 1, 3.0))});
  EXPECT_TRUE(passes(identity));
  EXPECT_EQ(identity.analytic, 1.0);
  const auto constant = remat::gradcheck(
      [](Tape<double>& t, const std::vector<VD>&) { return t.constant(MD::Constant(1, 1, 2.0)); }, {rndd(2, 2, 112)});
  EXPECT_TRUE(passes(constant));
  EXPECT_EQ(constant.checked, 4u);
  // A loss that reaches its input through detach only: the analytic gradient is 0, the numeric one is not,
  // and gradcheck must say so.
  const auto detached = remat::gradcheck(
      [](Tape<double>&, const std::vector<VD>& v) { return remat::sum(remat::square(remat::detach(v[0]))); },
      {rndd(2, 2, 113, 0.5, 1)});
  EXPECT_GT(detached.max_error, 0.5);
  // A step of 0 divides 0 by 0: an infinite error, not a pass.
  remat::GradcheckOptions zero_step;
  zero_step.step = 0;
  const auto zero =
      remat::gradcheck([](Tape<double>&, const std::vector<VD>& v) { return remat::sum(remat::square(v[0])); },
                       {rndd(2, 2, 115)}, zero_step);
  EXPECT_FALSE(passes(zero));
  // A NaN input gives an infinite error, not a pass.
  MD nan_input = rndd(2, 2, 114);
  nan_input(1, 1) = std::nan("");
  const auto nan = remat::gradcheck(
      [](Tape<double>&, const std::vector<VD>& v) { return remat::sum(remat::square(v[0])); }, {nan_input});
  EXPECT_TRUE(std::isinf(nan.max_error));
  EXPECT_FALSE(passes(nan));
}

}  // namespace gradcheck_arguments_test
