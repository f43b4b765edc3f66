// remat::estimate_memory against the real run (estimate_support.hpp), byte for byte, on the reference
// workloads at test size: W1-small (the MLP example's step, every --checkpoint mode, with and without
// dropout), a W2-like step with nested regions and a name policy, a W3-small GPT in every recompute mode with
// fused and unfused attention, every library policy on a block that uses the transformer ops (embedding,
// attention with its temporaries, dropout, names), nested regions and the schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "../alloc/w2_model.hpp"
#include "estimate_support.hpp"
#include "gpt/gpt.hpp"
#include "mlp/training_step.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace estimate_models_test {

using estimate_test::expect_estimate_equals_real_run;
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;

TEST(EstimateModels, W1SmallEveryCheckpointModeOfTheMlpExample) {
  // W1-small: 784 → 4 hidden layers of 256 with tanh → 10, batch 64; the example's own step (record()).
  const estimate_test::OneThread one_thread;
  remat::nn::Generator init(3);
  std::vector<remat::nn::Linear<float>> layers;
  remat::Index width = 784;
  for (int k = 0; k < 4; ++k, width = 256) layers.emplace_back(width, 256, init, remat::nn::Init::glorot_uniform);
  layers.emplace_back(256, 10, init, remat::nn::Init::glorot_uniform);
  const Matrix<float> x = remat_test::random_matrix<float>(64, 784, 11);
  std::vector<int> labels;
  for (int i = 0; i < 64; ++i) labels.push_back((7 * i + 2) % 10);
  std::set<std::size_t> saved;
  for (double dropout : {0.0, 0.1}) {
    for (const char* mode : {"none", "layer", "dots", "sqrt"}) {
      mlp::NetworkOptions o;
      o.hidden = {256, 256, 256, 256};
      o.activation = "tanh";
      o.dropout = dropout;
      o.checkpoint = mode;
      mlp::TrainingStep step;
      const auto e = expect_estimate_equals_real_run<float>(
          [&](Tape<float>& tape) {
            const auto r = step.record(tape, o, layers, x, labels);
            return std::make_tuple(r.loss, r.logits);  // the step reads the logits after backward
          },
          std::string("checkpoint ") + mode + ", dropout " + std::to_string(dropout));
      saved.insert(e.saved_bytes);
    }
  }
  EXPECT_GE(saved.size(), 3u) << "the modes keep different bytes; the estimate must tell them apart";
}

TEST(EstimateModels, W2LikeStepWithNestedRegionsNamePolicyAndDropout) {
  remat_alloc_test::W2Model model;
  remat_alloc_test::Identity call;
  const auto e = expect_estimate_equals_real_run<float>(
      [&](Tape<float>& tape) {
        tape.seed(5);
        return model.record_forward(tape, call);
      },
      "W2-like");
  EXPECT_GT(e.replayed_ops, 0u);
  EXPECT_GT(e.saved_bytes, 0u);
}

TEST(EstimateModels, W3SmallGptEveryRecomputeModeFusedAndUnfused) {
  gpt::Config c;
  c.vocabulary = 256;
  c.width = 32;
  c.heads = 4;
  c.seq_len = 16;
  c.blocks = 2;
  const remat::Index batch = 2;
  const estimate_test::OneThread one_thread;
  std::vector<int> ids, targets;
  for (remat::Index r = 0; r < batch * c.seq_len; ++r) {
    ids.push_back(static_cast<int>((5 * r + 3) % c.vocabulary));
    targets.push_back(static_cast<int>((5 * r + 8) % c.vocabulary));
  }
  for (const auto attention : {gpt::Attention::unfused, gpt::Attention::fused}) {
    c.dropout = attention == gpt::Attention::unfused ? 0.1 : 0.0;  // fused attention has no dropout
    gpt::Model<float> model = gpt::Model<float>::deterministic(c);
    for (const auto recompute : {gpt::Recompute::none, gpt::Recompute::block, gpt::Recompute::attention,
                                 gpt::Recompute::dots_no_batch, gpt::Recompute::sqrt}) {
      const gpt::Options options{recompute, attention};
      expect_estimate_equals_real_run<float>(
          [&](Tape<float>& tape) {
            tape.seed(9);
            return model.loss(tape, ids, targets, options);
          },
          std::string("GPT ") + gpt::to_string(recompute) +
              (attention == gpt::Attention::fused ? ", fused" : ", unfused with dropout"));
    }
  }
}

