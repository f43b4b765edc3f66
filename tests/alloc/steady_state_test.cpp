// A steady training loop performs no heap allocation after its first step (docs/design.md §2.5): every
// temporary an op or the sweep needs comes from the tape's pool (and so counts in memory().peak_bytes)
// or from scratch vectors the tape keeps across clear().
//
// OWN EXECUTABLE: this file replaces the global operator new/delete and malloc (allocation_counter.hpp);
// tests/CMakeLists.txt builds every tests/alloc/*_test.cpp as a separate program.
//
// To see where an unexpected allocation comes from: REMAT_ALLOC_TRACE=1 ./alloc_steady_state_test
// prints a stack trace of every counted allocation.
#include "allocation_counter.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "blas_threads.hpp"
#include "training_step.hpp"  // examples/mlp
#ifndef __SANITIZE_ADDRESS__
#include "gpt/training_step.hpp"  // examples/gpt
#endif
#include "w2_model.hpp"

namespace {

using remat_alloc::Counts;
using remat_alloc_test::Identity;
using remat_alloc_test::W2Model;

/// What one measured step did.
struct StepRecord {
  Counts counts;
  remat::MemoryStats after_backward, after_step;
};

std::string describe(const std::vector<StepRecord>& steps) {
  std::string s;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    char line[240];
    std::snprintf(line, sizeof line,
                  "  step %zu: %ld allocations (%zu bytes), %ld frees; peak %zu B, cached %zu B; OpenBLAS's own: %ld "
                  "allocations, %ld frees\n",
                  i + 1, steps[i].counts.allocations, steps[i].counts.bytes, steps[i].counts.frees,
                  steps[i].after_backward.peak_bytes, steps[i].after_step.cached_bytes,
                  steps[i].counts.blas_allocations, steps[i].counts.blas_frees);
    s += line;
  }
  return s;
}

/// Steps 2… allocate nothing; every step reaches the same peak; the pool does not grow after step 2.
void expect_steady(const std::vector<StepRecord>& steps, std::size_t first_steady = 1) {
  SCOPED_TRACE("\n" + describe(steps) + "(REMAT_ALLOC_TRACE=1 prints where each allocation happens)");
  ASSERT_GT(steps.size(), first_steady + 3);
  EXPECT_GT(steps[0].counts.allocations, 0) << "the counter saw nothing in the first step";
  ::testing::Test::RecordProperty("openblas_allocations_last_step",
                                  std::to_string(steps.back().counts.blas_allocations));
  for (std::size_t i = first_steady; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].counts.allocations, 0) << "step " << i + 1;
    EXPECT_EQ(steps[i].counts.frees, 0) << "step " << i + 1;
    // OpenBLAS's own packing buffers (allocation_counter.hpp), freed within the product that made them.
    EXPECT_EQ(steps[i].counts.blas_allocations, steps[i].counts.blas_frees) << "step " << i + 1;
    EXPECT_EQ(steps[i].after_backward.peak_bytes, steps[first_steady].after_backward.peak_bytes) << "step " << i + 1;
    EXPECT_EQ(steps[i].after_step.cached_bytes, steps[first_steady].after_step.cached_bytes) << "step " << i + 1;
    EXPECT_EQ(steps[i].after_step.live_bytes, 0u) << "step " << i + 1;
  }
}

// ---- the counter itself ----

