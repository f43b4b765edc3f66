// Anomaly detection (Tape::set_detect_anomaly, torch.autograd.set_detect_anomaly's role): the first NaN or
// ±inf in a leaf, a forward value or a backward gradient throws anomaly_error naming where it came from.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "expect_error.hpp"
#include "memory.hpp"
#include "remat/remat.hpp"

namespace anomaly_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

TEST(AnomalyDetection, OffByDefaultANaNFlowsSilently) {
  Tape<double> tape;
  EXPECT_FALSE(tape.detect_anomaly());
  Matrix<double> x = Matrix<double>::Ones(2, 2);
  x(0, 1) = std::numeric_limits<double>::quiet_NaN();
  const Var<double> loss = remat::sum(remat::tanh(tape.variable(x)));
  EXPECT_TRUE(std::isnan(loss.item()));
  tape.backward(loss);
}

TEST(AnomalyDetection, ALeafWithANaNIsRefusedAndTheTapeUnchanged) {
  Tape<double> tape;
  tape.set_detect_anomaly(true);
  const Var<double> ok = tape.constant(Matrix<double>::Ones(2, 3));
  const std::size_t size = tape.size(), live = tape.memory().live_bytes;
  Matrix<double> x = Matrix<double>::Ones(2, 3);
  x(1, 2) = std::numeric_limits<double>::infinity();
  remat_test::expect_error_naming<remat::anomaly_error>([&] { tape.constant(x); },
                                                        {"constant", "[2,3]", "inf at (1,2)", "set_detect_anomaly"});
  EXPECT_EQ(tape.size(), size);
  EXPECT_EQ(tape.memory().live_bytes, live);
  Parameter<double> p(x);
  remat_test::expect_error_naming<remat::anomaly_error>([&] { tape.variable(p); }, {"Parameter", "inf at (1,2)"});
  EXPECT_EQ(tape.size(), size);
}

TEST(AnomalyDetection, AForwardThatMakesANaNIsNotRecordedAndNamesTheOp) {
  Tape<double> tape;
  tape.set_detect_anomaly(true);
  const Var<double> x = tape.variable(Matrix<double>{{1.0, -2.0}});
  const std::size_t size = tape.size();
  const remat::MemoryStats before = tape.memory();
  try {
    remat::log(x);  // log(−2): NaN from finite inputs
    ADD_FAILURE() << "no anomaly_error";
  } catch (const remat::anomaly_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("log (node #1"), std::string::npos) << what;
    EXPECT_NE(what.find("NaN at (0,1)"), std::string::npos) << what;
    EXPECT_NE(what.find("from finite inputs"), std::string::npos) << what;
    EXPECT_EQ(e.node(), 1);
  }
  EXPECT_EQ(tape.size(), size);
  EXPECT_EQ(tape.memory().live_bytes, before.live_bytes);
  EXPECT_EQ(tape.memory().peak_bytes, before.peak_bytes);
  // The tape goes on: a finite op records and differentiates.
  const Var<double> loss = remat::sum(remat::square(x));
  tape.backward(loss);
  EXPECT_EQ(Matrix<double>(x.grad()), (Matrix<double>{{2.0, -4.0}}));
}

TEST(AnomalyDetection, ABackwardThatWritesAnInfNamesTheOpWhoseBackwardWroteIt) {
  // sqrt(x) at x = 0 is finite, its derivative 1/(2·sqrt(x)) is not: the backward of sqrt writes inf into
  // the gradient of its input, node #0, from a finite incoming gradient.
  Tape<double> tape;
  tape.set_detect_anomaly(true);
  const Var<double> x = tape.variable(Matrix<double>{{4.0, 0.0}});
  const Var<double> loss = remat::sum(remat::sqrt(x));
  try {
    tape.backward(loss);
    ADD_FAILURE() << "no anomaly_error";
  } catch (const remat::anomaly_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("backward of sqrt (node #1"), std::string::npos) << what;
    EXPECT_NE(what.find("inf at (0,1)"), std::string::npos) << what;
    EXPECT_NE(what.find("input 0 (node #0, variable"), std::string::npos) << what;
    EXPECT_NE(what.find("from a finite incoming gradient"), std::string::npos) << what;
    EXPECT_EQ(e.node(), 1);
  }
  // The sweep completed: the gradient holds what was computed.
  EXPECT_EQ(x.grad()(0, 0), 0.25);
  EXPECT_TRUE(std::isinf(x.grad()(0, 1)));
}

TEST(AnomalyDetection, BackwardRethrowsWhicheverOfACallbackAndAnAnomalyCameFirst) {
  // loss = sum(sqrt(a · q)) + sum(p · b): the sweep runs p · b's backward first (p's gradient is complete there,
  // its callback runs), then sqrt's, which writes inf (a · q = 0 there), then a · q's (q's callback).
  // `throwing` says whose callback throws: p's comes before the anomaly, q's after it.
  for (const bool callback_first : {true, false}) {
    SCOPED_TRACE(callback_first ? "the callback throws first" : "the anomaly comes first");
    Tape<double> tape;
    tape.set_detect_anomaly(true);
    Parameter<double> p(Matrix<double>::Ones(1, 2)), q(Matrix<double>::Ones(1, 2));
    const Parameter<double>& throwing = callback_first ? p : q;
    std::vector<const void*> called;
    tape.on_gradient_ready([&](Parameter<double>& r) {
      called.push_back(&r.value());
      if (&r.value() == &throwing.value()) throw std::runtime_error("the callback's exception");
    });
    const Var<double> a = tape.variable(Matrix<double>{{0.0, 1.0}}), b = tape.variable(Matrix<double>::Ones(1, 2));
    const Var<double> first = remat::sum(remat::sqrt(a * tape.variable(q)));  // recorded first: swept last
    const Var<double> loss = first + remat::sum(tape.variable(p) * b);
    if (callback_first) {
      remat_test::expect_error_naming<std::runtime_error>([&] { tape.backward(loss); }, {"the callback's exception"});
    } else {
      remat_test::expect_error_naming<remat::anomaly_error>([&] { tape.backward(loss); }, {"backward of sqrt"});
    }
    EXPECT_EQ(called.size(), callback_first ? 1u : 2u);  // none after a callback threw
  }
}

TEST(AnomalyDetection, ACapturedStepRefusesIt) {
  Parameter<float> w(Matrix<float>::Ones(2, 2));
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        remat::CapturedStep<float> step([&](Tape<float>& tape) {
          tape.set_detect_anomaly(true);
          return remat::sum(remat::matmul(tape.constant(Matrix<float>::Ones(1, 2)), tape.variable(w)));
        });
      },
      {"CapturedStep", "set_detect_anomaly", "replay() checks no value"});
  EXPECT_EQ(w.grad().sum(), 0.0f);  // refused before the backward
}

}  // namespace anomaly_test
