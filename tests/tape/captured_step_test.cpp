// CapturedStep: a step recorded once and replayed. The oracle is the plain path: the same step recorded on a
// fresh Tape and swept by backward(), with Parameters holding the same values; every replay must give its loss
// and gradients bitwise, over several training steps whose Parameters, inputs and labels change. Each case is
// built so that the mechanism it tests changes the answer (checkpoint replays and budget regenerations do run,
// inputs and labels do change), and the errors leave the Parameters as they were.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

#include "expect_error.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace captured_step_test {

using remat::CapturedStep;
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

template <class T>
bool bitwise_equal(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(T)) == 0;
}

/// An MLP of `layers` tanh layers on [rows, width] inputs, its parameters, and how each step's data is made.
template <class T>
struct Mlp {
  int layers, rows, width, classes;
  std::vector<Parameter<T>> weights, biases;
  Mlp(int layers_, int rows_, int width_, int classes_, std::uint64_t seed)
      : layers(layers_), rows(rows_), width(width_), classes(classes_) {
    for (int l = 0; l <= layers; ++l) {
      const int out = l == layers ? classes : width;
      weights.emplace_back(remat_test::random_matrix<T>(width, out, seed + 2 * l) * T(0.4));
      biases.emplace_back(remat_test::random_matrix<T>(1, out, seed + 2 * l + 1) * T(0.1));
    }
  }
  Matrix<T> batch(int step) const { return remat_test::random_matrix<T>(rows, width, 1000 + step); }
  std::vector<int> labels(int step) const {
    std::vector<int> y;
    for (int i = 0; i < rows; ++i) y.push_back((i * 7 + step * 3) % classes);
    return y;
  }
  /// How a layer is wrapped: identity, or checkpointed with a policy.
  using Wrap = std::function<Var<T>(std::function<Var<T>(Var<T>)>, Var<T>)>;
  /// Records the step on `tape`; `x` receives the input leaf.
  Var<T> record(Tape<T>& tape, const Matrix<T>& data, const std::vector<int>& y, Var<T>& x, const Wrap& wrap) {
    x = tape.constant(data);
    Var<T> h = x;
    for (int l = 0; l < layers; ++l) {
      const Var<T> w = tape.variable(weights[static_cast<std::size_t>(l)]);
      const Var<T> b = tape.variable(biases[static_cast<std::size_t>(l)]);
      auto layer = [w, b](Var<T> in) { return remat::tanh(remat::linear(in, w, b)); };
      h = wrap ? wrap(layer, h) : layer(h);
    }
    const Var<T> w = tape.variable(weights.back()), b = tape.variable(biases.back());
    return remat::cross_entropy(remat::linear(h, w, b), y);
  }
  /// One SGD update in place (mutable_value keeps the storage), then zero_grad.
  void update() {
    for (auto* group : {&weights, &biases})
      for (Parameter<T>& p : *group) {
        p.mutable_value() -= T(0.1) * Matrix<T>(p.grad());
        p.zero_grad();
      }
  }
};

template <class T>
void expect_same_gradients(const Mlp<T>& a, const Mlp<T>& b, int step) {
  for (std::size_t l = 0; l < a.weights.size(); ++l) {
    EXPECT_TRUE(bitwise_equal<T>(Matrix<T>(a.weights[l].grad()), Matrix<T>(b.weights[l].grad())))
        << "step " << step << " weight " << l;
    EXPECT_TRUE(bitwise_equal<T>(Matrix<T>(a.biases[l].grad()), Matrix<T>(b.biases[l].grad())))
        << "step " << step << " bias " << l;
    EXPECT_TRUE(bitwise_equal<T>(a.weights[l].value(), b.weights[l].value())) << "step " << step << " value " << l;
  }
}

