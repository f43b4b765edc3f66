// conv2d's float kernels on oneDNN (remat::backends::onednn): every conv2d case of tests/ops/conv_reference.txt
// against PyTorch's float64 values at float's accuracy, every policy bitwise equal to plain; gradients added into
// gradients already there; the temporary (blocked copies and oneDNN's scratchpad) counted in the peak, against the
// sizes oneDNN itself reports; estimate_memory equal to a real step; thread counts changed between the record and
// the backward; the value and dx bitwise equal at every thread count; the plan cache's bound, and plans made again
// after their eviction giving the same bits and bytes; the switch.
//
// Compiled twice: into tests/ops's program with oneDNN, and on its own without REMAT_USE_ONEDNN as
// tests_without_onednn (tests/CMakeLists.txt), so that the build without oneDNN is compiled and run too. There
// the tests that need oneDNN skip, and the others check the im2col fallback in float: the PyTorch cases under
// every policy (checkpointed steps), estimate_memory, the switch, and that no plan is kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "api_checks.hpp"
#include "nd_gradcheck.hpp"
#include "nd_reference.hpp"
#include "remat/remat.hpp"
#include "restore_threads.hpp"

#if defined(REMAT_TEST_WITHOUT_ONEDNN) && defined(REMAT_USE_ONEDNN)
#error "tests_without_onednn must be compiled without REMAT_USE_ONEDNN: it links remat::onednn (tests/CMakeLists.txt)"
#endif

#ifdef REMAT_USE_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace conv2d_onednn_test {

using remat::Conv2dOptions;
using remat::Shape;
using remat::Tape;
using remat::Var;
using remat_test::ReferenceCase;
using F = Var<float>;

/// Sets whether oneDNN is used for the test's lifetime, then puts back what was there.
class OnednnEnabled {
 public:
  explicit OnednnEnabled(bool on) : saved_(remat::backends::onednn::enabled()) {
    remat::backends::onednn::set_enabled(on);
  }
  ~OnednnEnabled() { remat::backends::onednn::set_enabled(saved_); }
  OnednnEnabled(const OnednnEnabled&) = delete;
  OnednnEnabled& operator=(const OnednnEnabled&) = delete;

 private:
  bool saved_;
};

using remat_test::RestoreThreads;

#define REMAT_SKIP_WITHOUT_ONEDNN() \
  if (!remat::backends::onednn::is_available()) GTEST_SKIP() << "remat was built without oneDNN"

Conv2dOptions options_of(const ReferenceCase& c) {
  const auto s = c.dims("stride"), p = c.dims("padding"), d = c.dims("dilation");
  return Conv2dOptions().stride({s[0], s[1]}).padding({p[0], p[1]}).dilation({d[0], d[1]}).groups(c.dims("groups")[0]);
}

F conv(const std::vector<F>& x, const Conv2dOptions& o) {
  return x.size() == 3 ? remat::conv2d(x[0], x[1], x[2], o) : remat::conv2d(x[0], x[1], o);
}

/// The peak over the forward's output of conv2d(x, w, options) recorded on a fresh float tape: its temporary.
std::size_t temporary_of(const Shape& xs, const Shape& ws, const Conv2dOptions& options) {
  Tape<float> tape;
  const remat::Matrix<float> xv = remat_test::nd_values(xs, 3).cast<float>(),
                             wv = remat_test::nd_values(ws, 4).cast<float>();
  const F x = tape.constant(xs, xv.data()), w = tape.constant(ws, wv.data());
  const std::size_t before = tape.memory().live_bytes;
  const F y = remat::conv2d(x, w, options);
  return tape.memory().peak_bytes - before - y.shape().numel() * sizeof(float);
}

std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

/// float's accuracy for sums of a few hundred products: |got − want| ≤ 1e-5 · max(1, max |want|).
::testing::AssertionResult close_in_float(const float* got, const std::vector<double>& want) {
  double scale = 1;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 1e-5 * scale))
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << ", PyTorch " << want[i];
  return ::testing::AssertionSuccess();
}

struct Result {
  std::vector<float> output;
  std::vector<std::vector<float>> grads;
};

