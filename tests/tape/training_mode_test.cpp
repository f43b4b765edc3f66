// Tape::set_training: dropout recorded in training mode replays its mask after set_training(false), and a
// region whose function records nothing in evaluation mode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace training_mode_test {

using remat::Index;
using remat::Matrix;
using remat::Shape;
using remat::Tape;
using remat::Var;
using MF = Matrix<float>;
using MD = Matrix<double>;
using VF = Var<float>;
using VD = Var<double>;

MF rnd(Index rows, Index cols, std::uint64_t seed, double low = -1, double high = 1) {
  return remat_test::random_matrix<float>(rows, cols, seed, remat_test::Domain{low, high, 0});
}
MD rndd(Index rows, Index cols, std::uint64_t seed, double low = -1, double high = 1) {
  return remat_test::random_matrix<double>(rows, cols, seed, remat_test::Domain{low, high, 0});
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  const MF x = a, y = b;
  return std::memcmp(x.data(), y.data(), sizeof(float) * static_cast<std::size_t>(x.size())) == 0;
}

bool same_memory(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops && a.cached_bytes == b.cached_bytes;
}
std::string describe(const remat::MemoryStats& m) {
  std::ostringstream s;
  s << "live " << m.live_bytes << " peak " << m.peak_bytes << " saved " << m.saved_bytes << " replayed "
    << m.replayed_bytes << " (" << m.replayed_ops << " ops) cached " << m.cached_bytes;
  return s.str();
}

using remat_test::expect_error_naming;

::testing::AssertionResult passes(const remat::GradcheckResult& r, double tolerance = 1e-6) {
  if (r.checked > 0 && r.max_error <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gradcheck (tolerance " << tolerance << "): " << r.describe();
}
// ================================================================ training mode and replay

TEST(TrainingMode, DropoutRecordedInTrainingModeReplaysItsMaskAfterSetTrainingFalse) {
  const MF xv = rnd(4, 6, 81);
  auto run = [&](bool checkpointed, bool toggle_inside) {
    Tape<float> tape(7);
    const VF x = tape.variable(xv);
    auto f = [&](const VF& a) {
      VF h = remat::dropout(remat::tanh(a), 0.5);
      if (toggle_inside) {
        tape.set_training(false);  // evaluation mode inside the function: this dropout records nothing
        h = remat::dropout(h, 0.5);
        tape.set_training(true);
      }
      return remat::square(remat::dropout(h, 0.3));
    };
    const VF y = checkpointed ? remat::checkpoint(f)(x) : f(x);
    tape.set_training(false);  // toggled between forward and backward
    tape.backward(remat::sum(y));
    return std::make_pair(MF(y.value()), MF(x.grad()));
  };
  for (const bool toggle : {false, true}) {
    const auto plain = run(false, toggle), ckpt = run(true, toggle);
    EXPECT_TRUE(same_bits(plain.first, ckpt.first));
    EXPECT_TRUE(same_bits(plain.second, ckpt.second));
    EXPECT_GT((plain.second.array() == 0).count(), 0);  // the masks dropped something
  }
}

TEST(TrainingMode, ARegionWhoseFunctionRecordsNothingInEvaluationMode) {
  Tape<float> tape;
  tape.set_training(false);
  const VF x = tape.variable(rnd(2, 3, 82));
  const std::size_t nodes = tape.size();
  const VF y = remat::checkpoint([](const VF& a) { return remat::dropout(a, 0.5); })(x);
  EXPECT_EQ(y.id(), x.id());  // dropout is the identity: the region returned its input
  EXPECT_EQ(tape.size(), nodes);
  tape.backward(remat::sum(remat::square(y)));
  EXPECT_TRUE(x.grad().isApprox((2 * x.value().array()).matrix()));
  EXPECT_EQ(tape.memory().replayed_ops, 0u);
}

}  // namespace training_mode_test
