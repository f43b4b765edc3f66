// Every error the ops and the tape report: the exception type, the message (it names the op and the
// shapes or values), and that the tape is unchanged and still usable afterwards.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace errors_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;

/// Runs `f`, expects exception E whose what() contains every string of `parts`.
template <class E>
void expect_throw(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "message \"" << message << "\" lacks \"" << part << "\"";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

/// Records a new small graph on `tape` and runs backward (keeping the graph, so that a tape can be
/// checked several times; a tape allows one freeing backward per clear()): the gradient of sum(tanh(x·w)) w.r.t. w for
/// x = (1, 2), w = (0.1, 0.2)ᵀ is (1, 2)ᵀ (1 − tanh²(0.5)).
void expect_usable(Tape<double>& tape) {
  Matrix<double> x(1, 2), w(2, 1);
  x << 1, 2;
  w << 0.1, 0.2;
  const auto xv = tape.constant(x);
  const auto wv = tape.variable(w);
  tape.backward(remat::sum(remat::tanh(remat::matmul(xv, wv))), /*retain_graph=*/true);
  const double d = 1 - std::tanh(0.5) * std::tanh(0.5);
  EXPECT_NEAR(wv.grad()(0, 0), d, 1e-15);
  EXPECT_NEAR(wv.grad()(1, 0), 2 * d, 1e-15);
}

/// A tape with a few values recorded; each test makes one call fail on it, then checks that the
/// failed call left no node and no buffer behind and that the tape still records and differentiates.
class ErrorTest : public ::testing::Test {
 protected:
  template <class E>
  void expect_failure_leaves_tape_usable(const std::function<void()>& f, std::initializer_list<std::string> parts) {
    const std::size_t size = tape.size();
    const std::size_t live = tape.memory().live_bytes;
    expect_throw<E>(f, parts);
    EXPECT_EQ(tape.size(), size) << "the failed call recorded a node";
    EXPECT_EQ(tape.memory().live_bytes, live) << "the failed call kept a buffer";
    expect_usable(tape);
  }
  Var<double> make(remat::Index rows, remat::Index cols) {
    return tape.variable(remat_test::random_matrix(rows, cols, static_cast<std::uint64_t>(rows * 100 + cols)));
  }

  Tape<double> tape;
};

// ---- shape errors: the message names the op and both shapes ----

TEST_F(ErrorTest, Matmul) {
  const auto a = make(3, 4), b = make(5, 2);
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { remat::matmul(a, b); }, {"matmul", "[3,4]", "[5,2]"});
}

TEST_F(ErrorTest, LinearInnerDimension) {
  const auto x = make(3, 4), w = make(5, 2), b = make(1, 2);
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { remat::linear(x, w, b); }, {"linear", "[3,4]", "[5,2]"});
}

TEST_F(ErrorTest, LinearBias) {
  const auto x = make(3, 4), w = make(4, 2), b = make(2, 2);
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { remat::linear(x, w, b); }, {"linear", "[4,2]", "[2,2]"});
}

TEST_F(ErrorTest, BroadcastingOps) {
  const auto a = make(3, 4), rows = make(2, 4), cols = make(3, 2), both = make(4, 3);
  using F = std::function<Var<double>(const Var<double>&, const Var<double>&)>;
  const std::vector<std::pair<std::string, F>> ops = {
      {"add", [](auto& x, auto& y) { return remat::add(x, y); }},
      {"add", [](auto& x, auto& y) { return x + y; }},
      {"subtract", [](auto& x, auto& y) { return remat::subtract(x, y); }},
      {"subtract", [](auto& x, auto& y) { return x - y; }},
      {"multiply", [](auto& x, auto& y) { return remat::multiply(x, y); }},
      {"multiply", [](auto& x, auto& y) { return x * y; }},
      {"divide", [](auto& x, auto& y) { return remat::divide(x, y); }},
      {"divide", [](auto& x, auto& y) { return x / y; }},
  };
  for (const auto& [name, op] : ops) {
    SCOPED_TRACE(name);
    expect_failure_leaves_tape_usable<remat::shape_error>([&, &op = op] { op(a, rows); }, {name, "[3,4]", "[2,4]"});
    expect_failure_leaves_tape_usable<remat::shape_error>([&, &op = op] { op(a, cols); }, {name, "[3,4]", "[3,2]"});
    expect_failure_leaves_tape_usable<remat::shape_error>([&, &op = op] { op(both, a); }, {name, "[4,3]", "[3,4]"});
  }
}