Result run(const ReferenceCase& c, const remat_test::AnyPolicy* policy) {
  Tape<float> tape;
  std::vector<F> x;
  for (const auto& in : c.inputs) x.push_back(tape.variable(in.shape, to_float(in.values).data()));
  const Conv2dOptions o = options_of(c);
  F y;
  if (!policy)
    y = conv(x, o);
  else if (x.size() == 3)
    y = remat::checkpoint(
        [&](const F& a, const F& w, const F& b) {
          return conv({a, w, b}, o);
        },
        *policy)(x[0], x[1], x[2]);
  else
    y = remat::checkpoint([&](const F& a, const F& w) { return conv({a, w}, o); }, *policy)(x[0], x[1]);
  Result r;
  r.output.assign(y.value().data(), y.value().data() + y.value().size());
  tape.backward(remat::sum(remat::tanh(y) * tape.constant(c.output.shape, to_float(c.weight).data())));
  for (const F& v : x) r.grads.emplace_back(v.grad().data(), v.grad().data() + v.grad().size());
  return r;
}

TEST(Conv2dOnednn, MatchesPyTorchInFloatAndEveryPolicyIsBitwiseEqualToPlain) {
  // Without oneDNN: every case on im2col, in float.
  int cases = 0, on_onednn = 0;
  for (const ReferenceCase& c : remat_test::read_reference_cases(REMAT_SOURCE_DIR "/tests/ops/conv_reference.txt")) {
    if (c.name != "conv2d") continue;
    ++cases;
    SCOPED_TRACE("conv_reference.txt:" + std::to_string(c.line));
    {  // which kernel runs it: the temporaries differ
      const OnednnEnabled off(false);
      const std::size_t im2col = temporary_of(c.inputs[0].shape, c.inputs[1].shape, options_of(c));
      remat::backends::onednn::set_enabled(true);
      on_onednn += temporary_of(c.inputs[0].shape, c.inputs[1].shape, options_of(c)) != im2col;
    }
    const OnednnEnabled on(true);
    Tape<float> tape;
    std::vector<F> x;
    for (const auto& in : c.inputs) x.push_back(tape.variable(in.shape, to_float(in.values).data()));
    const F y = conv(x, options_of(c));
    ASSERT_EQ(y.shape(), c.output.shape);
    EXPECT_TRUE(close_in_float(y.value().data(), c.output.values));
    tape.backward(remat::sum(y * tape.constant(c.output.shape, to_float(c.weight).data())));
    for (const auto& [k, g] : c.grads)
      EXPECT_TRUE(close_in_float(x[static_cast<std::size_t>(k)].grad().data(), g.values)) << "input " << k;
    const Result plain = run(c, nullptr);
    for (const auto& [name, policy] : remat_test::every_policy()) {
      const Result r = run(c, &policy);
      EXPECT_TRUE(r.output == plain.output) << name;
      for (std::size_t k = 0; k < r.grads.size(); ++k)
        EXPECT_TRUE(std::memcmp(r.grads[k].data(), plain.grads[k].data(), r.grads[k].size() * sizeof(float)) == 0)
            << name << ", input " << k;
    }
  }
  EXPECT_EQ(cases, 19);
  if (remat::backends::onednn::is_available())
    EXPECT_GE(on_onednn, 5);  // the file's last five conv2d cases are shapes oneDNN's direct kernels run
  else
    EXPECT_EQ(on_onednn, 0);  // set_enabled(true) changes nothing
}

/// A convolution with padding 1 and its inputs; by default x [2,16,6,6] and w [16,16,3,3], which oneDNN runs in
/// blocked layouts.
struct Blocked {
  Shape xs{2, 16, 6, 6}, ws{16, 16, 3, 3};
  remat::Matrix<float> x = remat_test::nd_values(xs, 3).cast<float>(), w = remat_test::nd_values(ws, 4).cast<float>();
  Conv2dOptions options = Conv2dOptions().padding(1);
};
/// x [2,3,5,7] and w [16,3,3,3]: three input channels, which oneDNN's direct kernel reads in the plain layout while
/// it writes y in blocks of 16 channels. (Whether the scratch rounds each buffer up to 64 bytes changed the total on
/// no shape oneDNN runs here on its direct kernels: their blocked buffers are whole lines.)
Blocked odd() {
  Blocked b;
  b.xs = {2, 3, 5, 7};
  b.ws = {16, 3, 3, 3};
  b.x = remat_test::nd_values(b.xs, 3).cast<float>();
  b.w = remat_test::nd_values(b.ws, 4).cast<float>();
  return b;
}

