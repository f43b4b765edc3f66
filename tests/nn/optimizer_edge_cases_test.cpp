// The optimizers (nn::AdamW, nn::SGD, nn::clip_grad_norm, nn::WarmupCosineSchedule) at their edges: a NaN
// gradient poisons only its own element, clipping at zero, negative or NaN norms and with a Parameter listed
// twice, parameter groups empty, duplicated or with state of the wrong shape, a Parameter resized after its
// gradient was written, the schedule's first and last steps.
//
// Each test states the behaviour asked for (a typed exception naming the op and the values, with the tape and
// its memory() figures unchanged; no UB; no silent wrong gradient; checkpointed gradients bitwise equal to plain
// ones under every policy; exact memory figures) and checks that the library does it; a "Regression:" comment
// says what the library did before.
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
#include "remat/nn/adamw.hpp"
#include "remat/nn/clip_grad_norm.hpp"
#include "remat/nn/sgd.hpp"
#include "remat/nn/warmup_cosine_schedule.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace optimizer_edge_cases_test {

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

// ================================================================ optimizers

TEST(OptimizerEdgeCases, ANaNGradientPoisonsOnlyItsOwnElementAndClippingLeavesItForTheCaller) {
  remat::Parameter<float> a(rnd(2, 3, 101)), b(rnd(1, 4, 102));
  const MF a0 = a.value(), b0 = b.value();
  remat::nn::AdamW<float> opt({&a, &b});
  MF ga = rnd(2, 3, 103);
  ga(1, 2) = std::numeric_limits<float>::quiet_NaN();
  a.mutable_grad() = ga;
  b.mutable_grad() = rnd(1, 4, 104);
  const MF grad_a = a.grad(), grad_b = b.grad();
  EXPECT_TRUE(std::isnan(remat::nn::clip_grad_norm<float>({&a, &b}, 1.0)));
  EXPECT_TRUE(same_bits(a.grad(), grad_a));
  EXPECT_TRUE(same_bits(b.grad(), grad_b));  // unchanged: the caller decides to skip the step
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::clip_grad_norm<float>({&a, &b}, 1.0, true);
      },
      {"clip_grad_norm", "nan"});
  EXPECT_TRUE(same_bits(b.grad(), grad_b));
  opt.step();
  EXPECT_TRUE(std::isnan(a.value()(1, 2)));
  EXPECT_EQ((a.value().array().isNaN()).count(), 1);
  EXPECT_TRUE(b.value().allFinite());
  EXPECT_FALSE(same_bits(b.value(), b0));
  (void)a0;
}

TEST(OptimizerEdgeCases, ClipGradNormAtZeroNegativeNaNAndWithAParameterListedTwice) {
  remat::Parameter<float> p(rnd(2, 2, 105)), q(rnd(3, 1, 106));
  p.mutable_grad() = MF::Constant(2, 2, 3);  // norm 6
  q.mutable_grad() = MF::Zero(3, 1);
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p, &q}, 0.0), 6.0);
  EXPECT_TRUE(p.grad().isZero(0));  // max_norm 0: every gradient becomes 0
  p.mutable_grad() = MF::Constant(2, 2, 3);
  for (const double bad : {-1.0, -0.0 - 1e-300, std::nan("")}) {
    expect_error_naming<remat::domain_error>([&] { remat::nn::clip_grad_norm<float>({&p}, bad); },
                                             {"clip_grad_norm", "max_norm"});
    EXPECT_TRUE(same_bits(p.grad(), MF::Constant(2, 2, 3)));
  }
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({}, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, std::numeric_limits<double>::infinity()), 6.0);
  // Regression: a Parameter listed twice was counted twice in the norm (√2 · 6) and scaled twice (by the
  // square of the factor): a silently wrong gradient. The optimizers reject a parameter given twice with
  // domain_error; clip_grad_norm now does the same (include/remat/nn/clip_grad_norm.hpp), changing nothing.
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::clip_grad_norm<float>({&p, &q, &p}, 1.0);
      },
      {"clip_grad_norm", "0", "2", "same parameter"});
  EXPECT_TRUE(same_bits(p.grad(), MF::Constant(2, 2, 3)));
}

TEST(OptimizerEdgeCases, GroupsEmptyDuplicatedOrWithWrongShapedStateChangeNothing) {
  remat::Parameter<float> a(rnd(2, 3, 107)), b(rnd(3, 1, 108)), empty;
  // Empty groups and an optimizer of no parameters.
  remat::nn::AdamW<float> none(std::vector<remat::Parameter<float>*>{});
  none.step();
  none.step(std::vector<MF>{});
  EXPECT_EQ(none.step_count(), 2u);
  remat::nn::AdamW<float> with_empty({remat::nn::ParameterGroup<float>{}, {{&a}, 0.0}, {}});
  EXPECT_EQ(with_empty.size(), 1u);
  // A 0×0 parameter steps (nothing to update).
  remat::nn::SGD<float> sgd0({&empty, &b}, {0.1, 0.9});
  sgd0.step(std::vector<MF>{MF(), MF::Ones(3, 1)});
  EXPECT_EQ(sgd0.momentum_buffer(1), MF::Ones(3, 1));
  // The same parameter in two groups.
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::AdamW<float> o({{{&a, &b}}, {{&b}, 0.0}});
      },
      {"nn::AdamW", "same parameter"});
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::SGD<float> o({{{&a}}, {{&b, &a}, 0.0}});
      },
      {"nn::SGD", "same parameter"});
  // Resuming with wrong-shaped state: shape_error before any parameter (even an earlier one) is updated.
  remat::nn::AdamW<float> opt({&a, &b});
  a.mutable_grad() = rnd(2, 3, 109);
  b.mutable_grad() = rnd(3, 1, 110);
  opt.step();
  const MF a1 = a.value(), b1 = b.value(), m0 = opt.first_moment(0);
  opt.second_moment(1) = MF::Zero(1, 3);
  expect_error_naming<remat::shape_error>([&] { opt.step(); }, {"nn::AdamW", "second moment", "[1,3]", "[3,1]"});
  EXPECT_TRUE(same_bits(a.value(), a1));
  EXPECT_TRUE(same_bits(b.value(), b1));
  EXPECT_TRUE(same_bits(opt.first_moment(0), m0));
  EXPECT_EQ(opt.step_count(), 1u);
  remat::nn::SGD<float> sgd({&a, &b}, {0.1, 0.9});
  sgd.momentum_buffer(1) = MF::Zero(3, 3);
  expect_error_naming<remat::shape_error>([&] { sgd.step(); }, {"nn::SGD", "momentum buffer", "[3,3]"});
  EXPECT_TRUE(same_bits(a.value(), a1));
  // A parameter reshaped after construction.
  a.mutable_value().resize(3, 2);
  expect_error_naming<remat::shape_error>(
      [&] {
        opt.step(std::vector<MF>{MF::Ones(3, 2), MF::Ones(3, 1)});
      },
      {"nn::AdamW"});
  EXPECT_TRUE(same_bits(b.value(), b1));
}