void* volatile sink;  // keeps the compiler from eliding an allocation and its free
struct alignas(64) Wide {
  char c[64];
};
void plain_new() {
  delete static_cast<int*>(sink = new int(1));
}
void array_new() {
  delete[] static_cast<int*>(sink = new int[8]);
}
void aligned_new() {
  delete static_cast<Wide*>(sink = new Wide);
}
void nothrow_new() {
  delete static_cast<int*>(sink = new (std::nothrow) int(2));
}
void plain_malloc() {
  std::free(sink = std::malloc(24));
}
void plain_calloc() {
  std::free(sink = std::calloc(3, 8));
}
void plain_realloc() {
  std::free(sink = std::realloc(nullptr, 40));
}
void plain_aligned_alloc() {
  std::free(sink = std::aligned_alloc(64, 128));
}
void plain_posix_memalign() {
  void* p = nullptr;
  if (posix_memalign(&p, 64, 128) == 0) std::free(sink = p);
}
void vector_growth() {
  std::vector<int> v(100);
  sink = v.data();
}
void eigen_matrix() {
  remat::Matrix<float> m(30, 40);
  sink = m.data();
}
void eigen_aligned_malloc() {
  Eigen::internal::aligned_free(sink = Eigen::internal::aligned_malloc(256));
}

TEST(AllocationCounter, SeesEveryKindOfAllocation) {
  const struct {
    const char* name;
    void (*f)();
  } cases[] = {{"new", plain_new},
               {"new[]", array_new},
               {"aligned new", aligned_new},
               {"nothrow new", nothrow_new},
               {"malloc", plain_malloc},
               {"calloc", plain_calloc},
               {"realloc", plain_realloc},
               {"aligned_alloc", plain_aligned_alloc},
               {"posix_memalign", plain_posix_memalign},
               {"std::vector", vector_growth},
               {"Eigen::Matrix", eigen_matrix},
               {"Eigen's aligned_malloc", eigen_aligned_malloc}};
  for (const auto& c : cases) {
    remat_alloc::Count count;
    c.f();
    const Counts counts = count.stop();
    EXPECT_EQ(counts.this_thread, 1) << c.name;
    EXPECT_GE(counts.allocations, 1) << c.name;
    EXPECT_GE(counts.frees, 1) << c.name;
  }
  remat_alloc::Count count;
  EXPECT_EQ(count.stop().this_thread, 0);
}

// ---- (a) a W2-like step with nested checkpoint regions, dropout, checkpoint_name, Adam ----

/// W2Model's call wrapper: runs each call and keeps the memory figures right after backward.
struct Recorder {
  remat::Tape<float>* tape;
  remat::MemoryStats* after_backward;
  template <class F>
  decltype(auto) operator()(const char* what, F&& f) {
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      if (std::string_view(what) == "backward") *after_backward = tape->memory();
    } else {
      return f();
    }
  }
};

TEST(SteadyState, W2StepWithCheckpointingAllocatesNothingAfterTheFirstStep) {
  W2Model model;
  remat::Tape<float> tape;
  constexpr int n = 6;
  std::vector<StepRecord> steps(n);
  float first_loss = 0, last_loss = 0;
  for (int s = 0; s < n; ++s) {
    Recorder call{&tape, &steps[static_cast<std::size_t>(s)].after_backward};
    remat_alloc::Count count;
    const float loss = model.step(tape, call, static_cast<std::uint64_t>(s));
    steps[static_cast<std::size_t>(s)].counts = count.stop();
    steps[static_cast<std::size_t>(s)].after_step = tape.memory();
    (s == 0 ? first_loss : last_loss) = loss;
  }
  std::printf("W2 step:\n%s", describe(steps).c_str());
  expect_steady(steps);
  EXPECT_GT(steps[0].after_backward.replayed_ops, 0u) << "the regions replayed nothing";
  EXPECT_LT(last_loss, first_loss) << "Adam did not train";
}