/// d/dx and d/dw of sum(tanh(conv(x, w)) ⊙ conv(x ⊙ x, w)): x and w each feed two ops, so the second
/// convolution's gradients are added into gradients already there.
std::vector<std::vector<float>> shared_input_gradients(const Blocked& b) {
  Tape<float> tape;
  const F x = tape.variable(b.xs, b.x.data()), w = tape.variable(b.ws, b.w.data());
  const F y = remat::conv2d(x, w, b.options), z = remat::conv2d(x * x, w, b.options);
  tape.backward(remat::sum(remat::tanh(y) * z));
  return {{x.grad().data(), x.grad().data() + x.grad().size()}, {w.grad().data(), w.grad().data() + w.grad().size()}};
}

TEST(Conv2dOnednn, AddsIntoGradientsAlreadyThere) {
  REMAT_SKIP_WITHOUT_ONEDNN();
  const Blocked b;
  std::vector<std::vector<float>> onednn, im2col;
  {
    const OnednnEnabled on(true);
    onednn = shared_input_gradients(b);
  }
  {
    const OnednnEnabled off(false);
    im2col = shared_input_gradients(b);
  }
  for (std::size_t k = 0; k < 2; ++k) {
    double scale = 1, worst = 0;
    for (std::size_t i = 0; i < im2col[k].size(); ++i) {
      scale = std::max(scale, double(std::abs(im2col[k][i])));
      worst = std::max(worst, double(std::abs(onednn[k][i] - im2col[k][i])));
    }
    EXPECT_LE(worst, 1e-5 * scale) << "input " << k;
  }
}

#ifdef REMAT_USE_ONEDNN
/// The oracle of the op's temporary for b's convolution, in bytes, from oneDNN's own descriptors at
/// `threads` threads: the larger of the forward's and the backward's needs. Each needs a copy of every tensor its
/// primitives take in a layout other than the plain one (and of dx and dw always: they may be added into a
/// gradient already there) plus the primitive's scratchpad, each rounded up to 64 bytes. The backward keeps dY's
/// copies while it computes dx then dw.
std::size_t temporary_bytes(const Blocked& b, const Shape& ys, int threads) {
  using dnnl::memory;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  auto any = [](memory::dims d) { return memory::desc(d, memory::data_type::f32, memory::format_tag::any); };
  auto plain = [](memory::dims d) { return memory::desc(d, memory::data_type::f32, memory::format_tag::abcd); };
  auto dims = [](const Shape& s) { return memory::dims{s[0], s[1], s[2], s[3]}; };
  const memory::dims x = dims(b.xs), w = dims(b.ws), y = dims(ys), one{1, 1}, zero{0, 0};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, any(x),
                                      any(w), any(y), one, zero, one, one),
      attr, e);
  const dnnl::convolution_backward_data::primitive_desc data(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, any(x), any(w), any(y), one, zero, one,
                                            one),
      attr, e, fwd);
  const dnnl::convolution_backward_weights::primitive_desc weights(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any(x), any(w), any(y), one, zero,
                                               one, one),
      attr, e, fwd);
  omp_set_num_threads(saved);
  auto line = [](std::size_t bytes) { return (bytes + 63) / 64 * 64; };
  auto copy = [&](const memory::desc& d, const memory::desc& p) { return d == p ? 0 : line(d.get_size()); };
  const std::size_t forward = copy(fwd.src_desc(), plain(x)) + copy(fwd.weights_desc(), plain(w)) +
                              copy(fwd.dst_desc(), plain(y)) + line(fwd.scratchpad_desc().get_size());
  const std::size_t dy =
      copy(data.diff_dst_desc(), plain(y)) +
      (weights.diff_dst_desc() == data.diff_dst_desc() ? 0 : copy(weights.diff_dst_desc(), plain(y)));
  const std::size_t dx = copy(data.weights_desc(), plain(w)) + line(data.diff_src_desc().get_size()) +
                         line(data.scratchpad_desc().get_size());
  const std::size_t dw = copy(weights.src_desc(), plain(x)) + line(weights.diff_weights_desc().get_size()) +
                         line(weights.scratchpad_desc().get_size());
  return std::max(forward, dy + std::max(dx, dw));
}
#endif

