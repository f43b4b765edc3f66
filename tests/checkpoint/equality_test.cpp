// W1- and W2-shaped models (bench/workloads.hpp, at reduced size) under every policy, with single-level regions,
// nested regions (two and three levels) and checkpoint_sequential: the loss and every gradient are bitwise
// equal to the run without checkpoint, in float and double.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_support.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace equality_test {

using checkpoint_test::BitwiseEqual;
using checkpoint_test::random_matrix;
using remat::Matrix;
using remat::OpInfo;
using remat::Tape;
using remat::Var;

/// How the layers of a model are wrapped in checkpoint regions.
enum class Mode {
  none,               // no checkpoint: the reference
  single,             // each layer in its own region with policy P
  nested_outer,       // pairs of layers in a region with P, each layer inside in a region saving nothing
  nested_inner,       // pairs of layers in a region saving nothing, each layer inside in a region with P
  three_levels,       // the whole stack in a region with P, pairs with nothing_saveable, layers with P
  sequential,         // checkpoint_sequential(layers, 2, x, P)
  sequential_nested,  // checkpoint_sequential whose layers are themselves checkpointed with nothing_saveable
};
const Mode all_modes[] = {Mode::single,       Mode::nested_outer, Mode::nested_inner,
                          Mode::three_levels, Mode::sequential,   Mode::sequential_nested};
const char* name(Mode m) {
  switch (m) {
    case Mode::none:
      return "none";
    case Mode::single:
      return "single";
    case Mode::nested_outer:
      return "nested_outer";
    case Mode::nested_inner:
      return "nested_inner";
    case Mode::three_levels:
      return "three_levels";
    case Mode::sequential:
      return "sequential";
    case Mode::sequential_nested:
      return "sequential_nested";
  }
  return "?";
}

template <class T>
using Layer = std::function<Var<T>(Var<T>)>;

/// Runs `layers` on x as `mode` says, with `policy` where the mode names P.
template <class T, class Policy>
Var<T> run_layers(const std::vector<Layer<T>>& layers, Var<T> x, Mode mode, const Policy& policy) {
  using remat::checkpoint;
  const auto nothing = remat::policies::nothing_saveable;
  auto pair = [&](std::size_t i, auto inner_policy) {
    return [&layers, i, inner_policy](Var<T> h) {
      h = checkpoint(layers[i], inner_policy)(h);
      return checkpoint(layers[i + 1], inner_policy)(h);
    };
  };
  switch (mode) {
    case Mode::none:
      for (const auto& layer : layers) x = layer(x);
      return x;
    case Mode::single:
      for (const auto& layer : layers) x = checkpoint(layer, policy)(x);
      return x;
    case Mode::nested_outer:
      for (std::size_t i = 0; i < layers.size(); i += 2) x = checkpoint(pair(i, nothing), policy)(x);
      return x;
    case Mode::nested_inner:
      for (std::size_t i = 0; i < layers.size(); i += 2) x = checkpoint(pair(i, policy), nothing)(x);
      return x;
    case Mode::three_levels:
      return checkpoint(
          [&](Var<T> h) {
            for (std::size_t i = 0; i < layers.size(); i += 2)
              h = checkpoint([&, i](Var<T> v) { return pair(i, policy)(v); }, nothing)(h);
            return h;
          },
          policy)(x);
    case Mode::sequential:
      return remat::checkpoint_sequential(layers, 2, x, policy);
    case Mode::sequential_nested: {
      std::vector<Layer<T>> wrapped;
      for (const auto& layer : layers) wrapped.push_back(checkpoint(layer, nothing));
      return remat::checkpoint_sequential(wrapped, 2, x, policy);
    }
  }
  return x;
}

template <class T>
struct Outcome {
  Matrix<T> loss;
  std::vector<Matrix<T>> gradients;
  std::size_t saved_bytes = 0;  // after the forward pass
  std::size_t replayed_ops = 0;
};