template <class T>
class EstimatePolicies : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(EstimatePolicies, Scalars);

/// Two checkpointed blocks over the transformer ops: embedding, layer_norm, a named qkv projection, causal
/// unfused attention (its [S,S] backward temporary) with dropout, fused attention (its [2S,S] temporary and
/// its log-sum-exp extra), a named GELU projection; then a head with cross_entropy. Parameters, tape
/// variables and a constant leaf.
template <class T>
struct PolicyBlock {
  static constexpr remat::Index heads = 2, S = 4, B = 2, H = 8, V = 11;
  Parameter<T> table{remat_test::random_matrix<T>(V, H, 1)}, qkv_w{remat_test::random_matrix<T>(H, 3 * H, 2)},
      qkv_b{remat_test::random_matrix<T>(1, 3 * H, 3)}, mlp_w{remat_test::random_matrix<T>(H, H, 4)},
      head_w{remat_test::random_matrix<T>(H, 5, 5)};
  Matrix<T> gain = remat_test::random_matrix<T>(1, H, 6), shift = remat_test::random_matrix<T>(1, H, 7),
            position = remat_test::random_matrix<T>(B * S, H, 8);
  std::vector<int> ids = {3, 1, 4, 1, 5, 9, 2, 6}, labels = {0, 1, 2, 3, 4, 0, 1, 2};

  template <class Policy>
  Var<T> loss(Tape<T>& tape, const Policy& policy) {
    const Var<T> g = tape.variable(gain), c = tape.variable(shift), wq = tape.variable(qkv_w),
                 bq = tape.variable(qkv_b), wm = tape.variable(mlp_w);
    auto block = [&](Var<T> h) {
      const Var<T> n = remat::layer_norm(h, g, c);
      const Var<T> qkv = remat::checkpoint_name(remat::linear(n, wq, bq), "qkv");
      const Var<T> q = remat::slice_cols(qkv, 0, H), k = remat::slice_cols(qkv, H, H),
                   v = remat::slice_cols(qkv, 2 * H, H);
      const Var<T> p = remat::dropout(remat::softmax(remat::attention_scores(q, k, heads, S, true)), 0.2);
      const Var<T> a =
          remat::attention_values(p, v, heads, S) + remat::scaled_dot_product_attention(q, k, v, heads, S, true);
      return h + remat::tanh(remat::checkpoint_name(remat::gelu(remat::matmul(a, wm)), "mlp"));
    };
    Var<T> h = remat::embedding(tape.variable(table), ids) + tape.constant(position);
    h = remat::checkpoint(block, policy)(h);
    h = remat::checkpoint(block, policy)(h);
    return remat::cross_entropy(remat::matmul(h, tape.variable(head_w)), labels);
  }
};

TYPED_TEST(EstimatePolicies, EveryLibraryPolicyAndACustomOne) {
  using T = TypeParam;
  namespace p = remat::policies;
  PolicyBlock<T> model;
  std::set<std::size_t> saved, peaks;
  auto check = [&](const char* name, const auto& policy) {
    const auto e = expect_estimate_equals_real_run<T>([&](Tape<T>& tape) { return model.loss(tape, policy); }, name);
    saved.insert(e.saved_bytes);
    peaks.insert(e.peak_bytes);
  };
  check("nothing_saveable", p::nothing_saveable);
  check("everything_saveable", p::everything_saveable);
  check("dots_saveable", p::dots_saveable);
  check("dots_with_no_batch_dims_saveable", p::dots_with_no_batch_dims_saveable);
  check("save_only_these_names", p::save_only_these_names({"qkv"}));
  check("save_any_names_but_these", p::save_any_names_but_these({"mlp"}));
  check("save_anything_except_these_names", p::save_anything_except_these_names({"qkv"}));
  check("save_from_both_policies", p::save_from_both_policies(p::dots_saveable, p::save_only_these_names({"mlp"})));
  check("custom: more than 32 scalars", [](const remat::OpInfo& op) { return op.bytes > 32 * sizeof(T); });
  EXPECT_GE(saved.size(), 4u) << "the policies keep different bytes; the estimate must tell them apart";
  EXPECT_GE(peaks.size(), 3u);
}