TEST(Conv2dOnednn, ItsTemporaryCountsInThePeakAsOneDnnSizesIt) {
  REMAT_SKIP_WITHOUT_ONEDNN();
#ifdef REMAT_USE_ONEDNN
  const RestoreThreads restore;
  for (const Blocked& b : {Blocked(), odd()})
    for (const int threads : {1, 2}) {
      SCOPED_TRACE(remat::to_string(b.xs) + ", " + std::to_string(threads) + " threads");
      remat::set_num_threads(threads);
      for (const bool on : {true, false}) {
        const OnednnEnabled enabled(on);
        Tape<float> tape;
        const F x = tape.constant(b.xs, b.x.data()), w = tape.constant(b.ws, b.w.data());
        const std::size_t before = tape.memory().live_bytes;
        const F y = remat::conv2d(x, w, b.options);
        const std::size_t output = y.shape().numel() * sizeof(float);
        EXPECT_EQ(tape.memory().live_bytes, before + output);
        // im2col's temporary is [C·kH·kW, Hout·Wout].
        const std::size_t im2col =
            std::size_t(b.ws[1] * b.ws[2] * b.ws[3] * y.shape()[2] * y.shape()[3]) * sizeof(float);
        EXPECT_EQ(tape.memory().peak_bytes, before + output + (on ? temporary_bytes(b, y.shape(), threads) : im2col));
      }
    }
#endif
}

TEST(Conv2dOnednn, EstimateMemoryEqualsARealStep) {
  const OnednnEnabled on(true);
  const Blocked b;
  auto step = [&](Tape<float>& tape) {
    const F x = tape.variable(b.xs, b.x.data()), w = tape.variable(b.ws, b.w.data());
    const F h = remat::checkpoint([&](const F& a) { return remat::relu(remat::conv2d(a, w, b.options)); },
                                  remat::policies::nothing_saveable)(x);
    return remat::sum(remat::conv2d(h, w, b.options));
  };
  Tape<float> tape;
  const F loss = step(tape);
  const std::size_t saved = tape.memory().saved_bytes;
  tape.backward(loss);
  const remat::MemoryEstimate estimated = remat::estimate_memory<float>(step);
  EXPECT_EQ(estimated.saved_bytes, saved);
  EXPECT_EQ(estimated.peak_bytes, tape.memory().peak_bytes);
  EXPECT_EQ(estimated.replayed_ops, tape.memory().replayed_ops);
  EXPECT_GT(estimated.replayed_ops, 0u);
}

Result blocked_step(const Blocked& b, int record_threads, int backward_threads) {
  remat::set_num_threads(record_threads);
  Tape<float> tape;
  const F x = tape.variable(b.xs, b.x.data()), w = tape.variable(b.ws, b.w.data());
  const F y = remat::conv2d(x, w, b.options);
  const F loss = remat::sum(remat::tanh(y));
  remat::set_num_threads(backward_threads);
  tape.backward(loss);
  return {{y.value().data(), y.value().data() + y.value().size()},
          {{x.grad().data(), x.grad().data() + x.grad().size()}, {w.grad().data(), w.grad().data() + w.grad().size()}}};
}

TEST(Conv2dOnednn, ValueAndInputGradientAreBitwiseEqualAtEveryThreadCount) {
  // oneDNN's weight gradient sums the batch in per-thread parts: it may differ in the last bits between thread
  // counts (as OpenBLAS's multi-threaded products), so it is checked against the one-thread result's accuracy. An
  // op runs on the thread count it was recorded with: a backward at another count gives the recorded count's bits.
  REMAT_SKIP_WITHOUT_ONEDNN();
  const RestoreThreads restore;
  const OnednnEnabled on(true);
  const Blocked b;
  const Result one = blocked_step(b, 1, 1);
  for (const int record : {2, 3}) {
    SCOPED_TRACE("recorded at " + std::to_string(record) + " threads");
    const Result r = blocked_step(b, record, record);
    EXPECT_TRUE(r.output == one.output);
    EXPECT_TRUE(r.grads[0] == one.grads[0]);
    double scale = 1, worst = 0;
    for (std::size_t i = 0; i < one.grads[1].size(); ++i) {
      scale = std::max(scale, double(std::abs(one.grads[1][i])));
      worst = std::max(worst, double(std::abs(r.grads[1][i] - one.grads[1][i])));
    }
    EXPECT_LE(worst, 1e-5 * scale);
    for (const int backward : {1, 2, 3}) {
      const Result moved = blocked_step(b, record, backward);
      EXPECT_TRUE(moved.output == r.output && moved.grads == r.grads) << "backward at " << backward << " threads";
    }
  }
}