/// W1 at reduced size: 16 → 4 tanh layers of 32 → 10, softmax cross-entropy, batch 8. Each hidden layer
/// tags its pre-activation "pre" so that name policies have something to select.
template <class T, class Policy>
Outcome<T> run_w1(Mode mode, const Policy& policy) {
  const int batch = 8, input = 16, width = 32, classes = 10, depth = 4;
  Tape<T> tape;
  std::vector<Var<T>> params;
  auto x = tape.variable(random_matrix<T>(batch, input, 100));
  params.push_back(x);
  std::vector<Layer<T>> layers;
  for (int l = 0; l < depth; ++l) {
    auto w = tape.variable(random_matrix<T>(l == 0 ? input : width, width, 200 + l, 0.3));
    auto b = tape.variable(random_matrix<T>(1, width, 300 + l, 0.1));
    params.push_back(w);
    params.push_back(b);
    layers.push_back([w, b](Var<T> h) { return remat::tanh(remat::checkpoint_name(remat::matmul(h, w) + b, "pre")); });
  }
  auto w_out = tape.variable(random_matrix<T>(width, classes, 400, 0.3));
  auto b_out = tape.variable(random_matrix<T>(1, classes, 401, 0.1));
  params.push_back(w_out);
  params.push_back(b_out);
  std::vector<int> labels;
  for (int i = 0; i < batch; ++i) labels.push_back((i * 7 + 3) % classes);

  auto h = run_layers(layers, x, mode, policy);
  auto loss = remat::cross_entropy(remat::matmul(h, w_out) + b_out, labels);
  h = Var<T>();
  layers.clear();  // the layers' copies of the weight handles go; the tape holds what backward needs
  Outcome<T> out;
  out.saved_bytes = tape.memory().saved_bytes;
  tape.backward(loss);
  out.loss = loss.value();
  out.gradients = checkpoint_test::gradients_of(params);
  out.replayed_ops = tape.memory().replayed_ops;
  return out;
}

/// W2 at reduced size: 4 blocks h ← h + Linear(64→16)(gelu(Linear(16→64)(layer_norm(h)))) over a 12 × 16
/// input, head layer_norm → Linear(16→5) → cross-entropy. The first linear's output is tagged "pre".
template <class T, class Policy>
Outcome<T> run_w2(Mode mode, const Policy& policy) {
  const int rows = 12, width = 16, hidden = 64, classes = 5, blocks = 4;
  Tape<T> tape;
  std::vector<Var<T>> params;
  auto x = tape.variable(random_matrix<T>(rows, width, 500));
  params.push_back(x);
  std::vector<Layer<T>> layers;
  for (int l = 0; l < blocks; ++l) {
    auto gain = tape.variable(Matrix<T>(Matrix<T>::Ones(1, width) + random_matrix<T>(1, width, 600 + l, 0.1)));
    auto bias = tape.variable(random_matrix<T>(1, width, 700 + l, 0.1));
    auto w1 = tape.variable(random_matrix<T>(width, hidden, 800 + l, 0.25));
    auto b1 = tape.variable(random_matrix<T>(1, hidden, 900 + l, 0.1));
    auto w2 = tape.variable(random_matrix<T>(hidden, width, 1000 + l, 0.125));
    auto b2 = tape.variable(random_matrix<T>(1, width, 1100 + l, 0.1));
    for (const auto& p : {gain, bias, w1, b1, w2, b2}) params.push_back(p);
    layers.push_back([=](Var<T> h) {
      auto u = remat::checkpoint_name(remat::linear(remat::layer_norm(h, gain, bias), w1, b1), "pre");
      return h + remat::linear(remat::gelu(u), w2, b2);
    });
  }
  auto gain = tape.variable(Matrix<T>(Matrix<T>::Ones(1, width)));
  auto bias = tape.variable(Matrix<T>(Matrix<T>::Zero(1, width)));
  auto w_out = tape.variable(random_matrix<T>(width, classes, 1200, 0.25));
  auto b_out = tape.variable(random_matrix<T>(1, classes, 1201, 0.1));
  for (const auto& p : {gain, bias, w_out, b_out}) params.push_back(p);
  std::vector<int> labels;
  for (int i = 0; i < rows; ++i) labels.push_back((i * 3 + 1) % classes);

  auto h = run_layers(layers, x, mode, policy);
  auto loss = remat::cross_entropy(remat::linear(remat::layer_norm(h, gain, bias), w_out, b_out), labels);
  h = Var<T>();
  layers.clear();
  Outcome<T> out;
  out.saved_bytes = tape.memory().saved_bytes;
  tape.backward(loss);
  out.loss = loss.value();
  out.gradients = checkpoint_test::gradients_of(params);
  out.replayed_ops = tape.memory().replayed_ops;
  return out;
}