TYPED_TEST(EstimatePolicies, NestedRegionsThreeDeepTuplesAndTwoArguments) {
  using T = TypeParam;
  namespace p = remat::policies;
  Parameter<T> W(remat_test::random_matrix<T>(6, 6, 1)), U(remat_test::random_matrix<T>(6, 6, 2));
  const Matrix<T> x0 = remat_test::random_matrix<T>(5, 6, 3);
  auto build = [&](Tape<T>& tape) {
    const Var<T> w = tape.variable(W), u = tape.variable(U);
    auto innermost = remat::checkpoint(
        [&](Var<T> a, Var<T> b) {
          const Var<T> m = remat::tanh(remat::matmul(a, w));
          return std::make_tuple(m * b, remat::sigmoid(m));
        },
        p::dots_saveable);
    auto middle = remat::checkpoint(
        [&](Var<T> a) {
          auto [y, s] = innermost(remat::sin(a), a);
          return remat::gelu(remat::matmul(y + s, u));
        },
        p::nothing_saveable);
    auto outer = remat::checkpoint(
        [&](Var<T> a) { return remat::exp(remat::tanh(middle(remat::checkpoint_name(a * a, "sq")))); },
        p::save_only_these_names({"sq"}));
    Var<T> h = tape.constant(x0);
    h = outer(h);
    h = middle(h);  // a nested region recorded again, at depth 2
    return remat::mean(remat::square(h));
  };
  const auto e = expect_estimate_equals_real_run<T>(build, "nested");
  EXPECT_GT(e.replayed_ops, 0u);
}

TEST(EstimateModels, SchedulesCheckpointSequentialRevolveAndThePlanner) {
  const int L = 8;
  std::vector<Parameter<float>> W;
  for (int i = 0; i < L; ++i) W.emplace_back(remat_test::random_matrix<float>(16, 16, 20 + i) * 0.3f);
  const Matrix<float> x0 = remat_test::random_matrix<float>(12, 16, 4);
  std::vector<Var<float>> w(L);
  auto record = [&](Tape<float>& tape) {
    for (int i = 0; i < L; ++i) w[static_cast<std::size_t>(i)] = tape.variable(W[static_cast<std::size_t>(i)]);
    return tape.constant(x0);
  };
  std::vector<std::function<Var<float>(Var<float>)>> layers;
  for (int i = 0; i < L; ++i)
    layers.push_back([&w, i](Var<float> h) { return remat::tanh(remat::matmul(h, w[static_cast<std::size_t>(i)])); });
  expect_estimate_equals_real_run<float>(
      [&](Tape<float>& tape) { return remat::sum(remat::checkpoint_sequential(layers, 3, record(tape))); },
      "checkpoint_sequential");
  expect_estimate_equals_real_run<float>(
      [&](Tape<float>& tape) {
        const auto step = [&](std::int64_t i, Var<float> h) {
          return remat::tanh(remat::matmul(h, w[static_cast<std::size_t>(i)]));
        };
        return remat::sum(remat::revolve(step, record(tape), L, 2));
      },
      "revolve");
  expect_estimate_equals_real_run<float>(
      [&](Tape<float>& tape) {
        // 16 KiB: above the least budget the planner accepts for these 8 layers (13,300 bytes, its whole-step
        // model), so it plans instead of throwing memory_budget_error.
        return remat::sum(remat::checkpoint_sequential_auto(layers, record(tape), std::size_t{1} << 14));
      },
      "checkpoint_sequential_auto");
}

}  // namespace estimate_models_test