TEST(Conv2dOnednn, ShapesOnWhichOneDnnRoundsByThreadCountOrPadsChannelsRunOnIm2col) {
  // Found by a random search (x, w, stride, padding, dilation, groups): oneDNN runs these on its GEMM-based
  // convolution, whose value came out different at 1 and 3 threads, and a checkpoint replayed at another thread
  // count then differed from plain. The last is a one-channel input whose blocked copies are 16× its size.
  REMAT_SKIP_WITHOUT_ONEDNN();
  const RestoreThreads restore;
  struct Case {
    Shape xs, ws;
    Conv2dOptions options;
  };
  const Case cases[] = {
      {{2, 20, 17, 6}, {32, 5, 2, 5}, Conv2dOptions().stride({4, 3}).padding({1, 2}).dilation({1, 2}).groups(4)},
      {{3, 8, 2, 7}, {3, 8, 3, 4}, Conv2dOptions().stride({1, 2}).padding({1, 2}).dilation({1, 3})},
      {{8, 1, 64, 64}, {4, 1, 1, 1}, Conv2dOptions()},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(remat::to_string(c.xs) + " * " + remat::to_string(c.ws));
    remat::set_num_threads(2);
    std::size_t im2col = 0, onednn = 0;
    {
      const OnednnEnabled off(false);
      im2col = temporary_of(c.xs, c.ws, c.options);
    }
    {
      const OnednnEnabled on(true);
      onednn = temporary_of(c.xs, c.ws, c.options);
    }
    EXPECT_EQ(onednn, im2col);  // the same kernel
    // And so the value is the same at 1 and 3 threads, and a checkpoint recorded at 3 threads and replayed at 1
    // gives the plain step's gradient.
    const OnednnEnabled on(true);
    const remat::Matrix<float> xv = remat_test::nd_values(c.xs, 5).cast<float>(),
                               wv = remat_test::nd_values(c.ws, 6).cast<float>();
    auto run = [&](int record_threads, bool checkpointed) {
      remat::set_num_threads(record_threads);
      Tape<float> tape;
      const F x = tape.variable(c.xs, xv.data()), w = tape.variable(c.ws, wv.data());
      auto block = [&](const F& a) { return remat::tanh(remat::conv2d(a, w, c.options)); };
      const F y = checkpointed ? remat::checkpoint(block, remat::policies::nothing_saveable)(x) : block(x);
      remat::set_num_threads(1);
      tape.backward(remat::sum(y));
      return Result{{y.value().data(), y.value().data() + y.value().size()},
                    {{x.grad().data(), x.grad().data() + x.grad().size()}}};
    };
    const Result plain1 = run(1, false), plain3 = run(3, false), checkpointed3 = run(3, true);
    EXPECT_TRUE(plain1.output == plain3.output);
    EXPECT_TRUE(checkpointed3.grads == plain3.grads);
  }
}

TEST(Conv2dOnednn, AnOpKeepsTheKernelsItWasRecordedWith) {
  const Blocked b;
  auto step = [&](bool switch_off_before_backward) {
    const OnednnEnabled on(true);
    Tape<float> tape;
    const F x = tape.variable(b.xs, b.x.data()), w = tape.variable(b.ws, b.w.data());
    const F y = remat::checkpoint([&](const F& a) { return remat::tanh(remat::conv2d(a, w, b.options)); },
                                  remat::policies::nothing_saveable)(x);
    if (switch_off_before_backward) remat::backends::onednn::set_enabled(false);
    tape.backward(remat::sum(y));
    return std::vector<float>(x.grad().data(), x.grad().data() + x.grad().size());
  };
  EXPECT_TRUE(step(true) == step(false));
}

/// Sets the plan cache's capacity for the test's lifetime, then puts back what was there.
class PlanCapacity {
 public:
  explicit PlanCapacity(std::size_t plans) : saved_(remat::backends::onednn::plan_cache_capacity()) {
    remat::backends::onednn::set_plan_cache_capacity(plans);
  }
  ~PlanCapacity() { remat::backends::onednn::set_plan_cache_capacity(saved_); }
  PlanCapacity(const PlanCapacity&) = delete;
  PlanCapacity& operator=(const PlanCapacity&) = delete;

 private:
  std::size_t saved_;
};

