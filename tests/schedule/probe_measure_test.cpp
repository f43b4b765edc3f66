// checkpoint_sequential_auto's probe measures each layer once, inside a region that saves nothing, and takes
// from that one pass two peaks (TapeState::begin/end_peak_measure): F_i's, the pass's own, and Fall_i's, the
// peak the layer reaches when its ops are saved (a kept layer's forward), counted as if what the pass freed
// that a backward reads had stayed. The oracles are the tape itself: the same layer run on a plain tape (its
// ops saved) for Fall_i, in a nothing_saveable region without the measure for F_i.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

namespace probe_measure_test {  // named: the directory's tests are one unity translation unit

using V = remat::Var<float>;
using Layer = std::function<V(V, const std::vector<V>&)>;

struct Case {
  std::string name;
  Layer layer;
};

// Layers where the two peaks differ in different ways: residuals freed mid-layer in the pass (reassigned
// handles), held by handles to the end, op extras (layer_norm's statistics, cross_entropy's softmax), a
// value read only by the forward (a matmul output tanh consumes), and a layer that returns its input.
std::vector<Case> cases() {
  return {
      {"tanh chain, handles reassigned",
       [](V h, const std::vector<V>& w) {
         V a = remat::tanh(remat::matmul(h, w[0]));
         a = remat::tanh(remat::matmul(a, w[1]));
         a = remat::tanh(remat::matmul(a, w[2]));
         return a;
       }},
      {"every value held by a handle",
       [](V h, const std::vector<V>& w) {
         V a = remat::matmul(h, w[0]);
         V b = remat::exp(remat::tanh(a));
         V c = remat::matmul(b, w[1]);
         return c * b + h;
       }},
      {"pre-norm residual block",
       [](V h, const std::vector<V>& w) {
         V inner = remat::gelu(remat::linear(remat::layer_norm(h, w[3], w[4]), w[0], w[5]));
         return h + remat::linear(inner, w[1], w[5]);
       }},
      {"relu and square, one expression",
       [](V h, const std::vector<V>& w) {
         return remat::relu(remat::matmul(h, w[0])) + remat::square(remat::matmul(h, w[1]));
       }},
      {"softmax then a product",
       [](V h, const std::vector<V>& w) { return remat::matmul(remat::softmax(remat::matmul(h, w[2])), w[0]); }},
      {"identity", [](V h, const std::vector<V>&) { return h; }},
  };
}

constexpr remat::Index rows = 24, width = 16;

/// The tape with x (a variable: it needs a gradient) and the layer's weights recorded; returns x.
V record_leaves(remat::Tape<float>& tape, std::vector<V>& w) {
  for (int k = 0; k < 3; ++k)
    w.push_back(tape.variable(remat_test::random_matrix<float>(width, width, 20 + static_cast<std::uint64_t>(k))));
  w.push_back(tape.variable(remat_test::random_matrix<float>(1, width, 30)));  // layer_norm gain
  w.push_back(tape.variable(remat_test::random_matrix<float>(1, width, 31)));  // layer_norm bias
  w.push_back(tape.variable(remat_test::random_matrix<float>(1, width, 32)));  // linear bias
  return tape.variable(remat_test::random_matrix<float>(rows, width, 10));
}

TEST(ProbeMeasure, BothPeaksAreThoseOfTheTapeRunningTheLayer) {
  int differ = 0;  // cases where saving the ops raises the peak: where the retained count matters
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    // Fall_i: the layer on a plain tape, every op saved. Recording only allocates, so the peak before the
    // layer is the live bytes.
    std::size_t saved_peak = 0;
    {
      remat::Tape<float> tape;
      std::vector<V> w;
      V x = record_leaves(tape, w);
      const std::size_t before = tape.memory().live_bytes;
      ASSERT_EQ(tape.memory().peak_bytes, before);
      V y = c.layer(x, w);
      saved_peak = tape.memory().peak_bytes - before;
    }
    // F_i: in a region that saves nothing, no measure.
    std::size_t dropped_peak = 0;
    {
      remat::Tape<float> tape;
      std::vector<V> w;
      V x = record_leaves(tape, w);
      const std::size_t before = tape.memory().live_bytes;
      V y = remat::checkpoint([&](V h) { return c.layer(h, w); }, remat::policies::nothing_saveable)(x);
      dropped_peak = tape.memory().peak_bytes - before;
    }
    // The probe: both from one pass in a region that saves nothing.
    remat::Tape<float> tape;
    std::vector<V> w;
    V x = record_leaves(tape, w);
    std::size_t before = 0;
    remat::detail::Buffers<float>::Measure measured;
    V y = remat::checkpoint(
        [&](V h) {
          before = remat::detail::VarAccess::state(h)->live_bytes();
          const auto saved = remat::detail::VarAccess::state(h)->begin_peak_measure();
          V out = c.layer(h, w);
          measured = remat::detail::VarAccess::state(h)->end_peak_measure(saved);
          return out;
        },
        remat::policies::nothing_saveable)(x);
    EXPECT_EQ(measured.retained_peak - before, saved_peak);
    EXPECT_EQ(measured.peak - before, dropped_peak);
    EXPECT_EQ(tape.memory().peak_bytes - before, dropped_peak) << "the measure changed the tape's own peak";
    differ += saved_peak > dropped_peak ? 1 : 0;
  }
  EXPECT_GE(differ, 3);  // the first three
}

