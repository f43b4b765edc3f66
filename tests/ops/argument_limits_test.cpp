// Op arguments at the limits of their types (regression tests): a layer_norm eps that is 0 in float, division
// by a non-finite or tiny scalar, scalars not finite in float on a float tape, concat_cols parts whose columns
// together overflow. Each throws a typed exception naming the op and leaves the tape as it was.
// Programs that would hit UB or a crash under -fno-sanitize-recover run in a death-test child (ExitedWithCode(0)
// means the documented typed exception, or a correct result, came back), so that the rest of this program runs.
#include <gtest/gtest.h>

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

#include "expect_error.hpp"
#include "memory.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace argument_limits_test {

using remat::Index;
using remat::Matrix;
using remat::MemoryStats;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using M = Matrix<float>;

bool same_memory(const MemoryStats& a, const MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops && a.cached_bytes == b.cached_bytes &&
         a.evictions == b.evictions && a.rematerialized_ops == b.rematerialized_ops &&
         a.rematerialized_bytes == b.rematerialized_bytes;
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

// Regression (silent NaN past a documented check): layer_norm throws domain_error for eps ≤ 0 (checked in double) but
// computes with T(eps): on a Tape<float>, eps = 1e-50 > 0 passes the check and becomes 0, so a constant row gives
// x̂ = 0·(1/√0) = NaN in the value and the gradients, with no exception. Expected: domain_error naming layer_norm
// (eps not positive in the tape's type), or finite values and gradients.
TEST(OpArgumentLimits, LayerNormEpsThatIsZeroInFloatThrowsOrStaysFinite) {
  Tape<float> tape;
  Var<float> x = tape.variable(M::Constant(2, 3, 0.5f));  // constant rows: variance 0
  Var<float> gain = tape.variable(M::Ones(1, 3));
  Var<float> bias = tape.variable(M::Zero(1, 3));
  const MemoryStats before = tape.memory();
  try {
    Var<float> y = remat::layer_norm(x, gain, bias, 1e-50);
    const M value = y.value();
    const auto g = tape.gradient(remat::sum(remat::square(y)), {x, gain});
    EXPECT_TRUE(value.allFinite()) << "layer_norm(eps = 1e-50) on float: value\n" << value;
    EXPECT_TRUE(g[0].allFinite() && g[1].allFinite()) << "gradients\n" << g[0] << "\n" << g[1];
  } catch (const remat::domain_error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_norm"), std::string::npos) << e.what();
    EXPECT_TRUE(same_memory(before, tape.memory()));
  }
}

// Regression (message): x / c for a NaN c (or, on a double tape, a finite c ≠ 0 whose reciprocal overflows, 1e-310)
// throws domain_error "affine: scale and shift must be finite, got nan and 0.000000" ("got inf and 0.000000"):
// it names an op the user did not call and a value the user did not pass. Expected: the message names divide (the
// op of x / c, as its c = 0 message does) and c.
TEST(OpArgumentLimits, DivisionByANonFiniteOrTinyScalarNamesDivide) {
  Tape<double> tape;
  Var<double> x = tape.variable(Matrix<double>::Constant(2, 2, 3.0));
  for (double c : {std::nan(""), 1e-310}) {
    SCOPED_TRACE(c);
    try {
      Var<double> y = x / c;
      if (c != c) ADD_FAILURE() << "x / NaN: no exception";
    } catch (const remat::domain_error& e) {
      EXPECT_NE(std::string(e.what()).find("divide"), std::string::npos) << e.what();
    }
  }
}
// Regression (UB): concat_cols added its parts' column counts in Index arithmetic without an overflow check;
// on a shapes-only tape, two [1,2^62] parts gave UBSan's "signed integer overflow" (concat_cols.hpp). Such parts
// are now refused as leaves (a tensor has at most 2^48 bytes), so the case that remains is parts that are each
// valid but whose concatenation is not: three [1,2^45] float parts (2^47 bytes each) make 1.5 · 2^48 bytes.
// Expected: shape_error naming concat_cols before any of the tree's records, so the tape keeps only the leaf
// (a check made per record would leave the smaller partial concatenations recorded before it threw).
TEST(OpArgumentLimits, ConcatColsWhoseColumnsOverflowAnIndexThrowsShapeErrorNotUB) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                Tape<float> tape(remat::shapes_only);
                Var<float> a = tape.constant(M::Zero(1, Index{1} << 45));
                try {
                  remat::concat_cols({a, a, a});
                  std::_Exit(2);
                } catch (const remat::shape_error& e) {
                  if (std::string(e.what()).find("concat_cols") == std::string::npos) std::_Exit(3);
                  if (tape.size() != 1) std::_Exit(4);
                }
              }),
              ::testing::ExitedWithCode(0), "");
}
// The float tape's side of the checks above (review of c1c985e): a scale, shift, reciprocal or eps that is
// finite (or positive) as a double but not as a float used to reach the kernel as inf or 0. Each must throw
// domain_error naming its op with the tape unchanged; the same values on a double tape still work.
TEST(OpArgumentLimits, ScalarsThatAreNotFiniteInFloatThrowOnAFloatTape) {
  Tape<float> tape;
  Var<float> x = tape.variable(M::Constant(2, 3, 0.5f));
  Var<float> gain = tape.variable(M::Ones(1, 3));
  Var<float> bias = tape.variable(M::Zero(1, 3));
  const MemoryStats before = tape.memory();
  const std::size_t size = tape.size();
  auto expect_domain_error = [&](const char* op, auto&& call) {
    SCOPED_TRACE(op);
    remat_test::expect_error_naming<remat::domain_error>(call, {op});
    EXPECT_TRUE(same_memory(before, tape.memory()));
    EXPECT_EQ(tape.size(), size);
  };
  expect_domain_error("divide", [&] { (void)(x / 1e-39); });
  expect_domain_error("affine", [&] { (void)(x * 1e39); });
  expect_domain_error("affine", [&] { (void)(x + 1e39); });
  expect_domain_error("layer_norm", [&] { (void)remat::layer_norm(x, gain, bias, 1e300); });
  Tape<double> wide;
  Var<double> y = wide.variable(Matrix<double>::Constant(2, 3, 0.5));
  EXPECT_TRUE((y / 1e-39).value().allFinite());
  EXPECT_TRUE((y * 1e39).value().allFinite());
}

}  // namespace argument_limits_test