/// An N-D training step: a convolution's weight Wc [4,3,2,2] read through reshape and transpose by a matmul; a
/// reshape and permute to [2,8,3]; in a nothing_saveable region, layer_norm over the trailing [8,3] and softmax over
/// the middle dim, then a batched matmul with P [2,3,5]; sum over dim 0 plus a bias [5] broadcast; and side terms
/// through index_select, max over dims with keepdim, gather, stack, clamp, concat, where and maximum. Every list of
/// dims and indices is made once, outside the steps; SGD updates the Parameters in place.
struct NdStep {
  using V = remat::Var<float>;
  template <int Rank>
  static remat::Parameter<float> parameter(const std::array<Eigen::Index, Rank>& dims, std::uint64_t seed) {
    remat::Tensor<float, Rank> t(dims);
    const remat::Matrix<float> v = remat_test::random_matrix<float>(1, t.size(), seed, remat_test::Domain{-0.5, 0.5});
    std::copy(v.data(), v.data() + v.size(), t.data());
    return remat::Parameter<float>(t);
  }
  remat::Parameter<float> Wc = parameter<4>({4, 3, 2, 2}, 1), W{remat_test::random_matrix<float>(4, 6, 2)},
                          P = parameter<3>({2, 3, 5}, 3), b = parameter<1>({5}, 4), gain = parameter<2>({8, 3}, 5),
                          shift = parameter<2>({8, 3}, 6);
  std::vector<remat::Parameter<float>*> parameters{&Wc, &W, &P, &b, &gain, &shift};
  const remat::Matrix<float> x = remat_test::random_matrix<float>(8, 12, 7);
  const remat::Matrix<float> condition = remat_test::random_matrix<float>(1, 5, 8, remat_test::Domain{-1, 1, 0, true});
  const std::vector<int> labels{0, 3, 1, 4, 2, 2, 0, 1};
  // Lists kept by the caller (std::vector) and braced lists in the calls: ArrayRef reads both where they are.
  const std::vector<remat::Index> grouped{8, 2, 3};
  const std::vector<int> dims02{0, 2}, picks{2, 0, 2, 1};
  const std::vector<int> gathered{3, 0, 7, 1, 1, 5, 2, 6, 0, 4, 4, 1, 7, 7, 2,
                                  0, 3, 5, 6, 6, 1, 0, 2, 3, 5, 4, 3, 2, 1, 0};
  std::vector<V> parts = std::vector<V>(2);

  /// One step on `tape` (cleared at its end): forward, backward, SGD. Returns the loss; `after_backward` gets
  /// tape.memory() after the backward.
  float step(remat::Tape<float>& tape, remat::MemoryStats& after_backward) {
    const V wc = tape.variable(Wc), w = tape.variable(W), p = tape.variable(P), c = tape.variable(b);
    const V g1 = tape.variable(gain), g2 = tape.variable(shift);
    const V h = remat::tanh(remat::matmul(tape.constant(x), remat::transpose(remat::reshape(wc, {4, -1}))));
    const V g = remat::permute(remat::reshape(remat::matmul(h, w), grouped), {1, 0, 2});  // [2,8,3]
    const V z = remat::checkpoint(
        [&](V u) {
          return remat::matmul(remat::softmax(remat::layer_norm(u, remat::Shape{8, 3}, g1, g2), 1), p);
        },
        remat::policies::nothing_saveable)(g);                                    // [2,8,5]
    const V logits = remat::sum(z, {0}) + c;                                      // [8,5]
    const V picked = remat::max(remat::index_select(z, 2, picks), dims02, true);  // [1,8,1]
    parts[0] = remat::gather(z, 1, gathered, remat::Shape{2, 3, 5});              // [2,3,5]
    parts[1] = parts[0] * 2.0;
    const V stacked = remat::clamp(remat::stack(parts, 1), -0.5, 0.5);  // [2,2,3,5]
    parts[1] = remat::squeeze(remat::slice(stacked, 1, 1, 1), 1);       // [2,3,5]
    const V joined = remat::concat(parts, 1);                           // [2,6,5]
    const V chosen = remat::where(tape.constant(remat::Shape{5}, condition.data()), joined,
                                  remat::maximum(joined, c * 0.5));  // [2,6,5]
    V loss = remat::cross_entropy(logits, labels) + remat::mean(picked) + remat::mean(remat::square(chosen));
    for (V& part : parts) part = V();
    tape.backward(loss);
    after_backward = tape.memory();
    const float value = loss.item();
    for (remat::Parameter<float>* q : parameters) {
      q->mutable_value() -= 0.1f * q->grad();
      q->zero_grad();
    }
    loss = V();
    tape.clear();
    return value;
  }
};