/// Trains `steps` steps twice from the same parameters: on a fresh Tape each step (the oracle), and by one
/// CapturedStep replayed with each step's batch and labels. Returns the capture's MemoryStats.
template <class T>
remat::MemoryStats train_both(int layers, const typename Mlp<T>::Wrap& wrap, std::size_t budget = 0, int steps = 4) {
  Mlp<T> plain(layers, 8, 6, 4, 7), captured(layers, 8, 6, 4, 7);
  Var<T> x;
  std::vector<int> first_labels = captured.labels(0);
  CapturedStep<T> step([&](Tape<T>& tape) {
    if (budget) tape.set_memory_budget(budget);
    return captured.record(tape, captured.batch(0), first_labels, x, wrap);
  });
  for (int s = 0; s < steps; ++s) {
    Tape<T> tape;
    if (budget) tape.set_memory_budget(budget);
    Var<T> unused;
    const Var<T> loss = plain.record(tape, plain.batch(s), plain.labels(s), unused, wrap);
    tape.backward(loss);
    T replayed = step.last_loss();
    if (s > 0) {
      step.set_input(x, captured.batch(s));
      step.set_indices(step.loss(), captured.labels(s));
      replayed = step.replay();
    }
    const T expected = loss.item();
    EXPECT_EQ(std::memcmp(&replayed, &expected, sizeof(T)), 0)
        << "step " << s << ": " << replayed << " vs " << expected;
    expect_same_gradients(plain, captured, s);
    plain.update();
    captured.update();
  }
  return step.memory();
}

template <class T>
class CapturedStepTest : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(CapturedStepTest, Scalars);

TYPED_TEST(CapturedStepTest, ReplaysAreBitwiseTheRecordedSteps) {
  train_both<TypeParam>(5, nullptr);
}

TYPED_TEST(CapturedStepTest, CheckpointReplaysRunInsideTheCapturedStepForEveryPolicy) {
  using T = TypeParam;
  using Wrap = typename Mlp<T>::Wrap;
  const std::vector<std::pair<const char*, Wrap>> wraps = {
      {"nothing_saveable", [](auto f, Var<T> h) { return remat::checkpoint(f, remat::policies::nothing_saveable)(h); }},
      {"dots_saveable", [](auto f, Var<T> h) { return remat::checkpoint(f, remat::policies::dots_saveable)(h); }},
      {"everything_saveable",
       [](auto f, Var<T> h) { return remat::checkpoint(f, remat::policies::everything_saveable)(h); }},
      {"two layers per region, nothing_saveable",
       [](auto f, Var<T> h) {
         return remat::checkpoint([f](Var<T> v) { return f(f(v)); }, remat::policies::nothing_saveable)(h);
       }},
      {"two layers per region, dots_saveable",
       [](auto f, Var<T> h) {
         return remat::checkpoint([f](Var<T> v) { return f(f(v)); }, remat::policies::dots_saveable)(h);
       }},
  };
  for (const auto& [name, wrap] : wraps) {
    SCOPED_TRACE(name);
    const remat::MemoryStats m = train_both<T>(4, wrap);
    // Every region but everything_saveable's drops a tanh output its backward reads (the inner one of two
    // layers, and the returned one, which only its own backward reads: JAX's rule): the captured backward
    // replays it, so every replay() reruns those kernels.
    if (std::string(name).find("everything_saveable") == std::string::npos) {
      EXPECT_GT(m.replayed_ops, 0u);
    } else {
      EXPECT_EQ(m.replayed_ops, 0u);
    }
  }
}

TYPED_TEST(CapturedStepTest, MemoryBudgetRegenerationsAreReplayed) {
  using T = TypeParam;
  // Unbudgeted peak, then a budget below it that forces evictions.
  Mlp<T> probe(6, 8, 6, 4, 7);
  Tape<T> tape;
  Var<T> x;
  const Var<T> loss = probe.record(tape, probe.batch(0), probe.labels(0), x, nullptr);
  tape.backward(loss);
  const std::size_t peak = tape.memory().peak_bytes;
  const remat::MemoryStats m = train_both<T>(6, nullptr, peak * 3 / 4);
  EXPECT_GT(m.evictions, 0u);
  EXPECT_LE(m.peak_bytes, peak * 3 / 4);
}