TEST_F(ErrorTest, MseLoss) {
  const auto p = make(3, 4), t = make(4, 3);
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { remat::mse_loss(p, t); }, {"mse_loss", "[3,4]", "[4,3]"});
}

TEST_F(ErrorTest, LayerNormGainAndBias) {
  const auto x = make(3, 4), good = make(1, 4), wrong = make(1, 3), column = make(4, 1);
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { remat::layer_norm(x, wrong, good); },
                                                        {"layer_norm", "[3,4]", "gain", "[1,3]"});
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { remat::layer_norm(x, good, column); },
                                                        {"layer_norm", "[3,4]", "bias", "[4,1]"});
}

TEST_F(ErrorTest, CrossEntropyLabelCount) {
  const auto logits = make(3, 4);
  expect_failure_leaves_tape_usable<remat::shape_error>(
      [&] {
        remat::cross_entropy(logits, {0, 1});
      },
      {"cross_entropy", "[3,4]", "2 labels"});
}

TEST_F(ErrorTest, EmptyMatrix) {
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { tape.constant(Matrix<double>(0, 3)); },
                                                        {"constant", "[0,3]"});
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { tape.variable(Matrix<double>(2, 0)); },
                                                        {"variable", "[2,0]"});
  remat::Parameter<double> empty;
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { tape.variable(empty); }, {"variable", "[0,0]"});
}

TEST_F(ErrorTest, LossNotScalar) {
  const auto y = remat::tanh(make(2, 3));
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { tape.backward(y); }, {"backward", "[2,3]", "[1,1]"});
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { tape.gradient(y, {y}); }, {"gradient", "[2,3]"});
  expect_failure_leaves_tape_usable<remat::shape_error>([&] { y.item(); }, {"item", "[2,3]"});
}

// ---- index and domain errors ----

TEST_F(ErrorTest, CrossEntropyLabelOutOfRange) {
  const auto logits = make(3, 4);
  expect_failure_leaves_tape_usable<remat::index_error>(
      [&] {
        remat::cross_entropy(logits, {0, 4, 1});
      },
      {"cross_entropy", "label 4", "row 1", "[0, 4)", "[3,4]"});
  expect_failure_leaves_tape_usable<remat::index_error>(
      [&] {
        remat::cross_entropy(logits, {0, 1, -1});
      },
      {"cross_entropy", "label -1", "row 2"});
}

TEST_F(ErrorTest, DropoutProbability) {
  const auto x = make(2, 2);
  for (double p : {-0.1, 1.0, 1.5, std::numeric_limits<double>::quiet_NaN()})
    expect_failure_leaves_tape_usable<remat::domain_error>([&] { remat::dropout(x, p); }, {"dropout", "p"});
}

TEST_F(ErrorTest, DropoutFailureDoesNotAdvanceTheGenerator) {
  const Matrix<double> ones = Matrix<double>::Ones(4, 4);
  Tape<double> other(99);
  const auto reference = remat::dropout(other.constant(ones), 0.5);
  Tape<double> t(99);
  const auto x = t.constant(ones);
  EXPECT_THROW(remat::dropout(x, 1.0), remat::domain_error);
  EXPECT_EQ(Matrix<double>(remat::dropout(x, 0.5).value()), Matrix<double>(reference.value()));
}

