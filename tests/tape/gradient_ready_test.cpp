// Tape::on_gradient_ready: called exactly once per backward for each Parameter a gradient reached, when its
// gradient is final (shared parameters, checkpointed and nested regions under every policy, accumulation
// over two backward passes), never for an unused one nor by gradient(); a throwing callback; a callback
// that uses the tape; a callback that changes a value the sweep still reads, or its own Parameter's.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "random.hpp"
#include "remat/nn/sgd.hpp"
#include "remat/remat.hpp"

namespace gradient_ready_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using Policy = std::function<bool(const remat::OpInfo&)>;

/// x [6,4] → tanh(linear(x, W1, b1)) → region(policy){ region(policy){ gelu(h·W2) } → tanh(·W2) } → linear(·,
/// W3, b3) → cross_entropy. W2 is shared: recorded once outside the regions and once more inside the outer
/// one. U is recorded and used by no op; D's product leads nowhere near the loss.
struct Model {
  Parameter<float> W1{remat_test::random_matrix<float>(4, 5, 1)}, b1{remat_test::random_matrix<float>(1, 5, 2)},
      W2{remat_test::random_matrix<float>(5, 5, 3)}, W3{remat_test::random_matrix<float>(5, 3, 4)},
      b3{remat_test::random_matrix<float>(1, 3, 5)}, U{remat_test::random_matrix<float>(2, 2, 6)},
      D{remat_test::random_matrix<float>(5, 2, 7)};
  Matrix<float> x = remat_test::random_matrix<float>(6, 4, 8);
  std::vector<int> labels{0, 1, 2, 0, 1, 2};

  std::vector<std::pair<std::string, Parameter<float>*>> named() {
    return {{"W1", &W1}, {"b1", &b1}, {"W2", &W2}, {"W3", &W3}, {"b3", &b3}, {"U", &U}, {"D", &D}};
  }
  std::string name_of(const Parameter<float>& p) {
    for (auto& [name, mine] : named())
      if (&p.value() == &mine->value()) return name;
    return "?";
  }

  /// Records the model; `policy` null: no checkpoint.
  Var<float> loss(Tape<float>& tape, const Policy* policy) {
    Var<float> w1 = tape.variable(W1), c1 = tape.variable(b1), w2 = tape.variable(W2);
    Var<float> w3 = tape.variable(W3), c3 = tape.variable(b3), d = tape.variable(D);
    tape.variable(U);
    Var<float> h = remat::tanh(remat::linear(tape.constant(x), w1, c1));
    Var<float> dead = remat::matmul(h, d);  // reaches no loss
    (void)dead;
    auto inner = [&](Var<float> v) { return remat::gelu(remat::matmul(v, w2)); };
    auto outer = [&](Var<float> v) {
      Var<float> g = policy ? remat::checkpoint(inner, *policy)(v) : inner(v);
      return remat::tanh(remat::matmul(g, tape.variable(W2)));  // W2's second leaf, inside the region
    };
    Var<float> g2 = policy ? remat::checkpoint(outer, *policy)(h) : outer(h);
    return remat::cross_entropy(remat::linear(g2, w3, c3), labels);
  }
};

/// Per parameter name: how many calls, and the gradient each call saw.
struct Log {
  std::map<std::string, int> calls;
  std::map<std::string, Matrix<float>> seen;
  std::vector<std::string> order;
};

std::size_t attach(Tape<float>& tape, Model& m, Log& log) {
  return tape.on_gradient_ready([&m, &log](Parameter<float>& p) {
    const std::string name = m.name_of(p);
    ++log.calls[name];
    log.seen[name] = p.grad();
    log.order.push_back(name);
  });
}

std::vector<std::pair<std::string, Policy>> policies() {
  using namespace remat::policies;
  return {{"nothing_saveable", nothing_saveable},
          {"everything_saveable", everything_saveable},
          {"dots_saveable", dots_saveable},
          {"dots_with_no_batch_dims_saveable", dots_with_no_batch_dims_saveable},
          {"save_only_these_names", save_only_these_names({"none"})},
          {"lambda", [](const remat::OpInfo& op) { return op.kind == remat::OpKind::elementwise; }}};
}

/// Each used parameter once, with its final gradient; the unused and dead ones never.
void expect_once_with_final_gradients(Model& m, const Log& log) {
  for (auto& [name, p] : m.named()) {
    SCOPED_TRACE(name);
    if (name == "U" || name == "D") {
      EXPECT_EQ(log.calls.count(name), 0u);
      continue;
    }
    ASSERT_EQ(log.calls.count(name), 1u);
    EXPECT_EQ(log.calls.at(name), 1);
    const Matrix<float> final_grad = p->grad();
    EXPECT_TRUE(log.seen.at(name) == final_grad) << "the callback saw a partial gradient";
  }
}