TEST(ProbeMeasure, StretchesNest) {
  // Two layers measured as one stretch around two nested ones: the outer figures are the two layers'
  // together, as if measured alone.
  const std::vector<Case> all = cases();
  const Layer& first = all[0].layer;
  const Layer& second = all[2].layer;
  auto both = [&](V h, const std::vector<V>& w) { return second(first(h, w), w); };
  std::size_t saved_peak = 0;
  {
    remat::Tape<float> tape;
    std::vector<V> w;
    V x = record_leaves(tape, w);
    const std::size_t before = tape.memory().live_bytes;
    V y = both(x, w);
    saved_peak = tape.memory().peak_bytes - before;
  }
  remat::Tape<float> tape;
  std::vector<V> w;
  V x = record_leaves(tape, w);
  std::size_t before = 0;
  remat::detail::Buffers<float>::Measure outer, inner;
  V y = remat::checkpoint(
      [&](V h) {
        auto* state = remat::detail::VarAccess::state(h);
        before = state->live_bytes();
        const auto saved_outer = state->begin_peak_measure();
        V mid = first(h, w);
        const std::size_t inner_before = state->live_bytes();
        const auto saved_inner = state->begin_peak_measure();
        V out = second(mid, w);
        inner = state->end_peak_measure(saved_inner);
        outer = state->end_peak_measure(saved_outer);
        EXPECT_GE(inner.retained_peak, inner_before);
        return out;
      },
      remat::policies::nothing_saveable)(x);
  EXPECT_EQ(outer.retained_peak - before, saved_peak);
  EXPECT_GE(outer.peak, inner.peak);
  EXPECT_EQ(tape.memory().peak_bytes, outer.peak);
}

}  // namespace probe_measure_test

namespace probe_measure_test {

TEST(ProbeMeasure, ThePlannersForwardTermsBoundTheTapesForwardPeaks) {
  // checkpoint_sequential_auto's F_i (ω_x + o_f) and Fall_i (ω_x̄ + o_f̄) against the layer run alone with its
  // input held by a handle, as the real pass holds it: in a nothing_saveable region (F) and on a plain tape
  // (Fall). Layers 2 and 3 drop their input's handle mid-layer (softmax reads only its output): in the probe
  // that input is the previous layer's output, whose only other handle is the probe's.
  const std::vector<Case> all = cases();
  auto dropping = [](V h, const std::vector<V>& w) {
    h = remat::softmax(h);
    return remat::matmul(h, w[1]);
  };
  const std::vector<Layer> layers{all[0].layer, dropping, dropping};
  remat::Tape<float> tape;
  std::vector<V> w;
  V x = record_leaves(tape, w);
  std::vector<std::function<V(V)>> chain;
  for (const Layer& l : layers) chain.push_back([&w, l](V h) { return l(std::move(h), w); });
  remat::AutoScheduleReport report;
  V y = remat::checkpoint_sequential_auto(chain, x, std::size_t(1) << 30, &report);
  const std::size_t unit = report.unit_bytes;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    SCOPED_TRACE("layer " + std::to_string(i + 1));
    std::size_t forward = 0, forward_all = 0;
    for (bool saved : {false, true}) {
      remat::Tape<float> alone;
      std::vector<V> weights;
      V input = record_leaves(alone, weights);
      const std::size_t before = alone.memory().live_bytes;
      V out = saved ? layers[i](input, weights)
                    : remat::checkpoint([&](V h) { return layers[i](std::move(h), weights); },
                                        remat::policies::nothing_saveable)(input);
      (saved ? forward_all : forward) = alone.memory().peak_bytes - before;
    }
    const remat::Chain& c = report.chain;
    const std::size_t f = unit * static_cast<std::size_t>(c.activation_size[i + 1] + c.forward_overhead[i]);
    const std::size_t fall = unit * static_cast<std::size_t>(c.tape_size[i] + c.forward_all_overhead[i]);
    EXPECT_GE(f, forward);
    EXPECT_LE(f, forward + 3 * unit);
    EXPECT_GE(fall, forward_all);
    EXPECT_LE(fall, forward_all + 3 * unit);
  }
}

}  // namespace probe_measure_test