TEST_F(ErrorTest, LayerNormEps) {
  const auto x = make(2, 3), g = make(1, 3), b = make(1, 3);
  for (double eps : {0.0, -1e-5, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
    expect_failure_leaves_tape_usable<remat::domain_error>([&] { remat::layer_norm(x, g, b, eps); },
                                                           {"layer_norm", "eps"});
}

TEST_F(ErrorTest, ScalarArguments) {
  const auto x = make(2, 3);
  const double inf = std::numeric_limits<double>::infinity();
  expect_failure_leaves_tape_usable<remat::domain_error>([&] { remat::pow(x, inf); }, {"pow", "exponent"});
  expect_failure_leaves_tape_usable<remat::domain_error>([&] { remat::affine(x, inf, 0.0); }, {"affine"});
  expect_failure_leaves_tape_usable<remat::domain_error>([&] { (void)(x / 0.0); }, {"divide", "0"});
  expect_failure_leaves_tape_usable<remat::domain_error>([&] { (void)(x / 0); }, {"divide", "0"});
  expect_failure_leaves_tape_usable<remat::domain_error>([&] { (void)(inf / x); }, {"scalar_divide"});
  expect_failure_leaves_tape_usable<remat::domain_error>([&] { remat::checkpoint_name(x, ""); },
                                                         {"checkpoint_name", "name"});
}

// ---- misuse of Vars and tapes ----

TEST_F(ErrorTest, VarFromAnotherTape) {
  Tape<double> other;
  const auto a = make(2, 2);
  const auto b = other.variable(Matrix<double>::Ones(2, 2));
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { remat::matmul(a, b); }, {"matmul", "different tapes"});
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { (void)(a + b); }, {"add", "different tapes"});
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { remat::layer_norm(a, a, b); }, {"layer_norm"});
  const auto other_loss = remat::sum(b);
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { tape.backward(other_loss); },
                                                       {"backward", "another tape"});
  const auto loss = remat::sum(a);
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { tape.gradient(loss, {b}, true); },
                                                       {"gradient", "another tape"});
}

TEST_F(ErrorTest, VarFromAClearedTape) {
  Tape<double> t;
  const auto old = t.variable(Matrix<double>::Ones(2, 2));
  const auto old_loss = remat::sum(old);
  t.clear();
  EXPECT_FALSE(old.valid());
  expect_throw<remat::tape_error>([&] { remat::tanh(old); }, {"tanh", "cleared"});
  expect_throw<remat::tape_error>([&] { old.value(); }, {"value", "cleared"});
  expect_throw<remat::tape_error>([&] { old.grad(); }, {"grad", "cleared"});
  expect_throw<remat::tape_error>([&] { t.backward(old_loss); }, {"backward", "cleared"});
  EXPECT_EQ(t.size(), 0u);
  expect_usable(t);
}

TEST_F(ErrorTest, EmptyVar) {
  const Var<double> empty;
  const auto x = make(2, 2);
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { remat::exp(empty); }, {"exp", "empty Var"});
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { remat::matmul(x, empty); }, {"matmul", "empty Var"});
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { tape.backward(empty); }, {"backward", "empty Var"});
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { empty.value(); }, {"value", "empty Var"});
  Var<double> moved = make(1, 1);
  const Var<double> target = std::move(moved);
  expect_failure_leaves_tape_usable<remat::tape_error>([&] { remat::neg(moved); },  // NOLINT(bugprone-use-after-move)
                                                       {"neg", "empty Var"});
}

TEST_F(ErrorTest, GradOfAConstantOrInteriorValue) {
  const auto c = tape.constant(Matrix<double>::Ones(2, 2));
  const auto w = make(2, 2);
  const auto h = remat::tanh(remat::matmul(c, w));
  tape.backward(remat::sum(h), true);
  expect_throw<remat::tape_error>([&] { c.grad(); }, {"grad", "no gradient"});
  expect_throw<remat::tape_error>([&] { h.grad(); }, {"grad", "no gradient"});
}