TEST(GradientReady, OncePerParameterWithItsFinalGradientUnderEveryPolicyAndNesting) {
  Model reference_model;
  {
    Tape<float> tape;
    tape.backward(reference_model.loss(tape, nullptr));
  }
  {
    Model m;
    Log log;
    Tape<float> tape;
    attach(tape, m, log);
    tape.backward(m.loss(tape, nullptr));
    expect_once_with_final_gradients(m, log);
    // As each gradient becomes final: when the backward of the Parameter's first consumer has run (the
    // reverse order of those ops; within one op, its inputs' order): linear(g2, W3, b3), then W2's first
    // consumer (the inner matmul; its second leaf's consumer, the outer matmul, came before), then
    // linear(x, W1, b1). All leaves were recorded before the ops: delivered at their leaves, the order was
    // b3, W3, W2, b1, W1.
    EXPECT_EQ(log.order, (std::vector<std::string>{"W3", "b3", "W2", "W1", "b1"}));
  }
  for (const auto& [label, policy] : policies()) {
    SCOPED_TRACE(label);
    Model m;
    Log log;
    Tape<float> tape;
    attach(tape, m, log);
    tape.backward(m.loss(tape, &policy));
    expect_once_with_final_gradients(m, log);
    EXPECT_TRUE(m.W2.grad() == reference_model.W2.grad());  // checkpointing changes no bit
    EXPECT_TRUE(m.W1.grad() == reference_model.W1.grad());
  }
}

TEST(GradientReady, AccumulationOverTwoBackwardPassesReportsTheSumOnEachPass) {
  Model m;
  Log log;
  Tape<float> tape;
  attach(tape, m, log);
  const Policy policy = remat::policies::nothing_saveable;
  tape.backward(m.loss(tape, &policy));
  const Matrix<float> first = m.W2.grad();
  tape.clear();
  tape.backward(m.loss(tape, &policy));  // no zero_grad: accumulates
  EXPECT_EQ(log.calls.at("W2"), 2);
  EXPECT_TRUE(log.seen.at("W2") == m.W2.grad());
  EXPECT_TRUE(m.W2.grad().isApprox(2 * first));
  // retain_graph: a second backward of the same recording calls again.
  tape.clear();
  Var<float> loss = m.loss(tape, &policy);
  tape.backward(loss, true);
  tape.backward(loss);
  EXPECT_EQ(log.calls.at("W2"), 4);
  EXPECT_TRUE(log.seen.at("W2") == m.W2.grad());
}

TEST(GradientReady, NotCalledByGradientNorAfterRemoval) {
  Model m;
  Log log;
  Tape<float> tape;
  const std::size_t key = attach(tape, m, log);
  Var<float> loss = m.loss(tape, nullptr);
  Var<float> w = tape.variable(m.W3);
  tape.gradient(loss, {w}, true);
  EXPECT_TRUE(log.calls.empty());
  EXPECT_TRUE(tape.remove_gradient_ready(key));
  EXPECT_FALSE(tape.remove_gradient_ready(key));
  tape.backward(loss);
  EXPECT_TRUE(log.calls.empty());
  EXPECT_THROW(tape.on_gradient_ready(nullptr), std::invalid_argument);
}

TEST(GradientReady, AThrowingCallbackLetsTheSweepCompleteAndBackwardRethrows) {
  Model reference;
  {
    Tape<float> tape;
    tape.backward(reference.loss(tape, nullptr));
  }
  Model m;
  Tape<float> tape;
  int calls = 0;
  tape.on_gradient_ready([&](Parameter<float>&) {
    if (++calls == 2) throw std::runtime_error("callback failed");
  });
  const Policy policy = remat::policies::dots_saveable;
  EXPECT_THROW(tape.backward(m.loss(tape, &policy)), std::runtime_error);
  EXPECT_EQ(calls, 2);  // no callback after the one that threw
  for (auto& [name, p] : m.named()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(p->has_grad(), name != "U" && name != "D");
  }
  EXPECT_TRUE(m.W2.grad() == reference.W2.grad());
  EXPECT_TRUE(m.W1.grad() == reference.W1.grad());
  EXPECT_EQ(tape.memory().saved_bytes, 0u);  // the residuals were freed as usual
  tape.clear();                              // and the tape is usable again
  calls = 10;
  tape.backward(m.loss(tape, nullptr));
  EXPECT_EQ(calls, 15);
}

TEST(GradientReady, ACallbackMustNotUseTheTape) {
  Model m;
  Tape<float> tape;
  tape.on_gradient_ready([&](Parameter<float>& p) { tape.variable(p); });
  remat_test::expect_error_naming<remat::tape_error>([&] { tape.backward(m.loss(tape, nullptr)); },
                                                     {"variable", "gradient-ready callback"});
  tape.clear();
}