/// An N-D step whose ops allocate nothing once the pool is warm: a rank-3 input times a matrix (one folded
/// product) and, in a nothing_saveable region, layer_norm over the trailing two dims, softmax over the middle dim and
/// a batched matmul with P [2,6,5]; permute; a matmul whose batch dims broadcast with R [3,1,5,4] (rank 4); clamp,
/// index_select and gather along inner dims; sums of same-shape products.
struct NdKernelsStep {
  using V = remat::Var<float>;
  remat::Parameter<float> Wa{remat_test::random_matrix<float>(12, 6, 11, remat_test::Domain{-0.5, 0.5})};
  remat::Parameter<float> P = NdStep::parameter<3>({2, 6, 5}, 12), R = NdStep::parameter<4>({3, 1, 5, 4}, 13),
                          gain = NdStep::parameter<2>({8, 6}, 14), shift = NdStep::parameter<2>({8, 6}, 15);
  std::vector<remat::Parameter<float>*> parameters{&Wa, &P, &R, &gain, &shift};
  const remat::Matrix<float> x = remat_test::random_matrix<float>(16, 12, 16);
  const remat::Matrix<float> weights = remat_test::random_matrix<float>(1, 96, 17);
  const std::vector<int> perm{1, 0, 2}, picks{1, 7, 1, 4};
  const std::vector<int> gathered = [] {
    std::vector<int> g(3 * 8 * 2 * 2);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<int>((5 * i + 3) % 4);
    return g;
  }();

  float step(remat::Tape<float>& tape, remat::MemoryStats& after_backward) {
    const V wa = tape.variable(Wa), p = tape.variable(P), r = tape.variable(R);
    const V g1 = tape.variable(gain), g2 = tape.variable(shift);
    const V h = remat::tanh(remat::matmul(tape.constant(remat::Shape{2, 8, 12}, x.data()), wa));  // [2,8,6]
    const V z = remat::checkpoint(
        [&](V u) {
          return remat::matmul(remat::softmax(remat::layer_norm(u, remat::Shape{8, 6}, g1, g2), 1), p);
        },
        remat::policies::nothing_saveable)(h);                                 // [2,8,5]
    const V u = remat::permute(z, perm);                                       // [8,2,5]
    const V t = remat::clamp(remat::matmul(u, r), -1.0, 1.0);                  // [3,8,2,4]
    const V selected = remat::index_select(t, 1, picks);                       // [3,4,2,4]
    const V picked = remat::gather(t, 3, gathered, remat::Shape{3, 8, 2, 2});  // [3,8,2,2]
    V loss = remat::sum(remat::square(selected)) +
             remat::sum(picked * tape.constant(remat::Shape{3, 8, 2, 2}, weights.data())) + remat::mean(remat::tanh(u));
    tape.backward(loss);
    after_backward = tape.memory();
    const float value = loss.item();
    for (remat::Parameter<float>* q : parameters) {
      q->mutable_value() -= 0.1f * q->grad();
      q->zero_grad();
    }
    loss = V();
    tape.clear();
    return value;
  }
};

template <class Model>
void expect_steady_nd_steps(const char* what) {
  Model model;
  remat::Tape<float> tape;
  constexpr int n = 6;
  std::vector<StepRecord> steps(n);
  float first_loss = 0, last_loss = 0;
  for (int s = 0; s < n; ++s) {
    remat_alloc::Count count;
    const float loss = model.step(tape, steps[static_cast<std::size_t>(s)].after_backward);
    steps[static_cast<std::size_t>(s)].counts = count.stop();
    steps[static_cast<std::size_t>(s)].after_step = tape.memory();
    (s == 0 ? first_loss : last_loss) = loss;
  }
  std::printf("%s:\n%s", what, describe(steps).c_str());
  expect_steady(steps);
  EXPECT_GT(steps[0].after_backward.replayed_ops, 0u) << "the region replayed nothing";
  EXPECT_LT(last_loss, first_loss) << "SGD did not train";
}