TYPED_TEST(CapturedStepTest, GradientsAccumulateWithoutZeroGradAsBackwardDoes) {
  using T = TypeParam;
  Mlp<T> plain(3, 8, 6, 4, 11), captured(3, 8, 6, 4, 11);
  Var<T> x;
  const std::vector<int> y = captured.labels(0);
  CapturedStep<T> step([&](Tape<T>& tape) { return captured.record(tape, captured.batch(0), y, x, nullptr); });
  step.replay();
  step.replay();
  for (int k = 0; k < 3; ++k) {
    Tape<T> tape;
    Var<T> unused;
    tape.backward(plain.record(tape, plain.batch(0), y, unused, nullptr));
  }
  expect_same_gradients(plain, captured, 0);
}

TYPED_TEST(CapturedStepTest, TransformerBlockWithEmbeddingIdsAndLayerNorm) {
  using T = TypeParam;
  const remat::Index seq = 6, hidden = 8, heads = 2, vocab = 11;
  auto make = [&](std::uint64_t seed) {
    std::vector<Parameter<T>> p;
    p.emplace_back(remat_test::random_matrix<T>(vocab, hidden, seed));       // embedding
    p.emplace_back(Matrix<T>::Ones(1, hidden));                              // layer_norm gain
    p.emplace_back(Matrix<T>::Zero(1, hidden));                              // layer_norm bias
    p.emplace_back(remat_test::random_matrix<T>(hidden, hidden, seed + 1));  // q
    p.emplace_back(remat_test::random_matrix<T>(hidden, hidden, seed + 2));  // k
    p.emplace_back(remat_test::random_matrix<T>(hidden, hidden, seed + 3));  // v
    p.emplace_back(remat_test::random_matrix<T>(hidden, vocab, seed + 4));   // head
    return p;
  };
  std::vector<Parameter<T>> plain = make(5), captured = make(5);
  auto tokens = [&](int s) {
    std::vector<int> t;
    for (int i = 0; i < seq; ++i) t.push_back((i * 5 + s * 2 + 1) % vocab);
    return t;
  };
  auto targets = [&](int s) {
    std::vector<int> t;
    for (int i = 0; i < seq; ++i) t.push_back((i * 3 + s) % vocab);
    return t;
  };
  Var<T> embedded;
  auto record = [&](Tape<T>& tape, std::vector<Parameter<T>>& p, const std::vector<int>& ids, const std::vector<int>& y,
                    Var<T>& embedding_out) {
    std::vector<Var<T>> v;
    for (auto& q : p) v.push_back(tape.variable(q));
    embedding_out = remat::embedding(v[0], ids);
    const Var<T> h = remat::layer_norm(embedding_out, v[1], v[2]);
    auto attention = remat::checkpoint(
        [&](Var<T> n) {
          return remat::scaled_dot_product_attention(remat::matmul(n, v[3]), remat::matmul(n, v[4]),
                                                     remat::matmul(n, v[5]), heads, seq, true);
        },
        remat::policies::dots_saveable);
    return remat::cross_entropy(remat::matmul(h + attention(h), v[6]), y);
  };
  const std::vector<int> first_ids = tokens(0), first_targets = targets(0);
  CapturedStep<T> step([&](Tape<T>& tape) { return record(tape, captured, first_ids, first_targets, embedded); });
  for (int s = 0; s < 3; ++s) {
    Tape<T> tape;
    Var<T> unused;
    const Var<T> loss = record(tape, plain, tokens(s), targets(s), unused);
    tape.backward(loss);
    if (s > 0) {
      step.set_indices(embedded, tokens(s));
      step.set_indices(step.loss(), targets(s));
      step.replay();
    }
    const T expected = loss.item(), got = step.last_loss();
    EXPECT_EQ(std::memcmp(&got, &expected, sizeof(T)), 0) << "step " << s;
    for (std::size_t k = 0; k < plain.size(); ++k) {
      EXPECT_TRUE(bitwise_equal<T>(Matrix<T>(plain[k].grad()), Matrix<T>(captured[k].grad())))
          << "step " << s << " parameter " << k;
      plain[k].mutable_value() -= T(0.05) * Matrix<T>(plain[k].grad());
      captured[k].mutable_value() -= T(0.05) * Matrix<T>(captured[k].grad());
      plain[k].zero_grad();
      captured[k].zero_grad();
    }
  }
}