/// b with a batch of n: another convolution shape, so another plan.
Blocked batch_of(std::int64_t n) {
  Blocked b;
  b.xs = {n, 16, 6, 6};
  b.x = remat_test::nd_values(b.xs, 3).cast<float>();
  return b;
}

/// A step on b (conv2d then tanh, or the same checkpointed with nothing_saveable, whose backward replays the
/// convolution), its value and gradients, and the tape's peak bytes after the backward.
struct Step {
  Result result;
  std::size_t peak = 0;
};
Step conv_step(const Blocked& b, bool checkpointed) {
  Tape<float> tape;
  const F x = tape.variable(b.xs, b.x.data()), w = tape.variable(b.ws, b.w.data());
  auto block = [&](const F& a) { return remat::tanh(remat::conv2d(a, w, b.options)); };
  const F y = checkpointed ? remat::checkpoint(block, remat::policies::nothing_saveable)(x) : block(x);
  tape.backward(remat::sum(y));
  return {
      {{y.value().data(), y.value().data() + y.value().size()},
       {{x.grad().data(), x.grad().data() + x.grad().size()}, {w.grad().data(), w.grad().data() + w.grad().size()}}},
      tape.memory().peak_bytes};
}

TEST(Conv2dOnednn, PlanCacheHoldsAtMostItsCapacity) {
  REMAT_SKIP_WITHOUT_ONEDNN();
  EXPECT_EQ(remat::backends::onednn::plan_cache_capacity(), 64u);  // the default
  const OnednnEnabled on(true);
  const PlanCapacity capacity(3);
  EXPECT_EQ(remat::backends::onednn::plan_cache_capacity(), 3u);
  EXPECT_LE(remat::backends::onednn::cached_plans(), 3u);
  for (std::int64_t n = 1; n <= 6; ++n) {
    conv_step(batch_of(n), false);
    EXPECT_LE(remat::backends::onednn::cached_plans(), 3u) << "batch " << n;
  }
  EXPECT_EQ(remat::backends::onednn::cached_plans(), 3u);
  remat::backends::onednn::set_plan_cache_capacity(1);  // evicts at once
  EXPECT_EQ(remat::backends::onednn::cached_plans(), 1u);
  remat::backends::onednn::set_plan_cache_capacity(0);  // keeps none: every call makes its plan
  EXPECT_EQ(remat::backends::onednn::cached_plans(), 0u);
  const Step kept = conv_step(batch_of(2), true);
  EXPECT_EQ(remat::backends::onednn::cached_plans(), 0u);
  remat::backends::onednn::set_plan_cache_capacity(3);
  const Step cached = conv_step(batch_of(2), true);
  EXPECT_TRUE(kept.result.output == cached.result.output && kept.result.grads == cached.result.grads);
  EXPECT_EQ(kept.peak, cached.peak);
}

TEST(Conv2dOnednn, MoreShapesThanThePlanCacheHoldsGiveTheSameBitsEveryTime) {
  // Seven shapes through a cache of three, in turn: from the second round on, every plan is made again after its
  // eviction, and gives the first round's values, gradients and peak bytes bitwise.
  REMAT_SKIP_WITHOUT_ONEDNN();
  const OnednnEnabled on(true);
  const PlanCapacity capacity(3);
  std::vector<Step> first;
  for (std::int64_t n = 1; n <= 7; ++n) first.push_back(conv_step(batch_of(n), n % 2 == 0));
  for (int round = 0; round < 2; ++round)
    for (std::int64_t n = 1; n <= 7; ++n) {
      SCOPED_TRACE("batch " + std::to_string(n) + ", round " + std::to_string(round + 2));
      const Step again = conv_step(batch_of(n), n % 2 == 0);
      const Step& want = first[static_cast<std::size_t>(n - 1)];
      EXPECT_TRUE(again.result.output == want.result.output);
      EXPECT_TRUE(again.result.grads == want.result.grads);
      EXPECT_EQ(again.peak, want.peak);
      EXPECT_LE(remat::backends::onednn::cached_plans(), 3u);
    }
}