TEST(SteadyState, NdStepAllocatesNothingAfterTheFirstStep) {
  expect_steady_nd_steps<NdKernelsStep>("N-D step");
}

/// Recording reshape(x, dims) with a -1, sums and maxima over dims, broadcasting binary ops, where, concat and
/// stack, squeeze and slice allocates nothing once the tape's stores have grown: their shape arithmetic works in
/// fixed arrays and the lists they take are read where they are (ArrayRef). The step is otherwise NdKernelsStep's.
TEST(SteadyState, NdStepWithReshapeReductionsAndJoinsAllocatesNothingAfterTheFirstStep) {
  expect_steady_nd_steps<NdStep>("N-D step with reshape, reductions over dims, broadcasting, concat, stack, where");
}

/// A CapturedStep's replay() allocates and frees nothing, even when the Parameters' gradients are zeroed and
/// their values updated between the replays (an SGD step in place); and the loss falls.
TEST(SteadyState, CapturedStepReplaysAllocateNothing) {
  std::vector<remat::Parameter<float>> weights, biases;
  for (int l = 0; l < 4; ++l) {
    weights.emplace_back(remat::Matrix<float>::Random(32, l == 3 ? 10 : 32) * 0.3f);
    biases.emplace_back(remat::Matrix<float>::Zero(1, l == 3 ? 10 : 32));
  }
  const remat::Matrix<float> x = remat::Matrix<float>::Random(16, 32);
  std::vector<int> labels(16);
  for (int i = 0; i < 16; ++i) labels[static_cast<std::size_t>(i)] = i % 10;
  remat::CapturedStep<float> step([&](remat::Tape<float>& tape) {
    remat::Var<float> h = tape.constant(x);
    for (int l = 0; l < 3; ++l)
      h = remat::checkpoint([&, l](remat::Var<float> v) {
        return remat::tanh(remat::linear(v, tape.variable(weights[static_cast<std::size_t>(l)]),
                                         tape.variable(biases[static_cast<std::size_t>(l)])));
      })(h);
    return remat::cross_entropy(remat::linear(h, tape.variable(weights[3]), tape.variable(biases[3])), labels);
  });
  const float first_loss = step.last_loss();
  float last_loss = first_loss;
  for (int s = 0; s < 6; ++s) {
    remat_alloc::Count count;
    for (auto* group : {&weights, &biases})
      for (remat::Parameter<float>& p : *group) {
        p.mutable_value() -= 0.5f * p.grad();
        p.zero_grad();
      }
    last_loss = step.replay();
    const Counts c = count.stop();
    EXPECT_EQ(c.allocations, 0) << "replay " << s + 1;
    EXPECT_EQ(c.frees, 0) << "replay " << s + 1;
  }
  EXPECT_LT(last_loss, first_loss) << "SGD did not train";
}

/// Products big enough for Eigen's own GEMM to put its packing buffers on the heap (beyond
/// EIGEN_STACK_ALLOCATION_LIMIT, 128 KB): [32,128]·[128,512] and [32,512]·[512,128], and their backward.
TEST(SteadyState, LargeProductsAllocateNothingWithBlas) {
  remat_alloc_test::W2Shape shape;
  shape.batch = 32;
  shape.width = 128;
  shape.hidden = 512;
  W2Model model(shape);
  remat::Tape<float> tape;
  constexpr int n = 5;
  std::vector<StepRecord> steps(n);
  for (int s = 0; s < n; ++s) {
    Recorder call{&tape, &steps[static_cast<std::size_t>(s)].after_backward};
    remat_alloc::Count count;
    model.step(tape, call, static_cast<std::uint64_t>(s));
    steps[static_cast<std::size_t>(s)].counts = count.stop();
    steps[static_cast<std::size_t>(s)].after_step = tape.memory();
  }
  std::printf("W2 step at width 128, hidden 512:\n%s", describe(steps).c_str());
#ifdef EIGEN_USE_BLAS
  expect_steady(steps);
#else
  // The documented limitation (docs/design.md §2.5): without BLAS, Eigen's GEMM allocates its packing
  // buffers on every product of this size, outside the tape's pool.
  for (std::size_t i = 1; i < steps.size(); ++i)
    EXPECT_GT(steps[i].counts.allocations, 0) << "Eigen's GEMM no longer allocates: update docs/design.md §2.5";
#endif
}