TYPED_TEST(CapturedStepTest, TapeVariablesHoldTheLastRunsGradient) {
  using T = TypeParam;
  Parameter<T> w(remat_test::random_matrix<T>(4, 3, 3));
  Var<T> x;
  CapturedStep<T> step([&](Tape<T>& tape) {
    x = tape.variable(remat_test::random_matrix<T>(5, 4, 1));
    return remat::sum(remat::square(remat::matmul(x, tape.variable(w))));
  });
  const Matrix<T> next = remat_test::random_matrix<T>(5, 4, 2);
  step.set_input(x, next);
  step.replay();
  Tape<T> tape;
  Parameter<T> w_copy(w.value());
  const Var<T> xv = tape.variable(next);
  tape.backward(remat::sum(remat::square(remat::matmul(xv, tape.variable(w_copy)))));
  EXPECT_TRUE(bitwise_equal<T>(Matrix<T>(x.grad()), Matrix<T>(xv.grad())));
}

TEST(CapturedStepErrors, WhatCannotBeCapturedIsRefused) {
  Parameter<float> w(remat_test::random_matrix<float>(4, 4, 1));
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        CapturedStep<float> step([&](Tape<float>& tape) { return remat::sum(remat::dropout(tape.variable(w), 0.5)); });
      },
      {"dropout", "CapturedStep", "evaluation mode"});
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        CapturedStep<float> step([&](Tape<float>& tape) {
          const Var<float> loss = remat::sum(tape.variable(w));
          tape.backward(loss);
          return loss;
        });
      },
      {"backward", "CapturedStep"});
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        CapturedStep<float> step([&](Tape<float>& tape) {
          tape.on_gradient_ready([](remat::Parameter<float>&) {});
          return remat::sum(tape.variable(w));
        });
      },
      {"on_gradient_ready", "CapturedStep"});
  // Evaluation mode: dropout records nothing, and the step captures.
  CapturedStep<float> eval([&](Tape<float>& tape) {
    tape.set_training(false);
    return remat::sum(remat::dropout(tape.variable(w), 0.5));
  });
  EXPECT_FLOAT_EQ(eval.replay(), w.value().sum());
}

/// An op whose forward throws (a user's op that breaks the recipe).
struct ThrowingOp : remat::OpBase {
  static constexpr const char* name = "throwing";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static remat::Shape output_shape(const remat::Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>&) {
    throw std::runtime_error("throwing: refused");
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>&) {}
  static double flops(const remat::Shape*, int, const remat::Shape& out) { return static_cast<double>(out.size()); }
};