TEST(Errors, SecondBackwardAfterAFreeingOne) {
  Tape<double> tape;
  const auto x = tape.variable(remat_test::random_matrix(3, 2, 1));
  const auto w = tape.variable(remat_test::random_matrix(2, 2, 2));
  const auto loss = remat::sum(remat::tanh(remat::matmul(x, w)));
  tape.backward(loss);
  const Matrix<double> first = w.grad();
  const std::size_t size = tape.size();
  // The two fixes: retain_graph for another backward over the same graph, clear() for a new one.
  expect_throw<remat::freed_value_error>([&] { tape.backward(loss); },
                                         {"backward", "freed", "node #", "retain_graph = true", "clear()"});
  expect_throw<remat::freed_value_error>([&] { tape.gradient(loss, {w}); },
                                         {"gradient", "freed", "retain_graph = true", "clear()"});
  EXPECT_EQ(tape.size(), size);
  EXPECT_EQ(Matrix<double>(w.grad()), first) << "the failed backward changed the gradients";
  // A freed_value_error is a tape_error.
  EXPECT_THROW(tape.backward(loss), remat::tape_error);
  tape.clear();
  expect_usable(tape);
}

// The next step recorded on the same tape without clear(): recording works (a program may compute metrics
// after its backward), but its backward is refused, and the message must say that clear() was missing, not
// to "record the forward pass again", which is what the user just did.
TEST(Errors, BackwardOfAStepRecordedWithoutClear) {
  Tape<double> tape;
  const auto x = tape.variable(remat_test::random_matrix(3, 2, 1));
  const auto w = tape.variable(remat_test::random_matrix(2, 2, 2));
  tape.backward(remat::sum(remat::tanh(remat::matmul(x, w))));
  const Matrix<double> first = w.grad();
  const auto next = remat::sum(remat::square(remat::matmul(x, w)));  // the next step, no clear() before it
  const std::size_t size = tape.size();
  const std::string loss_node = "node #" + std::to_string(remat::detail::VarAccess::id(next));
  expect_throw<remat::freed_value_error>(
      [&] { tape.backward(next); },
      {"backward", loss_node, "recorded after", "without clear()", "clear()", "retain_graph = true"});
  expect_throw<remat::freed_value_error>([&] { tape.gradient(next, {w}); },
                                         {"gradient", loss_node, "recorded after", "clear()"});
  EXPECT_EQ(tape.size(), size);
  EXPECT_EQ(Matrix<double>(w.grad()), first) << "the refused backward changed the gradients";
  tape.clear();
  expect_usable(tape);
}

TEST(Errors, StaleParameter) {
  Tape<double> tape;
  remat::Parameter<double> p(remat_test::random_matrix(2, 2, 4));
  const auto x = tape.variable(remat_test::random_matrix(3, 2, 5));  // dx = g·Wᵀ reads the Parameter
  const auto w = tape.variable(p);
  const auto loss = remat::sum(remat::tanh(remat::matmul(x, w)));
  p.mutable_value()(0, 0) += 1;
  const std::size_t size = tape.size();
  expect_throw<remat::stale_value_error>([&] { tape.backward(loss); }, {"backward", "Parameter", "[2,2]", "modified"});
  EXPECT_EQ(tape.size(), size);
  EXPECT_THROW(tape.backward(loss), remat::tape_error) << "stale_value_error is a tape_error";
  // Re-recording after the update works.
  tape.clear();
  const auto x2 = tape.constant(remat_test::random_matrix(3, 2, 5));
  const auto w2 = tape.variable(p);
  tape.backward(remat::sum(remat::tanh(remat::matmul(x2, w2))));
  EXPECT_TRUE(std::isfinite(w2.grad()(0, 0)));
}

TEST(Errors, ExceptionTypesDeriveFromTheStandardOnes) {
  EXPECT_TRUE((std::is_base_of_v<std::invalid_argument, remat::shape_error>));
  EXPECT_TRUE((std::is_base_of_v<std::out_of_range, remat::index_error>));
  EXPECT_TRUE((std::is_base_of_v<std::domain_error, remat::domain_error>));
  EXPECT_TRUE((std::is_base_of_v<std::logic_error, remat::tape_error>));
  EXPECT_TRUE((std::is_base_of_v<remat::tape_error, remat::freed_value_error>));
  EXPECT_TRUE((std::is_base_of_v<remat::tape_error, remat::stale_value_error>));
}

}  // namespace errors_test