// ---- (b) the MLP example's training step (examples/mlp/training_step.hpp) ----

struct MlpFixture {
  static constexpr int inputs = 20, classes = 10;
  mlp::NetworkOptions options;
  std::vector<remat::nn::Linear<float>> layers;
  std::unique_ptr<remat::nn::Adam<float>> adam;
  remat::Matrix<float> images;
  std::vector<int> image_labels;

  MlpFixture(const std::string& checkpoint, const std::string& activation, int samples) {
    options.hidden = {32, 24, 16, 16};
    options.activation = activation;
    options.dropout = 0.2;
    options.checkpoint = checkpoint;
    remat::nn::Generator init(3);
    remat::Index width = inputs;
    for (int h : options.hidden) {
      layers.emplace_back(width, h, init);
      width = h;
    }
    layers.emplace_back(width, classes, init, remat::nn::Init::glorot_uniform);
    std::vector<remat::Parameter<float>*> parameters;
    for (auto& l : layers) {
      parameters.push_back(&l.weight);
      parameters.push_back(&l.bias);
    }
    adam = std::make_unique<remat::nn::Adam<float>>(parameters);
    images = remat_test::random_matrix<float>(samples, inputs, 11);
    for (int i = 0; i < samples; ++i) image_labels.push_back((i * 3 + 1) % classes);
  }
};

/// main.cpp's epoch loop: shuffled batches of `batch` rows (the last one smaller), `epochs` times.
std::vector<StepRecord> run_mlp(MlpFixture& f, int batch, int epochs) {
  remat::Tape<float> tape;
  mlp::TrainingStep step;
  const auto n = static_cast<std::size_t>(f.images.rows());
  remat::Matrix<float> x_batch(batch, f.images.cols());
  std::vector<int> labels;
  std::vector<std::size_t> order(n);
  remat::nn::Generator shuffle(5);
  const std::size_t per_epoch = (n + static_cast<std::size_t>(batch) - 1) / static_cast<std::size_t>(batch);
  std::vector<StepRecord> steps(per_epoch * static_cast<std::size_t>(epochs));
  std::size_t s = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (std::size_t i = n - 1; i > 0; --i) std::swap(order[i], order[shuffle.below(i + 1)]);
    for (std::size_t first = 0; first < n; first += static_cast<std::size_t>(batch), ++s) {
      remat_alloc::Count count;
      const std::size_t m = std::min(static_cast<std::size_t>(batch), n - first);
      labels.resize(m);
      for (std::size_t i = 0; i < m; ++i) {
        x_batch.row(static_cast<remat::Index>(i)) = f.images.row(static_cast<remat::Index>(order[first + i]));
        labels[i] = f.image_labels[order[first + i]];
      }
      const double lr = 1e-3 * 0.5 * (1 + std::cos(static_cast<double>(s) / static_cast<double>(steps.size())));
      const mlp::TrainingStep::Result r =
          step.run(tape, f.options, f.layers, *f.adam, x_batch.topRows(static_cast<remat::Index>(m)), labels, s, lr);
      steps[s].counts = count.stop();
      steps[s].after_backward.peak_bytes = r.peak_bytes;
      tape.clear();  // main.cpp clears at the start of the next step: the same pool state
      steps[s].after_step = tape.memory();
    }
  }
  return steps;
}