TEST(CapturedStepErrors, ReadingValuesAndFreeingBuffersInsideTheFunctionAreRefused) {
  Parameter<float> w(remat_test::random_matrix<float>(4, 4, 1));
  const Matrix<float> grad_before = w.grad();
  // A step that read its own numbers would replay the first step's decisions.
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        CapturedStep<float> step([&](Tape<float>& tape) {
          const Var<float> h = remat::tanh(tape.variable(w));
          const float scale = h.item();  // [4,4]: would throw shape_error on a Tape; refused before
          return remat::sum(h) * tape.constant(Matrix<float>::Constant(1, 1, scale));
        });
      },
      {"item", "CapturedStep"});
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        CapturedStep<float> step([&](Tape<float>& tape) {
          const Var<float> h = remat::tanh(tape.variable(w));
          (void)remat::argmax_rows(h);
          return remat::sum(h);
        });
      },
      {"value", "CapturedStep"});
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        CapturedStep<float> step([&](Tape<float>& tape) {
          const Var<float> loss = remat::sum(remat::tanh(tape.variable(w)));
          tape.release_cached_memory();
          return loss;
        });
      },
      {"release_cached_memory", "CapturedStep"});
  // An op that throws, caught by the function, which goes on.
  remat_test::expect_error_naming<remat::tape_error>(
      [&] {
        CapturedStep<float> step([&](Tape<float>& tape) {
          const Var<float> x = tape.variable(w);
          try {
            (void)remat::apply_op<ThrowingOp>(x);
          } catch (const std::runtime_error&) {
          }
          return remat::sum(x);
        });
      },
      {"forward threw", "CapturedStep"});
  // None of them reached the backward.
  EXPECT_FALSE(w.has_grad());
  EXPECT_TRUE(bitwise_equal<float>(Matrix<float>(w.grad()), grad_before));
  // After the capture, a Tape& kept from the function changes nothing either.
  Tape<float>* kept = nullptr;
  CapturedStep<float> step([&](Tape<float>& tape) {
    kept = &tape;
    return remat::sum(remat::square(tape.variable(w)));
  });
  remat_test::expect_error_naming<remat::tape_error>([&] { kept->release_cached_memory(); },
                                                     {"release_cached_memory", "CapturedStep"});
  EXPECT_THROW(kept->clear(), remat::tape_error);
  EXPECT_THROW(kept->set_memory_budget(1024), remat::tape_error);
  EXPECT_THROW(kept->constant(Matrix<float>::Zero(2, 2)), remat::tape_error);
  w.zero_grad();
  EXPECT_EQ(step.replay(), step.last_loss());
}

TEST(CapturedStepErrors, AReplacedParameterIsRefusedWithNothingChanged) {
  Parameter<float> w(remat_test::random_matrix<float>(4, 3, 1));
  Var<float> leaked;
  CapturedStep<float> step([&](Tape<float>& tape) {
    leaked = tape.variable(w);
    return remat::sum(remat::square(leaked));
  });
  const Matrix<float> grad_before = w.grad();
  // Same shape, new storage (a move into the value): the step would read freed memory.
  w.mutable_value() = Matrix<float>(remat_test::random_matrix<float>(4, 3, 2));
  remat_test::expect_error_naming<remat::stale_value_error>([&] { step.replay(); }, {"CapturedStep::replay", "[4,3]"});
  EXPECT_TRUE(bitwise_equal<float>(Matrix<float>(w.grad()), grad_before));
  w.mutable_value().resize(2, 6);
  EXPECT_THROW(step.replay(), remat::stale_value_error);
  // The tape is fixed: recording on a Var of it throws.
  remat_test::expect_error_naming<remat::tape_error>([&] { remat::tanh(leaked); }, {"tanh", "CapturedStep"});
}

TEST(CapturedStep, VarsReleasedAfterTheCaptureStayReleased) {
  // A Var the function leaked holds its value through the capture; released afterwards, its buffer returns to
  // the tape's pool. The replays must leave it there (and the tape's shut-down frees it once: ASan checks).
  Parameter<float> w(remat_test::random_matrix<float>(4, 4, 1));
  Var<float> hidden;
  CapturedStep<float> step([&](Tape<float>& tape) {
    hidden = remat::tanh(remat::matmul(tape.constant(remat_test::random_matrix<float>(3, 4, 2)), tape.variable(w)));
    return remat::sum(remat::square(hidden));
  });
  const std::size_t live = step.memory().live_bytes;
  hidden = Var<float>();
  EXPECT_LT(step.memory().live_bytes, live);
  w.zero_grad();
  const float first = step.replay();
  w.zero_grad();
  EXPECT_EQ(step.replay(), first);
  EXPECT_LT(step.memory().live_bytes, live);
}

