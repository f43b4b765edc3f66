// When a Parameter's gradient leaves the tape: right after the backward of the last op of the sweep that adds to
// it (its earliest consumer that receives a gradient), as PyTorch's AccumulateGrad does — not when the sweep
// reaches the Parameter's leaf. So recording every Parameter before the forward pass (the README's pattern) and
// recording each where it is used give the same peak, to the byte.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "memory.hpp"
#include "mlp/training_step.hpp"
#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"

namespace gradient_delivery_test {

using remat::Index;
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using remat_test::bytes;

/// Where a model records its Parameters.
enum class Recording { all_before_the_forward_pass, each_where_used };

/// loss = sum(tanh(x·V)·W), x [m, n] a constant, V and W [n, n]. Byte count by hand (floats, m = 2, n = 8):
/// after the forward pass x (16), tanh's output h (16: read by tanh's and the second product's backward) and
/// the loss (1) stay. The backward: the seed (1); sum → dy (16), then the seed goes; y = h·W → dh (16) and
/// dW (64): the peak, 16 + 16 + 1 + 16 + 16 + 64 = 129 floats; then dy goes, and dW goes to W. tanh → dz (16),
/// then dh and h go; z = x·V → dV (64): 16 + 1 + 16 + 64 = 97. Kept on the tape until the sweep reached W's
/// leaf, dW (64) would be live there too: 161 floats, above the 129.
Var<float> small_model(Tape<float>& tape, Parameter<float>& V, Parameter<float>& W, const Matrix<float>& x,
                       Recording recording) {
  Var<float> v, w;
  if (recording == Recording::all_before_the_forward_pass) {
    v = tape.variable(V);
    w = tape.variable(W);
  }
  Var<float> h =
      remat::tanh(remat::matmul(tape.constant(x), recording == Recording::each_where_used ? tape.variable(V) : v));
  return remat::sum(remat::matmul(h, recording == Recording::each_where_used ? tape.variable(W) : w));
}

TEST(GradientDelivery, PeakCountedByHandIsTheSameForBothRecordings) {
  const Matrix<float> x = remat_test::random_matrix<float>(2, 8, 1);
  Matrix<float> grads[2][2];
  for (Recording recording : {Recording::all_before_the_forward_pass, Recording::each_where_used}) {
    SCOPED_TRACE(recording == Recording::each_where_used ? "each where used" : "all before the forward pass");
    Parameter<float> V(remat_test::random_matrix<float>(8, 8, 2)), W(remat_test::random_matrix<float>(8, 8, 3));
    Tape<float> tape;
    Var<float> loss = small_model(tape, V, W, x, recording);
    EXPECT_EQ(tape.memory().live_bytes, bytes<float>(2, 8) * 2 + bytes<float>(1, 1))
        << remat_test::describe(tape.memory());
    tape.backward(loss);
    EXPECT_EQ(tape.memory().peak_bytes, 129 * sizeof(float)) << remat_test::describe(tape.memory());
    grads[recording == Recording::each_where_used][0] = V.grad();
    grads[recording == Recording::each_where_used][1] = W.grad();
  }
  EXPECT_TRUE((grads[0][0].array() == grads[1][0].array()).all());
  EXPECT_TRUE((grads[0][1].array() == grads[1][1].array()).all());
}

TEST(GradientDelivery, GradientReadyCallbacksComeAsEachGradientIsComplete) {
  // W's gradient is complete after the second product's backward, V's after the first's: W first, whatever the
  // recording (delivered at the leaves, all recorded before the forward pass gave V first).
  for (Recording recording : {Recording::all_before_the_forward_pass, Recording::each_where_used}) {
    Parameter<float> V(remat_test::random_matrix<float>(8, 8, 2)), W(remat_test::random_matrix<float>(8, 8, 3));
    Tape<float> tape;
    std::vector<std::string> order;
    std::vector<std::size_t> live;
    tape.on_gradient_ready([&](Parameter<float>& p) {
      order.push_back(&p.value() == &V.value() ? "V" : "W");
      live.push_back(tape.memory().live_bytes);
    });
    tape.backward(small_model(tape, V, W, remat_test::random_matrix<float>(2, 8, 1), recording));
    EXPECT_EQ(order, (std::vector<std::string>{"W", "V"}));
    // When W's callback runs, dW has left the tape: x, h, the loss and dh are live.
    ASSERT_EQ(live.size(), 2u);
    EXPECT_EQ(live[0], (16 + 16 + 1 + 16) * sizeof(float));
  }
}

/// A residual MLP of `blocks` blocks h ← h + tanh(linear(h, W_i, b_i)) (width n, batch m), then
/// cross_entropy(linear(h, W, b)), with every block a segment of checkpoint_sequential (`segments` > 0) or
/// plain, on `tape`.
struct ResidualMlp {
  Index batch, width;
  int blocks;
  std::vector<Parameter<float>> params;  // W_0, b_0, …, W_head, b_head
  Matrix<float> x;
  std::vector<int> labels;