class MlpStep : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(MlpStep, AllocatesNothingAfterTheFirstStep) {
  MlpFixture f(std::get<0>(GetParam()), std::get<1>(GetParam()), 48);
  expect_steady(run_mlp(f, 8, 1));  // 6 steps of 8 rows
}

TEST_P(MlpStep, AllocatesNothingInTheSecondEpochWithASmallerLastBatch) {
  MlpFixture f(std::get<0>(GetParam()), std::get<1>(GetParam()), 30);
  const std::vector<StepRecord> steps = run_mlp(f, 8, 3);  // batches 8, 8, 8, 6 per epoch
  SCOPED_TRACE("\n" + describe(steps));
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (i == 0 || i == 3) continue;  // the first step of each batch shape fills the pool
    EXPECT_EQ(steps[i].counts.allocations, 0) << "step " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, MlpStep,
                         ::testing::Combine(::testing::Values("none", "layer", "sqrt", "dots"),
                                            ::testing::Values("relu", "gelu")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
                         });

// ---- (c) the GPT example's training step (examples/gpt/training_step.hpp) ----
// Optimised build only: instantiating the GPT doubles this file's compile time (18 -> 42 CPU s at -O1),
// and the test suite has no room for that twice (README: 579 of its 600 s). tests/gpt runs the model
// itself under the sanitizers.
#ifndef __SANITIZE_ADDRESS__

/// main.cpp's loop on a small model: random windows of a fixed byte pattern, one tape, every step seeded.
std::vector<StepRecord> run_gpt(gpt::Recompute recompute, gpt::Attention attention, double dropout) {
  gpt::Config c;
  c.width = 16;
  c.heads = 2;
  c.seq_len = 8;
  c.blocks = 4;  // sqrt: 2 segments of 2
  c.dropout = dropout;
  remat::nn::Generator init(7), batches(9);
  gpt::Model<float> model = gpt::Model<float>::random(c, init);
  const std::vector<remat::Parameter<float>*> parameters = model.parameters();
  remat::nn::AdamW<float> optimizer({{model.decayed_parameters()}, {model.undecayed_parameters(), 0.0}});
  remat::Tape<float> tape;
  const std::size_t tokens = 3 * static_cast<std::size_t>(c.seq_len);
  std::vector<int> ids(tokens), targets(tokens);
  std::vector<StepRecord> steps(6);
  for (std::size_t s = 0; s < steps.size(); ++s) {
    remat_alloc::Count count;
    for (std::size_t i = 0; i < tokens; ++i) {
      ids[i] = static_cast<int>(batches.below(256));
      targets[i] = static_cast<int>(batches.below(256));
    }
    const gpt::StepResult r = gpt::training_step(tape, model, parameters, optimizer, ids, targets,
                                                 {recompute, attention}, s, 1e-3 / static_cast<double>(s + 1), 1.0);
    steps[s].counts = count.stop();
    steps[s].after_backward.peak_bytes = r.peak_bytes;
    tape.clear();
    steps[s].after_step = tape.memory();
  }
  return steps;
}

class GptStep : public ::testing::TestWithParam<std::tuple<gpt::Recompute, gpt::Attention>> {};

TEST_P(GptStep, AllocatesNothingAfterTheFirstStep) {
  const auto [recompute, attention] = GetParam();
  expect_steady(run_gpt(recompute, attention, attention == gpt::Attention::fused ? 0.0 : 0.1));
}

INSTANTIATE_TEST_SUITE_P(Modes, GptStep,
                         ::testing::Combine(::testing::Values(gpt::Recompute::none, gpt::Recompute::block,
                                                              gpt::Recompute::attention, gpt::Recompute::dots_no_batch,
                                                              gpt::Recompute::sqrt),
                                            ::testing::Values(gpt::Attention::unfused, gpt::Attention::fused)),
                         [](const auto& info) {
                           return std::string(gpt::to_string(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == gpt::Attention::fused ? "_fused" : "_unfused");
                         });
#endif  // __SANITIZE_ADDRESS__

}  // namespace