TEST(CapturedStep, ALeafLossReportsTheReplaysValue) {
  // A loss that is a leaf has no forward in the log: the replay's value is the leaf's.
  Parameter<float> w(Matrix<float>::Constant(1, 1, 2.0f));
  CapturedStep<float> parameter_loss([&](Tape<float>& tape) { return tape.variable(w); });
  w.mutable_value()(0, 0) = 5.0f;
  w.zero_grad();
  EXPECT_EQ(parameter_loss.replay(), 5.0f);
  EXPECT_EQ(parameter_loss.last_loss(), 5.0f);
  Var<float> c;
  CapturedStep<float> constant_loss([&](Tape<float>& tape) {
    c = tape.variable(Matrix<float>::Constant(1, 1, 3.0f));
    return c;
  });
  constant_loss.set_input(c, Matrix<float>::Constant(1, 1, 7.0f));
  EXPECT_EQ(constant_loss.replay(), 7.0f);
  EXPECT_EQ(Matrix<float>(c.grad())(0, 0), 1.0f);
}

TEST(CapturedStepErrors, BadInputsAndIndicesAreRefusedWithTheStepUnchanged) {
  Parameter<float> w(remat_test::random_matrix<float>(3, 4, 1));
  Var<float> x;
  const std::vector<int> labels = {0, 1};
  CapturedStep<float> step([&](Tape<float>& tape) {
    x = tape.constant(remat_test::random_matrix<float>(2, 3, 2));
    return remat::cross_entropy(remat::matmul(x, tape.variable(w)), labels);
  });
  const float first = step.last_loss();
  remat_test::expect_error_naming<remat::shape_error>([&] { step.set_input(x, Matrix<float>::Zero(3, 3)); },
                                                      {"set_input", "[2,3]", "[3,3]"});
  remat_test::expect_error_naming<remat::index_error>(
      [&] {
        step.set_indices(step.loss(), {0, 4});
      },
      {"cross_entropy", "label 4", "[0, 4)"});
  remat_test::expect_error_naming<remat::shape_error>([&] { step.set_indices(step.loss(), {0}); },
                                                      {"set_indices", "2 entries", "1 are given"});
  remat_test::expect_error_naming<remat::tape_error>([&] { step.set_indices(x, {0, 1}); }, {"set_indices", "constant"});
  Tape<float> other;
  const Var<float> foreign = other.constant(Matrix<float>::Zero(2, 3));
  EXPECT_THROW(step.set_input(foreign, Matrix<float>::Zero(2, 3)), remat::tape_error);
  // Nothing changed: the replay computes the captured loss again (w has not moved).
  w.zero_grad();
  EXPECT_EQ(step.replay(), first);
  // And a change does change it.
  step.set_indices(step.loss(), {3, 2});
  EXPECT_NE(step.replay(), first);
}

// gather and index_select keep integer data, which a captured step may change (set_indices of their outputs), checked
// by the op along its own dim: w is [2,4,3]; index_select along dim -1 (size 3), gather along dim 1 (size 4). Each
// replay equals the step recorded afresh with the same indices; a bad index (3 fits dim 1 but not dim 2; 4 no dim
// of size 4) is refused naming the op, the index and the dim's size, and leaves the step as it was.
struct Selections {
  std::vector<int> selected;  // index_select(w, -1, selected)
  std::vector<int> gathered;  // gather(w, 1, gathered, [2,2,3])

  Var<float> loss(Tape<float>& tape, const Var<float>& w, Var<float>* s = nullptr, Var<float>* g = nullptr) const {
    const Var<float> sv = remat::index_select(w, -1, selected);
    const Var<float> gv = remat::gather(w, 1, gathered, remat::Shape{2, 2, 3});
    if (s) *s = sv;
    if (g) *g = gv;
    const Matrix<float> weights = remat_test::random_matrix<float>(1, 12, 7);
    return remat::sum(remat::square(sv)) + remat::sum(gv * tape.constant(remat::Shape{2, 2, 3}, weights.data()));
  }
  /// Loss and w's gradient of the step recorded on a fresh tape (the oracle).
  std::vector<Matrix<float>> fresh(const Matrix<float>& w_value) const {
    Parameter<float> w(nd(w_value));
    Tape<float> tape;
    const Var<float> l = loss(tape, tape.variable(w));
    tape.backward(l);
    return {Matrix<float>::Constant(1, 1, l.item()), Matrix<float>(w.grad())};
  }
  static remat::Tensor<float, 3> nd(const Matrix<float>& m) {
    remat::Tensor<float, 3> t(2, 4, 3);
    std::copy(m.data(), m.data() + 24, t.data());
    return t;
  }
};