TEST(Conv2dOnednn, AnOpWhosePlanWasEvictedBeforeItsBackwardGetsItsGradient) {
  // Record (plain, and checkpointed so that the backward replays the convolution too), run other shapes until
  // the op's plan is evicted, then run the backward: the same bits as a backward right after the record.
  REMAT_SKIP_WITHOUT_ONEDNN();
  const OnednnEnabled on(true);
  const PlanCapacity capacity(2);
  const Blocked b = batch_of(2);
  for (const bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "checkpointed" : "plain");
    const Step want = conv_step(b, checkpointed);
    Tape<float> tape;
    const F x = tape.variable(b.xs, b.x.data()), w = tape.variable(b.ws, b.w.data());
    auto block = [&](const F& a) { return remat::tanh(remat::conv2d(a, w, b.options)); };
    const F y = checkpointed ? remat::checkpoint(block, remat::policies::nothing_saveable)(x) : block(x);
    const F loss = remat::sum(y);
#ifdef REMAT_USE_ONEDNN
    // The op's plan, watched: the other shapes must evict it, so that the backward makes it again.
    remat::detail::Conv2dOp::Params params = remat::detail::conv2d_params(b.options);
    const Shape in[2] = {b.xs, b.ws};
    remat::detail::choose_conv2d_kernel<float>(params, in);
    ASSERT_GT(params.onednn_threads, 0);
    const std::weak_ptr<const remat::detail::onednn::ConvPlan> recorded = remat::detail::onednn::plan(
        remat::detail::Conv2dOp::onednn_key(remat::detail::Conv2dOp::geometry(in, params), params));
#endif
    for (std::int64_t n = 3; n <= 6; ++n) conv_step(batch_of(n), true);
#ifdef REMAT_USE_ONEDNN
    EXPECT_TRUE(recorded.expired());
#endif
    tape.backward(loss);
    EXPECT_TRUE(std::vector<float>(y.value().data(), y.value().data() + y.value().size()) == want.result.output);
    EXPECT_TRUE(std::vector<float>(x.grad().data(), x.grad().data() + x.grad().size()) == want.result.grads[0]);
    EXPECT_TRUE(std::vector<float>(w.grad().data(), w.grad().data() + w.grad().size()) == want.result.grads[1]);
    EXPECT_EQ(tape.memory().peak_bytes, want.peak);
  }
}

TEST(Conv2dOnednn, TapesOnTwoThreadsEvictEachOthersPlansAndGetTheirOwnBits) {
  // Each thread may run its own tape: with a cache of one plan, each call of one thread evicts the plan the other
  // may be running on (which lives on while it does) and makes its own again.
  REMAT_SKIP_WITHOUT_ONEDNN();
  const OnednnEnabled on(true);
  const PlanCapacity capacity(1);
  const std::int64_t batches[2][2] = {{1, 3}, {2, 4}};
  std::vector<Step> want[2];
  for (int t = 0; t < 2; ++t)
    for (const std::int64_t n : batches[t]) want[t].push_back(conv_step(batch_of(n), n % 2 == 0));
  bool same[2] = {true, true};
  auto work = [&](int t) {
    for (int i = 0; i < 8; ++i) {
      const Step got = conv_step(batch_of(batches[t][i % 2]), batches[t][i % 2] % 2 == 0);
      const Step& w = want[t][static_cast<std::size_t>(i % 2)];
      same[t] =
          same[t] && got.result.output == w.result.output && got.result.grads == w.result.grads && got.peak == w.peak;
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_TRUE(same[0]);
  EXPECT_TRUE(same[1]);
  EXPECT_LE(remat::backends::onednn::cached_plans(), 1u);
}

TEST(Conv2dOnednn, WithoutOneDnnNoPlanIsKept) {
  if (remat::backends::onednn::is_available()) GTEST_SKIP() << "remat was built with oneDNN";
  const OnednnEnabled on(true);
  const PlanCapacity capacity(3);
  EXPECT_EQ(remat::backends::onednn::plan_cache_capacity(), 3u);
  const Step step = conv_step(batch_of(2), true);
  EXPECT_EQ(step.result.output.size(), 2u * 16 * 6 * 6);
  EXPECT_EQ(remat::backends::onednn::cached_plans(), 0u);
}

TEST(Conv2dOnednn, TheSwitch) {
  const OnednnEnabled restore(remat::backends::onednn::enabled());
  EXPECT_EQ(remat::backends::onednn::enabled(), remat::backends::onednn::is_available());
  remat::backends::onednn::set_enabled(false);
  EXPECT_FALSE(remat::backends::onednn::enabled());
  remat::backends::onednn::set_enabled(true);
  EXPECT_EQ(remat::backends::onednn::enabled(), remat::backends::onednn::is_available());
}

}  // namespace conv2d_onednn_test
