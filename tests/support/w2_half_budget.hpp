// W2 (the benchmark workload of bench/workloads.hpp) run by checkpoint_sequential_auto() with half the plain run's peak
// as its budget. Shared by tests/schedule (reduced sizes, in the sanitizer build of scripts/test.sh) and
// tests/full_size (the full size, which only the optimised build runs).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

namespace w2_half_budget {

inline bool bitwise_equal(const remat::Matrix<float>& a, const remat::Matrix<float>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

// W2 of bench/workloads.hpp, reduced: blocks h ← h + Linear(4d→d)(gelu(Linear(d→4d)(layer_norm(h)))), head
// layer_norm → Linear(d→10) → cross entropy.
struct W2 {
  static constexpr int blocks = 8;
  remat::Index rows, width;
  std::vector<remat::Parameter<float>> gain, shift, w1, b1, w2, b2;
  remat::Parameter<float> head_gain, head_shift, head_w, head_b;
  remat::Matrix<float> input;
  std::vector<int> labels;

  W2(remat::Index r, remat::Index d) : rows(r), width(d) {
    std::uint64_t seed = 1;
    auto param = [&](remat::Index m, remat::Index n, float scale) {
      return remat::Parameter<float>(remat_test::random_matrix<float>(m, n, seed++) * scale);
    };
    for (int k = 0; k < blocks; ++k) {
      gain.push_back(remat::Parameter<float>(remat::Matrix<float>::Ones(1, d)));
      shift.push_back(remat::Parameter<float>(remat::Matrix<float>::Zero(1, d)));
      w1.push_back(param(d, 4 * d, 0.2f));
      b1.push_back(param(1, 4 * d, 0.1f));
      w2.push_back(param(4 * d, d, 0.1f));
      b2.push_back(param(1, d, 0.1f));
    }
    head_gain = remat::Parameter<float>(remat::Matrix<float>::Ones(1, d));
    head_shift = remat::Parameter<float>(remat::Matrix<float>::Zero(1, d));
    head_w = param(d, 10, 0.2f);
    head_b = param(1, 10, 0.1f);
    input = remat_test::random_matrix<float>(r, d, 1234);
    for (remat::Index i = 0; i < r; ++i) labels.push_back(static_cast<int>((i * 7) % 10));
  }

  struct Run {
    float loss = 0;
    std::vector<remat::Matrix<float>> grads;
    remat::MemoryStats after_forward, after_backward;
    remat::AutoScheduleReport report;
  };

  /// budget 0: the plain tape (or checkpoint_sequential with `segments` > 0); otherwise
  /// checkpoint_sequential_auto over the blocks and the head (the loss is its last layer, so that the
  /// budget bounds the whole step's peak) with that budget.
  Run run(std::size_t budget, int segments = 0) {
    remat::Tape<float> tape;
    std::vector<remat::Var<float>> params;
    auto use = [&](remat::Parameter<float>& p) {
      p.zero_grad();  // Parameters accumulate gradients across backward passes (runs)
      params.push_back(tape.variable(p));
      return params.back();
    };
    std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers;
    for (int k = 0; k < blocks; ++k) {
      auto g = use(gain[k]), s = use(shift[k]), a = use(w1[k]), c = use(b1[k]), e = use(w2[k]), f = use(b2[k]);
      layers.push_back([=](remat::Var<float> h) {
        return h + remat::linear(remat::gelu(remat::linear(remat::layer_norm(h, g, s), a, c)), e, f);
      });
    }
    auto hg = use(head_gain), hs = use(head_shift), hw = use(head_w), hb = use(head_b);
    auto head = [&, hg, hs, hw, hb](remat::Var<float> h) {
      return remat::cross_entropy(remat::linear(remat::layer_norm(h, hg, hs), hw, hb), labels);
    };
    Run r;
    auto h = tape.constant(input);
    remat::Var<float> loss;
    if (segments > 0) {
      h = remat::checkpoint_sequential(layers, segments, h);
    } else if (budget == 0) {
      for (auto& layer : layers) h = layer(h);
    } else {
      layers.push_back(head);
      loss = remat::checkpoint_sequential_auto(layers, h, budget, &r.report);
    }
    if (!loss.valid()) loss = head(h);
    h = remat::Var<float>();
    layers.clear();
    r.after_forward = tape.memory();
    r.loss = loss.item();
    tape.backward(loss);
    r.after_backward = tape.memory();
    for (auto& p : params) r.grads.emplace_back(p.grad());
    return r;
  }
};

/// W2 at rows × width with a budget of half the plain run's peak: runs, keeps the whole step's measured
/// peak within the budget, recomputes something, and every gradient is bitwise the plain one.
inline void check_w2_at_half_budget(remat::Index rows, remat::Index width) {
  W2 model(rows, width);
  const auto plain = model.run(0);
  const std::size_t budget = plain.after_backward.peak_bytes / 2;
  const auto planned = model.run(budget);
  ASSERT_TRUE(planned.report.schedule.feasible);
  EXPECT_EQ(planned.loss, plain.loss);
  ASSERT_EQ(planned.grads.size(), plain.grads.size());
  for (std::size_t i = 0; i < plain.grads.size(); ++i)
    EXPECT_TRUE(bitwise_equal(planned.grads[i], plain.grads[i])) << i;
  EXPECT_LE(planned.after_backward.peak_bytes, budget) << remat_test::describe(planned.after_backward);
  EXPECT_GT(planned.after_backward.replayed_ops, 0u);
  const auto counts = planned.report.schedule.forward_counts(W2::blocks + 1);
  std::printf(
      "W2 (%lld x %lld, 8 blocks): plain saved %zu B, peak %zu B; budget %zu B -> saved %zu B, peak %zu B, "
      "replayed %zu ops; block (and head) evaluations:",
      static_cast<long long>(rows), static_cast<long long>(width), plain.after_forward.saved_bytes,
      plain.after_backward.peak_bytes, budget, planned.after_forward.saved_bytes, planned.after_backward.peak_bytes,
      planned.after_backward.replayed_ops);
  for (int n : counts) std::printf(" %d", n);
  std::printf("\n");
  {
    const auto& c = planned.report.chain;
    std::printf("  unit %zu B; x a fo fao bo g per layer:", planned.report.unit_bytes);
    for (int i = 0; i < c.length(); ++i)
      std::printf(" [%lld %lld %lld %lld %lld %lld]", (long long)c.activation_size[i + 1], (long long)c.tape_size[i],
                  (long long)c.forward_overhead[i], (long long)c.forward_all_overhead[i],
                  (long long)c.backward_overhead[i], (long long)c.gradient_size[i]);
    std::printf(" x0 %lld\n", (long long)c.activation_size[0]);
  }
  for (int segments : {2, 8}) {
    const auto sequential = model.run(0, segments);
    bool same = true;
    for (std::size_t i = 0; i < plain.grads.size(); ++i)
      same = same && bitwise_equal(sequential.grads[i], plain.grads[i]);
    EXPECT_TRUE(same);
    std::printf("  beside checkpoint_sequential(%d segments): saved %zu B, peak %zu B, replayed %zu ops\n", segments,
                sequential.after_forward.saved_bytes, sequential.after_backward.peak_bytes,
                sequential.after_backward.replayed_ops);
  }
}

}  // namespace w2_half_budget