TEST(CapturedStepIndices, GatherAndIndexSelectIndicesAreSetAndCheckedAlongTheirDim) {
  const Matrix<float> w_value = remat_test::random_matrix<float>(1, 24, 3);
  Parameter<float> w(Selections::nd(w_value));
  Selections sel{{2, 0, 2}, std::vector<int>(12, 0)};
  for (std::size_t p = 0; p < sel.gathered.size(); ++p) sel.gathered[p] = static_cast<int>((3 * p + 1) % 4);
  Var<float> selected, gathered;
  CapturedStep<float> step([&](Tape<float>& tape) { return sel.loss(tape, tape.variable(w), &selected, &gathered); });
  auto replayed = [&] {
    w.zero_grad();
    const float l = step.replay();
    return std::vector<Matrix<float>>{Matrix<float>::Constant(1, 1, l), Matrix<float>(w.grad())};
  };
  auto expect_equal = [](const std::vector<Matrix<float>>& got, const std::vector<Matrix<float>>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(bitwise_equal(got[k], want[k])) << "output " << k;
  };
  const std::vector<Matrix<float>> first = replayed();
  expect_equal(first, sel.fresh(w_value));

  // New indices: index 1 of dim 2 (repeated), and 3 in dim 1 (valid there only); the answer changes.
  Selections next{{1, 1, 0}, sel.gathered};
  next.gathered[5] = 3;
  next.gathered[0] = 2;
  step.set_indices(selected, next.selected);
  step.set_indices(gathered, next.gathered);
  const std::vector<Matrix<float>> second = replayed();
  expect_equal(second, next.fresh(w_value));
  EXPECT_NE(second[0](0, 0), first[0](0, 0));

  // Refused: out of their dim's range (3 is in dim 1's range, not in dim 2's), negative, too many or too few.
  remat_test::expect_error_naming<remat::index_error>(
      [&] {
        step.set_indices(selected, {1, 3, 0});
      },
      {"index_select", "index 3", "position 1", "[0, 3)", "dim 2"});
  remat_test::expect_error_naming<remat::index_error>(
      [&] {
        step.set_indices(selected, {-1, 0, 0});
      },
      {"index_select", "index -1", "[0, 3)"});
  std::vector<int> bad = next.gathered;
  bad[7] = 4;
  remat_test::expect_error_naming<remat::index_error>([&] { step.set_indices(gathered, bad); },
                                                      {"gather", "index value 4", "position 7", "[0, 4)", "dim 1"});
  remat_test::expect_error_naming<remat::shape_error>(
      [&] {
        step.set_indices(gathered, {0, 1});
      },
      {"set_indices", "12 entries", "2 are given"});
  // Nothing changed: the step computes what it computed with the last accepted indices.
  expect_equal(replayed(), second);
}

// The public entry points throw the same errors as the captured step's check, with the fix.
TEST(CapturedStepIndices, GatherAndIndexSelectNameTheValidRange) {
  Tape<float> tape;
  const Var<float> x = tape.variable(remat::Shape{2, 4, 3}, remat_test::random_matrix<float>(1, 24, 5).data());
  remat_test::expect_error_naming<remat::index_error>(
      [&] {
        remat::index_select(x, -1, {0, 3});
      },
      {"index_select", "index 3", "[0, 3)", "must be in [0, 3)"});
  remat_test::expect_error_naming<remat::index_error>(
      [&] {
        remat::gather(x, 0, std::vector<int>(12, 2), remat::Shape{2, 2, 3});
      },
      {"gather", "index value 2", "[0, 2)", "must be in [0, 2)"});
  EXPECT_EQ(tape.size(), 1u);  // nothing recorded
}

}  // namespace captured_step_test