  ResidualMlp(Index m, Index n, int blocks_) : batch(m), width(n), blocks(blocks_) {
    for (int i = 0; i <= blocks; ++i) {
      const Index out = i == blocks ? 10 : n;
      params.emplace_back(remat_test::random_matrix<float>(n, out, 10 + 2 * static_cast<std::uint64_t>(i)) *
                          (1.0f / std::sqrt(static_cast<float>(n))));
      params.emplace_back(remat_test::random_matrix<float>(1, out, 11 + 2 * static_cast<std::uint64_t>(i)) * 0.1f);
    }
    x = remat_test::random_matrix<float>(m, n, 5);
    for (Index i = 0; i < m; ++i) labels.push_back(static_cast<int>(i % 10));
  }

  /// The forward pass, the blocks run by `chain(layers, x)`.
  template <class Chain>
  Var<float> record_with(Tape<float>& tape, Recording recording, Chain&& chain) {
    std::vector<Var<float>> before;
    if (recording == Recording::all_before_the_forward_pass)
      for (auto& p : params) before.push_back(tape.variable(p));
    auto param = [&](std::size_t k) {
      return recording == Recording::each_where_used ? tape.variable(params[k]) : before[k];
    };
    std::vector<std::function<Var<float>(Var<float>)>> layers;
    for (int i = 0; i < blocks; ++i)
      layers.push_back([&, i](Var<float> h) {
        return h + remat::tanh(remat::linear(h, param(2 * static_cast<std::size_t>(i)),
                                             param(2 * static_cast<std::size_t>(i) + 1)));
      });
    Var<float> h = chain(layers, tape.constant(x));
    const auto head = 2 * static_cast<std::size_t>(blocks);
    return remat::cross_entropy(remat::linear(h, param(head), param(head + 1)), labels);
  }
  /// `segments` 0: no checkpoint; otherwise checkpoint_sequential.
  Var<float> record(Tape<float>& tape, Recording recording, int segments) {
    return record_with(tape, recording, [segments](const auto& layers, Var<float> h) {
      if (segments > 0) return remat::checkpoint_sequential(layers, segments, h);
      for (const auto& layer : layers) h = layer(h);
      return h;
    });
  }
  /// checkpoint_sequential_auto within `budget` bytes.
  Var<float> record_planned(Tape<float>& tape, Recording recording, std::size_t budget) {
    return record_with(tape, recording, [budget](const auto& layers, Var<float> h) {
      return remat::checkpoint_sequential_auto(layers, h, budget);
    });
  }
};

TEST(GradientDelivery, ResidualMlpPeaksAndGradientsAreTheSameForBothRecordings) {
  // The shape a new user tried (24 blocks of width 256, batch 256, checkpoint_sequential(5)), estimated from its
  // shapes; then a smaller one run for real, its gradients compared bit for bit.
  for (int segments : {0, 5}) {
    SCOPED_TRACE("segments " + std::to_string(segments));
    ResidualMlp big(256, 256, 24);
    const auto before = remat::estimate_memory(
        [&](Tape<float>& tape) { return big.record(tape, Recording::all_before_the_forward_pass, segments); });
    const auto each = remat::estimate_memory(
        [&](Tape<float>& tape) { return big.record(tape, Recording::each_where_used, segments); });
    EXPECT_EQ(before.peak_bytes, each.peak_bytes);
    EXPECT_EQ(before.saved_bytes, each.saved_bytes);

    ResidualMlp a(16, 32, 6), b(16, 32, 6);
    Tape<float> ta, tb;
    ta.backward(a.record(ta, Recording::all_before_the_forward_pass, segments));
    tb.backward(b.record(tb, Recording::each_where_used, segments));
    EXPECT_EQ(ta.memory().peak_bytes, tb.memory().peak_bytes) << remat_test::describe(ta.memory()) << "\n"
                                                              << remat_test::describe(tb.memory());
    for (std::size_t k = 0; k < a.params.size(); ++k)
      EXPECT_TRUE((a.params[k].grad().array() == b.params[k].grad().array()).all()) << "parameter " << k;
  }
}

TEST(GradientDelivery, PlannersLeastBudgetIsTheSameForBothRecordings) {
  // checkpoint_sequential_auto's least budget and the peak of a run at it.
  auto least_and_peak = [](Recording recording) {
    ResidualMlp model(32, 64, 8);
    std::size_t least = 0;
    {
      Tape<float> tape;
      try {
        model.record_planned(tape, recording, 1);
      } catch (const remat::memory_budget_error& e) {
        least = e.least_budget_bytes();
      }
    }
    Tape<float> tape;
    tape.backward(model.record_planned(tape, recording, least));
    return std::make_pair(least, tape.memory().peak_bytes);
  };
  const auto before = least_and_peak(Recording::all_before_the_forward_pass);
  const auto each = least_and_peak(Recording::each_where_used);
  EXPECT_GT(before.first, 1u);
  EXPECT_EQ(before.first, each.first);
  EXPECT_EQ(before.second, each.second);
  EXPECT_LE(before.second, before.first);
}

TEST(GradientDelivery, MlpExamplePeaksAreTheSameForBothRecordings) {
  // The MLP example's step (its own record(): every Parameter recorded before the forward pass) against the
  // same network with each layer recording its Parameters where it uses them, in every --checkpoint mode, at
  // the example's default shape (784 → 512 → 512 → 10, relu, batch 128), estimated from shapes.
  remat::nn::Generator init(1);
  std::vector<remat::nn::Linear<float>> layers;
  layers.emplace_back(784, 512, init, remat::nn::Init::he_uniform);
  layers.emplace_back(512, 512, init, remat::nn::Init::he_uniform);
  layers.emplace_back(512, 10, init, remat::nn::Init::he_uniform);
  const Matrix<float> x = Matrix<float>::Zero(128, 784);
  std::vector<int> labels(128, 3);
  for (const char* mode : {"none", "layer", "dots", "sqrt"}) {
    SCOPED_TRACE(mode);
    mlp::NetworkOptions o;
    o.checkpoint = mode;
    mlp::TrainingStep step;
    const auto before = remat::estimate_memory([&](Tape<float>& tape) {
      const auto r = step.record(tape, o, layers, x, labels);
      return std::make_tuple(r.loss, r.logits);
    });
    // Layer i records W_i and b_i when it runs (in a checkpoint region, when the region runs it).
    const auto each = remat::estimate_memory([&](Tape<float>& tape) {
      auto layer = [&](std::size_t i, Var<float> h) {
        std::vector<Var<float>> p(2 * i);  // mlp::layer reads entries 2i and 2i + 1
        p.push_back(tape.variable(layers[i].weight));
        p.push_back(tape.variable(layers[i].bias));
        return mlp::layer(o, p, i, h, true);
      };
      Var<float> h = tape.constant(x);
      const std::string m = mode;
      if (m == "none") {
        for (std::size_t i = 0; i < layers.size(); ++i) h = layer(i, h);
      } else if (m == "layer" || m == "dots") {
        for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
          auto f = [&, i](Var<float> v) { return layer(i, v); };
          h = m == "layer" ? remat::checkpoint(f, remat::policies::nothing_saveable)(h)
                           : remat::checkpoint(f, remat::policies::dots_saveable)(h);
        }
        h = layer(layers.size() - 1, h);
      } else {  // sqrt: 3 layers in round(√3) = 2 segments of 2 and 1, every segment a region (mlp::forward)
        h = remat::checkpoint([&](Var<float> v) { return layer(1, layer(0, v)); })(h);
        h = remat::checkpoint([&](Var<float> v) { return layer(2, v); })(h);
      }
      return std::make_tuple(remat::cross_entropy(h, labels), h);
    });
    EXPECT_EQ(before.peak_bytes, each.peak_bytes);
  }
}