template <class T>
void expect_bitwise_equal(const Outcome<T>& reference, const Outcome<T>& run) {
  EXPECT_TRUE(BitwiseEqual(reference.loss, run.loss)) << "loss";
  ASSERT_EQ(reference.gradients.size(), run.gradients.size());
  for (std::size_t k = 0; k < run.gradients.size(); ++k)
    EXPECT_TRUE(BitwiseEqual(reference.gradients[k], run.gradients[k])) << "gradient " << k;
}

/// A user policy: save values of at least 1 KiB that are not elementwise (a memory-for-time trade-off a
/// user might write), and every layer_norm.
struct LargeNonElementwise {
  bool operator()(const OpInfo& op) const {
    return (op.bytes >= 1024 && op.kind != remat::OpKind::elementwise) || op.name == "layer_norm";
  }
};

/// Every policy of remat::policies, with a label and whether it may drop something (it then must replay).
auto all_policies() {
  using namespace remat::policies;
  return std::make_tuple(
      std::make_pair("nothing_saveable", nothing_saveable), std::make_pair("everything_saveable", everything_saveable),
      std::make_pair("dots_saveable", dots_saveable),
      std::make_pair("save_only_these_names", save_only_these_names({"pre"})),
      std::make_pair("save_any_names_but_these", save_any_names_but_these({"pre"})),
      std::make_pair("save_from_both_policies", save_from_both_policies(dots_saveable, save_only_these_names({"pre"}))),
      std::make_pair("lambda", [](const OpInfo& op) { return op.kind == remat::OpKind::normalization; }),
      std::make_pair("struct", LargeNonElementwise{}));
}

template <class T>
class Equality : public ::testing::Test {};
TYPED_TEST_SUITE(Equality, checkpoint_test::Scalars);

template <class T, class Run>
void check_every_policy_and_mode(Run run) {
  const Outcome<T> reference = run(Mode::none, remat::policies::nothing_saveable);
  EXPECT_EQ(reference.replayed_ops, 0u);
  std::apply(
      [&](const auto&... labelled) {
        (
            [&](const auto& p) {
              std::size_t replayed_over_modes = 0;
              const bool saves_all = std::string(p.first) == "everything_saveable";
              for (Mode mode : all_modes) {
                SCOPED_TRACE(std::string(p.first) + " / " + name(mode));
                const Outcome<T> run_outcome = run(mode, p.second);
                expect_bitwise_equal(reference, run_outcome);
                replayed_over_modes += run_outcome.replayed_ops;
                if (saves_all && (mode == Mode::single || mode == Mode::sequential)) {
                  // everything_saveable keeps exactly the residuals of no checkpoint and replays nothing
                  EXPECT_EQ(run_outcome.saved_bytes, reference.saved_bytes);
                  EXPECT_EQ(run_outcome.replayed_ops, 0u);
                }
                if (mode == Mode::nested_inner || mode == Mode::three_levels) {
                  // a nothing_saveable level spans two layers: the first layer's output is dropped
                  EXPECT_GT(run_outcome.replayed_ops, 0u) << "the comparison must exercise a replay";
                  EXPECT_LT(run_outcome.saved_bytes, reference.saved_bytes);
                }
              }
              EXPECT_GT(replayed_over_modes, 0u) << p.first;
            }(labelled),
            ...);
      },
      all_policies());
}

TYPED_TEST(Equality, W1EveryPolicyEveryNestingBitwiseEqualToNoCheckpoint) {
  using T = TypeParam;
  check_every_policy_and_mode<T>([](Mode mode, const auto& policy) { return run_w1<T>(mode, policy); });
}

TYPED_TEST(Equality, W2EveryPolicyEveryNestingBitwiseEqualToNoCheckpoint) {
  using T = TypeParam;
  check_every_policy_and_mode<T>([](Mode mode, const auto& policy) { return run_w2<T>(mode, policy); });
}

}  // namespace equality_test