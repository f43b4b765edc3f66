// checkpoint_sequential(): PyTorch's segment semantics (every layer but those of the last segment evaluated
// twice), the segment boundaries as the only saved activations, gradients bitwise those of the plain tape.
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "counting_op.hpp"
#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace checkpoint_sequential_test {

constexpr remat::Index rows = 8, width = 16;
using Layer = std::function<remat::Var<float>(remat::Var<float>)>;

struct Outcome {
  std::vector<int> evaluations;
  std::vector<remat::Matrix<float>> grads;
  remat::MemoryStats after_forward;
};

/// L layers x ← square(tanh(x·W_i)); segments = 0: plain tape.
Outcome run(int L, int segments) {
  remat::Tape<float> tape;
  std::vector<remat::Var<float>> weights;
  for (int i = 0; i < L; ++i)
    weights.push_back(
        tape.variable(remat_test::random_matrix<float>(width, width, static_cast<std::uint64_t>(i + 1)) * 0.3f));
  std::vector<Layer> layers;
  for (int i = 0; i < L; ++i)
    layers.push_back([&weights, i](remat::Var<float> x) {
      return remat::square(remat_test::layer_counting_tanh(remat::matmul(x, weights[static_cast<std::size_t>(i)]), i));
    });
  auto x0 = tape.variable(remat_test::random_matrix<float>(rows, width, 100));
  remat_test::evaluations.assign(static_cast<std::size_t>(L), 0);
  remat::Var<float> y = x0;
  if (segments == 0)
    for (auto& layer : layers) y = layer(y);
  else
    y = remat::checkpoint_sequential(layers, segments, x0);
  auto loss = remat::sum(y);
  y = remat::Var<float>();
  Outcome r;
  r.after_forward = tape.memory();
  tape.backward(loss);
  r.evaluations = remat_test::evaluations;
  for (auto& w : weights) r.grads.emplace_back(w.grad());
  r.grads.emplace_back(x0.grad());
  return r;
}

TEST(CheckpointSequential, SegmentsReplayOnceAndGradientsAreBitwiseEqual) {
  const int L = 10;
  const Outcome plain = run(L, 0);
  EXPECT_EQ(plain.evaluations, std::vector<int>(L, 1));
  constexpr std::size_t value = remat_test::bytes<float>(rows, width);
  for (int segments = 1; segments <= L; ++segments) {
    SCOPED_TRACE("segments = " + std::to_string(segments));
    const Outcome r = run(L, segments);
    // Groups of ⌊L/segments⌋ layers; the last group takes the rest and is not checkpointed.
    const int size = L / segments;
    const int last_start = (segments - 1) * size;
    for (int i = 0; i < L; ++i) EXPECT_EQ(r.evaluations[static_cast<std::size_t>(i)], i < last_start ? 2 : 1) << i;
    for (std::size_t k = 0; k < plain.grads.size(); ++k)
      EXPECT_TRUE((r.grads[k].array() == plain.grads[k].array()).all()) << k;
    // Saved after the forward pass: x_0 and each boundary (segments values), plus per layer of the last group
    // its tanh output (read by square and by tanh's backward), and the output of layers other than the last,
    // read by the next matmul. The plain tape: L tanh outputs + L inputs of matmul. The weights are
    // tape-owned too (variables): L·width² each way.
    const std::size_t weights = static_cast<std::size_t>(L) * remat_test::bytes<float>(width, width);
    const int last_group = L - last_start;
    EXPECT_EQ(r.after_forward.saved_bytes, weights + (segments + 2 * last_group - 1) * value)
        << remat_test::describe(r.after_forward);
  }
  EXPECT_EQ(plain.after_forward.saved_bytes, static_cast<std::size_t>(L) * remat_test::bytes<float>(width, width) +
                                                 2 * static_cast<std::size_t>(L) * value);
}

TEST(CheckpointSequential, RejectsBadSegmentCounts) {
  remat::Tape<float> tape;
  auto x = tape.variable(remat::Matrix<float>::Ones(2, 2));
  std::vector<Layer> layers(3, [](remat::Var<float> v) { return remat::tanh(v); });
  EXPECT_THROW(remat::checkpoint_sequential(layers, 0, x), remat::domain_error);
  EXPECT_THROW(remat::checkpoint_sequential(layers, 4, x), remat::domain_error);
}

}  // namespace checkpoint_sequential_test