TEST(GradientDelivery, W2PeaksAreTheSameForBothRecordings) {
  // W2 (bench/workloads.hpp: 2048 rows of width 256, 8 blocks h ← h + linear(gelu(linear(layer_norm(h)))) with
  // inner width 1024), plain and under checkpoint_sequential(3), estimated from shapes.
  constexpr Index rows = 2048, d = 256;
  constexpr int blocks = 8;
  std::vector<Parameter<float>> params;  // per block: gain, shift, W1, b1, W2, b2
  for (int k = 0; k < blocks; ++k) {
    for (auto [r, c] : {std::pair<Index, Index>{1, d}, {1, d}, {d, 4 * d}, {1, 4 * d}, {4 * d, d}, {1, d}})
      params.emplace_back(Matrix<float>::Zero(r, c));
  }
  std::vector<int> labels(rows, 1);
  for (int segments : {0, 3}) {
    SCOPED_TRACE("segments " + std::to_string(segments));
    auto peak = [&](Recording recording) {
      return remat::estimate_memory([&](Tape<float>& tape) {
               std::vector<Var<float>> before;
               if (recording == Recording::all_before_the_forward_pass)
                 for (auto& p : params) before.push_back(tape.variable(p));
               auto param = [&](std::size_t k) {
                 return recording == Recording::each_where_used ? tape.variable(params[k]) : before[k];
               };
               std::vector<std::function<Var<float>(Var<float>)>> layers;
               for (std::size_t k = 0; k < blocks; ++k)
                 layers.push_back([&, k](Var<float> h) {
                   const std::size_t p = 6 * k;
                   return h + remat::linear(remat::gelu(remat::linear(remat::layer_norm(h, param(p), param(p + 1)),
                                                                      param(p + 2), param(p + 3))),
                                            param(p + 4), param(p + 5));
                 });
               Var<float> h = tape.constant(Matrix<float>::Zero(rows, d));
               if (segments > 0) {
                 h = remat::checkpoint_sequential(layers, segments, h);
               } else {
                 for (const auto& layer : layers) h = layer(h);
               }
               return remat::cross_entropy(remat::slice_cols(h, 0, 10), labels);
             })
          .peak_bytes;
    };
    EXPECT_EQ(peak(Recording::all_before_the_forward_pass), peak(Recording::each_where_used));
  }
}

}  // namespace gradient_delivery_test