// Regression: a Parameter's gradient keeps the size of the value a backward (or mutable_grad) wrote it for;
// after the value was resized (mutable_value() = a larger matrix), Parameter::grad(), mutable_grad() and so
// nn::clip_grad_norm mapped the old buffer with the new shape and read (and scaled) past its end (an ASan
// heap-buffer-overflow), and an optimizer made after the resize read the old buffer as the new value's
// gradient in step(). backward already refused it ("call zero_grad() after resizing a parameter"). Fixed in
// include/remat/parameter.hpp (ParameterStorage::check_grad_size in grad_matrix() and copies) and
// include/remat/nn/optimizer.hpp (step()): shape_error, changing nothing.
TEST(OptimizerEdgeCases, AParameterResizedAfterItsGradientWasWrittenThrowsInsteadOfReadingPastIt) {
  remat::Parameter<float> p(MF::Ones(2, 2)), q(rnd(1, 3, 116));
  {
    Tape<float> tape;
    tape.backward(remat::sum(tape.variable(p)) + remat::sum(tape.variable(q)));
  }
  ASSERT_TRUE(p.has_grad());
  p.mutable_value() = MF::Ones(30, 30);  // resized after its gradient (4 elements) was written
  const MF q_grad = q.grad();
  expect_error_naming<remat::shape_error>([&] { p.grad(); }, {"4 elements", "[30,30]", "zero_grad"});
  expect_error_naming<remat::shape_error>([&] { p.mutable_grad(); }, {"4 elements", "[30,30]"});
  expect_error_naming<remat::shape_error>(
      [&] {
        remat::nn::clip_grad_norm<float>({&q, &p}, 1e-3);
      },
      {"4 elements", "[30,30]"});
  EXPECT_TRUE(same_bits(q.grad(), q_grad));  // nothing scaled
  expect_error_naming<remat::shape_error>([&] { remat::Parameter<float> copy(p); }, {"4 elements"});
  remat::nn::AdamW<float> opt({&q, &p});  // made after the resize: the shapes agree, the gradient does not
  const MF q_value = q.value();
  expect_error_naming<remat::shape_error>([&] { opt.step(); }, {"nn::AdamW::step", "4 elements", "[30,30]"});
  EXPECT_TRUE(same_bits(q.value(), q_value));
  EXPECT_EQ(opt.step_count(), 0u);
  {  // the tape's variable refuses it too
    Tape<float> tape;
    const VF v = tape.variable(p);
    EXPECT_THROW(v.grad(), remat::shape_error);
    EXPECT_THROW(tape.backward(remat::sum(v)), remat::shape_error);
  }
  // After zero_grad() everything works at the new shape.
  p.zero_grad();
  EXPECT_TRUE(p.grad().isZero(0));
  EXPECT_EQ(p.grad().rows(), 30);
  opt.step();
  EXPECT_EQ(opt.step_count(), 1u);
  {
    Tape<float> tape;
    tape.backward(remat::sum(tape.variable(p)));
  }
  EXPECT_TRUE(same_bits(p.grad(), MF::Ones(30, 30)));
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, 1e9), 30.0);
}

TEST(OptimizerEdgeCases, WarmupCosineScheduleAtItsEdges) {
  const remat::nn::WarmupCosineSchedule one(1e-3, 0, 1, 1e-5);
  EXPECT_DOUBLE_EQ(one.at(0), 1e-3);
  EXPECT_DOUBLE_EQ(one.at(1), 1e-5);
  EXPECT_DOUBLE_EQ(one.at(std::numeric_limits<std::uint64_t>::max()), 1e-5);
  const remat::nn::WarmupCosineSchedule s(2.0, 3, 4);
  EXPECT_DOUBLE_EQ(s.at(0), 2.0 / 3);
  EXPECT_DOUBLE_EQ(s.at(2), 2.0);
  EXPECT_DOUBLE_EQ(s.at(3), 2.0);
  EXPECT_DOUBLE_EQ(s.at(4), 0.0);
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1, 5, 5); }, {"total_steps"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1, -1, 5); }, {"warmup_steps"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(std::nan(""), 0, 5); }, {"peak_lr"});
}

}  // namespace optimizer_edge_cases_test