// loss = Σ (b ⊙ d) ⊙ a with b, d recorded before a: the sweep reaches a's leaf, and calls a's callback, before
// the backward of b ⊙ d, which reads b and d (and, checkpointed, before its replay, which reads them too). A
// callback for a that changes b used to hand that backward a freed buffer (a resize or an assignment of
// another shape: undefined behaviour) or the changed values (an in-place write, an optimizer step: a silent
// wrong gradient). Every way to change b there now throws tape_error and changes nothing; the sweep completes
// with the recorded values' gradients (closed forms: ∂/∂a = b ⊙ d, ∂/∂b = a ⊙ d, ∂/∂d = a ⊙ b), and
// backward() rethrows. The callback may change a itself: the sweep no longer reads it.
struct Product {
  Parameter<double> a{Matrix<double>{{0.5, -1.0}, {2.0, 3.0}}}, b{Matrix<double>{{1.0, 2.0}, {3.0, 4.0}}},
      d{Matrix<double>{{5.0, 6.0}, {7.0, 8.0}}};
  Matrix<double> a0 = a.value(), b0 = b.value(), d0 = d.value();

  Var<double> loss(Tape<double>& tape, bool checkpointed) {
    Var<double> vb = tape.variable(b), vd = tape.variable(d);
    auto product = [](Var<double> x, Var<double> y) { return x * y; };
    Var<double> w =
        checkpointed ? remat::checkpoint(product, remat::policies::nothing_saveable)(vb, vd) : product(vb, vd);
    return remat::sum(w * tape.variable(a));
  }
  void expect_recorded_gradients() const {
    EXPECT_EQ(a.grad(), Matrix<double>(b0.cwiseProduct(d0)));
    EXPECT_EQ(b.grad(), Matrix<double>(a0.cwiseProduct(d0)));
    EXPECT_EQ(d.grad(), Matrix<double>(a0.cwiseProduct(b0)));
  }
};

TEST(GradientReady, ChangingAValueTheSweepStillReadsThrowsAndChangesNothing) {
  using Change = std::function<void(Product&)>;
  const std::vector<std::tuple<std::string, std::string, Change>> changes = {
      {"resize", "Parameter::mutable_value", [](Product& m) { m.b.mutable_value().resize(3, 7); }},
      {"write in place", "Parameter::mutable_value", [](Product& m) { m.b.mutable_value()(0, 0) = 100.0; }},
      {"assign another shape", "Parameter: assignment",
       [](Product& m) {
         const Parameter<double> other(Matrix<double>::Constant(1, 1, 9.0));
         m.b = other;
       }},
      {"assign the same shape", "Parameter: assignment",
       [](Product& m) {
         const Parameter<double> other(Matrix<double>::Constant(2, 2, 9.0));
         m.b = other;
       }},
      {"move-assign into it", "Parameter: move assignment",
       [](Product& m) {
         Parameter<double> other(Matrix<double>::Constant(2, 2, 9.0));
         m.b = std::move(other);
       }},
      {"move-assign out of it", "moved-from",
       [](Product& m) {
         Parameter<double> other;
         other = std::move(m.b);
       }},
      {"optimizer step", "nn::SGD::step: parameter 0",
       [](Product& m) {
         remat::nn::SGD<double> sgd({&m.b}, {0.1});
         m.b.mutable_grad();  // defined (zeros): step() would update b
         sgd.step();
       }},
  };
  for (const bool checkpointed : {false, true})
    for (const auto& [what, op, change] : changes) {
      SCOPED_TRACE(what + (checkpointed ? ", checkpointed" : ""));
      Product m;
      Tape<double> tape;
      Var<double> loss = m.loss(tape, checkpointed);
      bool called = false;
      tape.on_gradient_ready([&, change = change](Parameter<double>& p) {
        if (&p.value() != &m.a.value()) return;
        called = true;
        change(m);
      });
      remat_test::expect_error_naming<remat::tape_error>([&] { tape.backward(loss); }, {op, "still reads"});
      EXPECT_TRUE(called);
      EXPECT_EQ(m.b.value(), m.b0) << "b changed";
      m.expect_recorded_gradients();    // the optimizer case: added to the zeros mutable_grad() defined
      m.b.mutable_value()(0, 0) = 1.5;  // backward() has returned: nothing holds b
      EXPECT_EQ(m.b.value()(0, 0), 1.5);
    }
}

TEST(GradientReady, ACallbackMayChangeItsOwnParameter) {
  for (const bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "checkpointed" : "plain");
    Product m;
    Tape<double> tape;
    Var<double> loss = m.loss(tape, checkpointed);
    remat::nn::SGD<double> sgd({&m.a}, {0.25});
    int steps = 0;
    tape.on_gradient_ready([&](Parameter<double>& p) {
      if (&p.value() != &m.a.value()) return;
      sgd.step();  // an optimizer step inside backward: a = a0 − ¼ b ⊙ d
      ++steps;
    });
    tape.backward(loss);
    EXPECT_EQ(steps, 1);
    m.expect_recorded_gradients();
    EXPECT_EQ(m.a.value(), Matrix<double>(m.a0 - 0.25 * m.b0.cwiseProduct(m.d0)));
    EXPECT_EQ(m.b.value(), m.b0);
  }
}

}  // namespace gradient_ready_test
