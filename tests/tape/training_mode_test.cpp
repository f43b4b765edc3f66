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

#include "api_checks.hpp"
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

using remat_test::describe;
using remat_test::expect_error_naming;
using remat_test::passes;
using remat_test::rnd;
using remat_test::rndd;
using remat_test::same_bits;
using remat_test::same_memory;

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
  EXPECT_TRUE(y.is_same(x));  // dropout is the identity: the region returned its input
  EXPECT_EQ(tape.size(), nodes);
  tape.backward(remat::sum(remat::square(y)));
  EXPECT_TRUE(x.grad().isApprox((2 * x.value().array()).matrix()));
  EXPECT_EQ(tape.memory().replayed_ops, 0u);
}

}  // namespace training_mode_test
