// batch_norm against PyTorch 1.13 float64 values (tests/ops/batch_norm_reference.txt, written by
// tests/ops/make_batch_norm_reference.py), in training and evaluation, plain and under every policy (bitwise equal to
// plain); nn::BatchNorm2d against PyTorch's module over three training steps and an evaluation (momentum None and
// 0.1, the same file); its running statistics updated once per recorded step and never by a checkpoint's replay, a
// memory budget's regeneration or a shapes-only estimate, and once per run of a CapturedStep; gradchecks; what
// policies see; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "api_checks.hpp"
#include "expect_error.hpp"
#include "nd_gradcheck.hpp"
#include "nd_reference.hpp"
#include "remat/remat.hpp"

namespace batch_norm_test {

using remat::BatchNormFuncOptions;
using remat::Parameter;
using remat::Shape;
using remat::Tape;
using remat::Var;
using remat_test::ReferenceCase;
using V = Var<double>;
using Matrix = remat::Matrix<double>;

bool bitwise(const Matrix& a, const Matrix& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(double) * a.size()) == 0;
}

Matrix row(const std::vector<double>& v) {
  return Eigen::Map<const Matrix>(v.data(), 1, static_cast<remat::Index>(v.size()));
}

/// One reference case: x (and weight, bias) as variables, the running statistics as Parameters.
struct Model {
  const ReferenceCase& c;
  bool training() const { return c.ints("training").at(0) != 0; }
  bool affine() const { return c.ints("affine").at(0) != 0; }
  Parameter<double> running_mean{row(c.inputs[c.inputs.size() - 2].values)};
  Parameter<double> running_var{row(c.inputs[c.inputs.size() - 1].values)};

  V forward(const std::vector<V>& x) {
    BatchNormFuncOptions<double> o;
    o.training(training()).momentum(c.number("momentum")).eps(c.number("eps"));
    if (affine()) o.weight(x[1]).bias(x[2]);
    return remat::batch_norm(x[0], &running_mean, &running_var, o);
  }
};

struct Result {
  std::vector<double> output;
  std::vector<Matrix> grads;
  Matrix running_mean, running_var;
};

/// The case's op, behind a tanh (whose backward reads its output), plain or checkpointed under `policy`.
Result run(const ReferenceCase& c, const remat_test::AnyPolicy* policy) {
  Model m{c};
  Tape<double> tape;
  std::vector<V> x;
  const std::size_t differentiable = m.affine() ? 3 : 1;
  for (std::size_t k = 0; k < differentiable; ++k)
    x.push_back(tape.variable(c.inputs[k].shape, c.inputs[k].values.data()));
  V y;
  if (!policy)
    y = m.forward(x);
  else if (x.size() == 1)
    y = remat::checkpoint([&](const V& a) { return m.forward({a}); }, *policy)(x[0]);
  else
    y = remat::checkpoint(
        [&](const V& a, const V& w, const V& b) {
          return m.forward({a, w, b});
        },
        *policy)(x[0], x[1], x[2]);
  Result r;
  r.output.assign(y.value().data(), y.value().data() + y.value().size());
  tape.backward(remat::sum(remat::tanh(y) * tape.constant(c.output.shape, c.weight.data())));
  for (const V& v : x) r.grads.push_back(v.grad());
  r.running_mean = m.running_mean.value();
  r.running_var = m.running_var.value();
  return r;
}

TEST(BatchNorm, MatchesPyTorchInTrainingAndEvaluationAndEveryPolicyIsBitwiseEqualToPlain) {
  std::vector<ReferenceCase> cases;
  for (ReferenceCase& c : remat_test::read_reference_cases(REMAT_SOURCE_DIR "/tests/ops/batch_norm_reference.txt"))
    if (c.name == "batch_norm") cases.push_back(std::move(c));  // not the module's steps (batch_norm2d_step)
  ASSERT_EQ(cases.size(), 7u);
  for (const ReferenceCase& c : cases) {
    SCOPED_TRACE("batch_norm_reference.txt:" + std::to_string(c.line));
    Model m{c};
    Tape<double> tape;
    std::vector<V> x;
    for (std::size_t k = 0; k < (m.affine() ? 3u : 1u); ++k)
      x.push_back(tape.variable(c.inputs[k].shape, c.inputs[k].values.data()));
    const V y = m.forward(x);
    ASSERT_EQ(y.shape(), c.output.shape);
    EXPECT_TRUE(remat_test::close_to_reference(y.value(), c.output.values));
    tape.backward(remat::sum(y * tape.constant(c.output.shape, c.weight.data())));
    for (const auto& [k, g] : c.grads)
      EXPECT_TRUE(remat_test::close_to_reference(x[static_cast<std::size_t>(k)].grad(), g.values)) << k;
    if (m.training()) {
      EXPECT_TRUE(remat_test::close_to_reference(m.running_mean.value(), c.attributes.at("running_mean_after")));
      EXPECT_TRUE(remat_test::close_to_reference(m.running_var.value(), c.attributes.at("running_var_after")));
    } else {  // evaluation reads them and leaves them as they were
      EXPECT_TRUE(bitwise(m.running_mean.value(), row(c.inputs[c.inputs.size() - 2].values)));
      EXPECT_TRUE(bitwise(m.running_var.value(), row(c.inputs[c.inputs.size() - 1].values)));
    }
    const Result plain = run(c, nullptr);
    for (const auto& [name, policy] : remat_test::every_policy()) {
      const Result r = run(c, &policy);
      EXPECT_TRUE(r.output == plain.output) << name;
      for (std::size_t k = 0; k < r.grads.size(); ++k) EXPECT_TRUE(bitwise(r.grads[k], plain.grads[k])) << name << k;
      EXPECT_TRUE(bitwise(r.running_mean, plain.running_mean)) << name;
      EXPECT_TRUE(bitwise(r.running_var, plain.running_var)) << name;
    }
  }
}

/// A [3, 3, 3, 3] convolution weight of values from remat_test::nd_values(seed) · 0.3.
remat::Tensor<float, 4> kernel(std::uint64_t seed) {
  remat::Tensor<float, 4> w(3, 3, 3, 3);
  const remat::Matrix<float> v = remat_test::nd_values(Shape{3, 3, 3, 3}, seed).cast<float>() * 0.3f;
  std::copy(v.data(), v.data() + v.size(), w.data());
  return w;
}

/// A ResNet-like stage on x [4, 3, 6, 6]: conv → batch_norm → relu twice, the running statistics of both in
/// `stats`, each step recorded on a fresh tape from the same Parameters.
struct Stage {
  Parameter<float> w1{kernel(1)}, w2{kernel(2)};
  Parameter<float> gamma{remat::Tensor<float, 1>(3)}, beta{remat::Tensor<float, 1>(3)};
  Parameter<float> mean1{remat::Tensor<float, 1>(3)}, var1{remat::Tensor<float, 1>(3)};
  Parameter<float> mean2{remat::Tensor<float, 1>(3)}, var2{remat::Tensor<float, 1>(3)};
  remat::Matrix<float> input = remat_test::nd_values(Shape{4, 3, 6, 6}, 7).cast<float>();

  Stage() {
    gamma.mutable_value().setConstant(1.5f);
    beta.mutable_value().setConstant(0.25f);
    for (Parameter<float>* p : {&mean1, &mean2}) p->mutable_value().setZero();
    for (Parameter<float>* p : {&var1, &var2}) p->mutable_value().setOnes();
  }
  Var<float> block(Tape<float>& tape, const Var<float>& x) {
    const Var<float> g = tape.variable(gamma), b = tape.variable(beta);
    auto bn = [&](const Var<float>& h, Parameter<float>& m, Parameter<float>& v) {
      return remat::batch_norm(h, &m, &v, BatchNormFuncOptions<float>().weight(g).bias(b).training(true));
    };
    const Var<float> c1 = remat::conv2d(x, tape.variable(w1), remat::Conv2dOptions().padding(1));
    const Var<float> h = remat::relu(bn(c1, mean1, var1));
    return remat::relu(bn(remat::conv2d(h, tape.variable(w2), remat::Conv2dOptions().padding(1)), mean2, var2));
  }
  std::vector<remat::Matrix<float>> statistics() const {
    return {mean1.value(), var1.value(), mean2.value(), var2.value()};
  }
};

/// One step's loss, with the stage checkpointed under `policy` (or plain), and the memory figures.
/// `depth` blocks in a row (each updating the same statistics).
remat::MemoryStats step(Stage& s, Tape<float>& tape, const remat_test::AnyPolicy* policy, int depth = 1) {
  Var<float> y = tape.constant(Shape{4, 3, 6, 6}, s.input.data());
  for (int k = 0; k < depth; ++k)
    y = policy ? remat::checkpoint([&](const Var<float>& in) { return s.block(tape, in); }, *policy)(y)
               : s.block(tape, y);
  tape.backward(remat::sum(y));
  return tape.memory();
}

TEST(BatchNorm, RunningStatisticsChangeOncePerRecordedStepNotWhenACheckpointReplaysIt) {
  Stage plain;
  {
    Tape<float> tape;
    step(plain, tape, nullptr);
  }
  const auto once = plain.statistics();
  EXPECT_FALSE(bitwise(once[0].cast<double>(), Stage().statistics()[0].cast<double>()));  // the step moved them
  for (const auto& [name, policy] : remat_test::every_policy()) {
    Stage s;
    Tape<float> tape;
    const remat::MemoryStats m = step(s, tape, &policy);
    const auto got = s.statistics();
    for (std::size_t k = 0; k < got.size(); ++k)
      EXPECT_TRUE(bitwise(got[k].cast<double>(), once[k].cast<double>())) << name << ", statistic " << k;
    if (name == "nothing_saveable") {  // at least conv, batch_norm, relu, conv and batch_norm ran again
      EXPECT_GE(m.replayed_ops, 5u);
    }
  }
  // A second recorded step moves them again: once per step.
  {
    Tape<float> tape;
    step(plain, tape, nullptr);
  }
  EXPECT_FALSE(bitwise(plain.statistics()[0].cast<double>(), once[0].cast<double>()));
}

TEST(BatchNorm, AMemoryBudgetsRegenerationsDoNotUpdateTheRunningStatistics) {
  Stage plain, budget;
  std::size_t peak = 0;
  {
    Tape<float> tape;
    peak = step(plain, tape, nullptr, 6).peak_bytes;
  }
  Tape<float> tape;
  tape.set_memory_budget(peak / 2);  // regenerates batch_norms (at 70 % only others)
  const remat::MemoryStats m = step(budget, tape, nullptr, 6);
  EXPECT_GT(m.rematerialized_ops, 0u) << "the budget must regenerate something for this test to mean anything";
  const auto want = plain.statistics(), got = budget.statistics();
  for (std::size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(bitwise(got[k].cast<double>(), want[k].cast<double>())) << k;
}

/// The stage's block, checkpointed (nothing_saveable), in a CapturedStep recorded and replayed twice: three runs.
template <class S>
void three_captured_runs(S& stage) {
  remat::CapturedStep<float> run([&](Tape<float>& tape) {
    const Var<float> x = tape.constant(Shape{4, 3, 6, 6}, stage.input.data());
    return remat::sum(remat::checkpoint([&](const Var<float>& in) { return stage.block(tape, in); },
                                        remat::policies::nothing_saveable)(x));
  });
  run.replay();
  run.replay();
}

TEST(BatchNorm, ACapturedStepUpdatesThemOncePerRun) {
  Stage recorded, captured;
  for (int k = 0; k < 3; ++k) {
    Tape<float> tape;
    step(recorded, tape, nullptr);
  }
  three_captured_runs(captured);
  const auto want = recorded.statistics(), got = captured.statistics();
  for (std::size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(bitwise(got[k].cast<double>(), want[k].cast<double>())) << k;
}

TEST(BatchNorm, AShapesOnlyEstimateLeavesThemAlone) {
  Stage s;
  const auto before = s.statistics();
  Tape<float> tape(remat::shapes_only);
  const remat_test::AnyPolicy nothing = remat::policies::nothing_saveable;
  step(s, tape, &nothing);
  const auto after = s.statistics();
  for (std::size_t k = 0; k < after.size(); ++k)
    EXPECT_TRUE(bitwise(after[k].cast<double>(), before[k].cast<double>()));
}

/// The Stage as nn::BatchNorm2d layers: the first with momentum 0.1, the second with momentum None (the cumulative
/// average, whose update weight 1/num_batches_tracked is read from the counter as the op runs).
struct LayerStage {
  Parameter<float> w1{kernel(1)}, w2{kernel(2)};
  remat::nn::BatchNorm2d<float> bn1{3}, bn2{3, 1e-5, std::nullopt};
  remat::Matrix<float> input = remat_test::nd_values(Shape{4, 3, 6, 6}, 7).cast<float>();

  Var<float> block(Tape<float>& tape, const Var<float>& x) {
    const Var<float> c1 = remat::conv2d(x, tape.variable(w1), remat::Conv2dOptions().padding(1));
    const Var<float> h = remat::relu(bn1.forward(tape, c1));
    return remat::relu(bn2.forward(tape, remat::conv2d(h, tape.variable(w2), remat::Conv2dOptions().padding(1))));
  }
  /// One step: `depth` blocks in a row (each counting in the same layers), checkpointed under `policy` or plain.
  remat::MemoryStats step(Tape<float>& tape, const remat_test::AnyPolicy* policy, int depth = 1) {
    Var<float> y = tape.constant(Shape{4, 3, 6, 6}, input.data());
    for (int k = 0; k < depth; ++k)
      y = policy ? remat::checkpoint([&](const Var<float>& in) { return block(tape, in); }, *policy)(y)
                 : block(tape, y);
    tape.backward(remat::sum(y));
    return tape.memory();
  }
  std::vector<remat::Matrix<float>> statistics() const {
    return {bn1.running_mean.value(), bn1.running_var.value(), bn2.running_mean.value(), bn2.running_var.value()};
  }
  std::vector<std::int64_t> counters() const { return {bn1.num_batches_tracked(), bn2.num_batches_tracked()}; }
};

/// Whether `got`'s statistics and counters are bitwise `want`'s.
void expect_same_state(const LayerStage& got, const LayerStage& want, const std::string& what) {
  const auto a = got.statistics(), b = want.statistics();
  for (std::size_t k = 0; k < a.size(); ++k)
    EXPECT_TRUE(bitwise(a[k].cast<double>(), b[k].cast<double>())) << what << ", statistic " << k;
  EXPECT_EQ(got.counters(), want.counters()) << what;
}

TEST(BatchNorm2dCounter, CountsOncePerRecordedStepUnderEveryCheckpointMode) {
  LayerStage plain;
  for (int k = 0; k < 3; ++k) {
    Tape<float> tape;
    plain.step(tape, nullptr);
  }
  EXPECT_EQ(plain.counters(), (std::vector<std::int64_t>{3, 3}));
  for (const auto& [name, policy] : remat_test::every_policy()) {
    LayerStage s;
    for (int k = 0; k < 3; ++k) {
      Tape<float> tape;
      const remat::MemoryStats m = s.step(tape, &policy);
      if (name == "nothing_saveable") {
        EXPECT_GE(m.replayed_ops, 5u);  // both batch norms ran again
      }
    }
    expect_same_state(s, plain, name);
  }
  {  // a memory budget that regenerates batch norms: counted once per block still
    LayerStage deep, budget;
    std::size_t peak = 0;
    {
      Tape<float> tape;
      peak = deep.step(tape, nullptr, 6).peak_bytes;
    }
    EXPECT_EQ(deep.counters(), (std::vector<std::int64_t>{6, 6}));
    Tape<float> tape;
    tape.set_memory_budget(peak / 2);
    EXPECT_GT(budget.step(tape, nullptr, 6).rematerialized_ops, 0u);
    expect_same_state(budget, deep, "memory budget");
  }
  {  // a CapturedStep counts once per run (the record and each replay), checkpointed replays not
    LayerStage captured;
    three_captured_runs(captured);
    expect_same_state(captured, plain, "CapturedStep");
  }
  {  // a shapes-only estimate and evaluation count nothing
    LayerStage s;
    Tape<float> estimate(remat::shapes_only);
    const remat_test::AnyPolicy nothing = remat::policies::nothing_saveable;
    s.step(estimate, &nothing);
    Tape<float> evaluation;
    evaluation.set_training(false);
    s.block(evaluation, evaluation.constant(Shape{4, 3, 6, 6}, s.input.data()));
    expect_same_state(s, LayerStage(), "estimate and evaluation");
  }
}

TEST(BatchNorm2dCounter, MomentumNoneIsTheCumulativeAverageOfTheBatchStatistics) {
  // Three batches of [2, 2, 3] (C = 2, 6 values per channel): after them, PyTorch's momentum=None leaves
  // running_mean = the mean of the three batch means and running_var = the mean of the three unbiased variances
  // (the initial 0 and 1 forgotten at the first step, whose weight is 1/1), num_batches_tracked = 3.
  remat::nn::BatchNorm2d<double> bn(2, 1e-5, std::nullopt);
  EXPECT_FALSE(bn.momentum().has_value());
  double mean[2] = {0, 0}, var[2] = {0, 0};
  for (int b = 0; b < 3; ++b) {
    const Matrix x = remat_test::nd_values(Shape{2, 2, 3}, 20 + static_cast<std::uint64_t>(b), -1, 2 + b);
    for (int c = 0; c < 2; ++c) {  // by hand: x is row-major [n, c, s]
      double sum = 0, squares = 0;
      for (int n = 0; n < 2; ++n)
        for (int s = 0; s < 3; ++s) sum += x.data()[(n * 2 + c) * 3 + s];
      const double mu = sum / 6;
      for (int n = 0; n < 2; ++n)
        for (int s = 0; s < 3; ++s) squares += std::pow(x.data()[(n * 2 + c) * 3 + s] - mu, 2);
      mean[c] += mu / 3;
      var[c] += squares / 5 / 3;
    }
    Tape<double> tape;
    bn.forward(tape, tape.constant(Shape{2, 2, 3}, x.data()));
    EXPECT_EQ(bn.num_batches_tracked(), b + 1);
    if (b == 0) {  // weight 1/1: the first batch's statistics exactly replace the initial ones
      EXPECT_NEAR(bn.running_var.value()(0, 0), var[0] * 3, 1e-15);
    }
  }
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(bn.running_mean.value()(0, c), mean[c], 1e-14) << c;
    EXPECT_NEAR(bn.running_var.value()(0, c), var[c], 1e-14) << c;
  }
  // A count set by hand (as a loaded one) continues: the next weight is 1/(4 + 1).
  bn.num_batches_tracked() = 4;
  const Matrix before = bn.running_mean.value();
  const Matrix x = remat_test::nd_values(Shape{2, 2, 3}, 30);
  Tape<double> tape;
  bn.forward(tape, tape.constant(Shape{2, 2, 3}, x.data()));
  EXPECT_EQ(bn.num_batches_tracked(), 5);
  const double mu0 = (x.data()[0] + x.data()[1] + x.data()[2] + x.data()[6] + x.data()[7] + x.data()[8]) / 6;
  EXPECT_NEAR(bn.running_mean.value()(0, 0), 0.8 * before(0, 0) + 0.2 * mu0, 1e-14);
  // A negative count is refused before anything is recorded or counted.
  bn.num_batches_tracked() = -1;
  const std::size_t size = tape.size();
  remat_test::expect_error_naming<remat::domain_error>(
      [&] {
        bn.forward(tape, tape.constant(Shape{2, 2, 3}, x.data()));
      },
      {"nn::BatchNorm2d", "num_batches_tracked is -1"});
  EXPECT_EQ(bn.num_batches_tracked(), -1);
  EXPECT_EQ(tape.size(), size + 1);  // the constant only
}

/// Copies a reference tensor's values into `p`, whose size they must have.
void assign(Parameter<double>& p, const std::vector<double>& values) {
  ASSERT_EQ(p.value().size(), static_cast<remat::Index>(values.size()));
  std::copy(values.begin(), values.end(), p.mutable_value().data());
}

TEST(BatchNorm2dCounter, MatchesPyTorchsModuleOverThreeTrainingStepsAndAnEvaluationWithMomentumNoneAnd01) {
  // The file's batch_norm2d_step cases: two runs of torch.nn.BatchNorm2d(3) (momentum None, then 0.1), each three
  // training steps and one evaluation on new inputs. One nn::BatchNorm2d<double> per run goes through the same
  // steps, each on a fresh tape, carrying its running statistics and count from step to step as PyTorch's module.
  std::vector<ReferenceCase> steps;
  for (ReferenceCase& c : remat_test::read_reference_cases(REMAT_SOURCE_DIR "/tests/ops/batch_norm_reference.txt"))
    if (c.name == "batch_norm2d_step") steps.push_back(std::move(c));
  ASSERT_EQ(steps.size(), 8u);
  for (std::size_t run = 0; run < 2; ++run) {
    const ReferenceCase& first = steps[run * 4];
    const std::vector<double>& m = first.attributes.at("momentum");
    const std::optional<double> momentum = m.empty() ? std::nullopt : std::optional<double>(m.at(0));
    EXPECT_EQ(momentum.has_value(), run == 1);  // None first, then 0.1
    remat::nn::BatchNorm2d<double> bn(first.inputs[0].shape[1], first.number("eps"), momentum);
    assign(bn.weight, first.inputs[1].values);
    assign(bn.bias, first.inputs[2].values);
    for (int step = 1; step <= 4; ++step) {
      const ReferenceCase& c = steps[run * 4 + static_cast<std::size_t>(step) - 1];
      SCOPED_TRACE("batch_norm_reference.txt:" + std::to_string(c.line));
      ASSERT_EQ(c.ints("step").at(0), step);
      ASSERT_EQ(c.attributes.at("momentum"), m);
      // The state the step starts from: the module's weight and bias (which no step changes), and running
      // statistics close to those PyTorch's module had (carried over from the previous step, never reset here).
      EXPECT_TRUE(bitwise(bn.weight.value(), row(c.inputs[1].values)));
      EXPECT_TRUE(bitwise(bn.bias.value(), row(c.inputs[2].values)));
      EXPECT_TRUE(remat_test::close_to_reference(bn.running_mean.value(), c.inputs[3].values));
      EXPECT_TRUE(remat_test::close_to_reference(bn.running_var.value(), c.inputs[4].values));
      bn.weight.zero_grad();
      bn.bias.zero_grad();
      Tape<double> tape;
      tape.set_training(c.ints("training").at(0) != 0);
      const V x = tape.variable(c.inputs[0].shape, c.inputs[0].values.data());
      const V y = bn.forward(tape, x);
      ASSERT_EQ(y.shape(), c.output.shape);
      EXPECT_TRUE(remat_test::close_to_reference(y.value(), c.output.values));
      tape.backward(remat::sum(y * tape.constant(c.output.shape, c.weight.data())));
      EXPECT_TRUE(remat_test::close_to_reference(x.grad(), c.grads.at(0).values));
      EXPECT_TRUE(remat_test::close_to_reference(bn.weight.grad(), c.grads.at(1).values));
      EXPECT_TRUE(remat_test::close_to_reference(bn.bias.grad(), c.grads.at(2).values));
      EXPECT_EQ(bn.num_batches_tracked(), static_cast<std::int64_t>(c.number("num_batches_tracked_after")));
      EXPECT_TRUE(remat_test::close_to_reference(bn.running_mean.value(), c.attributes.at("running_mean_after")));
      EXPECT_TRUE(remat_test::close_to_reference(bn.running_var.value(), c.attributes.at("running_var_after")));
    }
  }
}

TEST(BatchNorm2dCounter, FollowsTheLayerWhenItMovesAndIsCopiedWithIt) {
  std::vector<remat::nn::BatchNorm2d<float>> layers;
  layers.emplace_back(3);
  const remat::Matrix<float> x = remat_test::nd_values(Shape{2, 3, 2, 2}, 4).cast<float>();
  remat::CapturedStep<float> run([&](Tape<float>& tape) {
    return remat::sum(layers[0].forward(tape, tape.constant(Shape{2, 3, 2, 2}, x.data())));
  });
  EXPECT_EQ(layers[0].num_batches_tracked(), 1);
  for (int k = 0; k < 8; ++k) layers.emplace_back(3);  // reallocates: the layer moves, its counter with it
  run.replay();
  EXPECT_EQ(layers[0].num_batches_tracked(), 2);
  remat::nn::BatchNorm2d<float> copy = layers[0];  // a copy counts on its own
  run.replay();
  EXPECT_EQ(layers[0].num_batches_tracked(), 3);
  EXPECT_EQ(copy.num_batches_tracked(), 2);
  // An assignment copies the count into the layer's own storage, which stays where a tape recorded it.
  remat::nn::BatchNorm2d<float> a(3);
  const std::int64_t* address = &a.num_batches_tracked();
  a = copy;
  EXPECT_EQ(&a.num_batches_tracked(), address);
  EXPECT_EQ(a.num_batches_tracked(), 2);
  a = std::move(layers[0]);
  EXPECT_EQ(&a.num_batches_tracked(), address);
  EXPECT_EQ(a.num_batches_tracked(), 3);
}

/// A user op y = x that counts its forward runs, and those that were records (ForwardContext::recording()).
struct CountingIdentity : remat::OpBase {
  static constexpr const char* name = "counting_identity";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static inline int runs = 0, records = 0;
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    ++runs;
    records += c.recording() ? 1 : 0;
    c.out() = c.in(0);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    c.add_grad(0, c.grad_out());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

/// `depth` times y = square(identity(tanh(y))): square reads identity's output, so a replay or a budget
/// regenerates it.
Var<double> counting_chain(Var<double> y, int depth) {
  for (int k = 0; k < depth; ++k) y = remat::square(remat::apply_op<CountingIdentity>(remat::tanh(y)));
  return y;
}

TEST(BatchNorm, ForwardContextRecordingIsTrueOnlyWhenTheTapeRecordsTheOp) {
  const Matrix input = remat_test::nd_values(Shape{64, 64}, 3);
  auto counts = [](auto f) {
    CountingIdentity::runs = CountingIdentity::records = 0;
    f();
    return std::make_pair(CountingIdentity::runs, CountingIdentity::records);
  };
  {  // a checkpoint's replay
    const auto [runs, records] = counts([&] {
      Tape<double> tape;
      const V x = tape.variable(input);
      tape.backward(remat::sum(
          remat::checkpoint([](const V& a) { return counting_chain(a, 4); }, remat::policies::nothing_saveable)(x)));
    });
    EXPECT_EQ(records, 4);
    EXPECT_EQ(runs, 8);
  }
  {  // a memory budget's regenerations
    std::size_t peak = 0;
    counts([&] {
      Tape<double> tape;
      tape.backward(remat::sum(counting_chain(tape.variable(input), 8)));
      peak = tape.memory().peak_bytes;
    });
    std::size_t regenerated = 0;
    const auto [runs, records] = counts([&] {
      Tape<double> tape;
      tape.set_memory_budget(peak / 2);
      tape.backward(remat::sum(counting_chain(tape.variable(input), 8)));
      regenerated = tape.memory().rematerialized_ops;
    });
    EXPECT_EQ(records, 8);
    EXPECT_GT(runs, 8) << regenerated << " regenerations, none of the identity";
  }
  {  // a CapturedStep: each run records anew, replays included
    const auto [runs, records] = counts([&] {
      remat::CapturedStep<double> step([&](Tape<double>& tape) {
        return remat::sum(remat::checkpoint([](const V& a) { return counting_chain(a, 2); },
                                            remat::policies::nothing_saveable)(tape.variable(input)));
      });
      step.replay();
    });
    EXPECT_EQ(records, 4);
    EXPECT_EQ(runs, 8);
  }
}

TEST(BatchNorm, PassesTheGradcheckInTrainingAndEvaluation) {
  for (const Shape& x : {Shape{3, 2, 3, 4}, Shape{2, 3, 5}, Shape{4, 3}, Shape{1, 2, 2, 2}}) {
    const remat::Index c = x[1];
    for (bool training : {true, false}) {
      Parameter<double> mean{remat_test::nd_values(Shape{1, c}, 11)},
          var{remat_test::nd_values(Shape{1, c}, 12, 0.5, 2)};
      EXPECT_TRUE(remat_test::nd_check(
          [&](Tape<double>& tape, const std::vector<V>& v) {
            const auto o = BatchNormFuncOptions<double>().weight(v[1]).bias(v[2]).training(training);
            return remat_test::weighted_sum(tape, remat::batch_norm(v[0], &mean, &var, o));
          },
          {x, Shape{c}, Shape{c}}))
          << remat::to_string(x) << (training ? " training" : " evaluation");
      EXPECT_TRUE(remat_test::nd_check(
          [&](Tape<double>& tape, const std::vector<V>& v) {
            return remat_test::weighted_sum(
                tape, remat::batch_norm(v[0], &mean, &var, BatchNormFuncOptions<double>().training(training)));
          },
          {x}))
          << remat::to_string(x) << (training ? " training" : " evaluation") << " without weight and bias";
    }
  }
}

TEST(BatchNorm, IsANormalizationThatDotsSaveableRecomputes) {
  Tape<float> tape;
  const Var<float> x =
      tape.variable(Shape{2, 3, 4, 4}, remat_test::nd_values(Shape{2, 3, 4, 4}, 1).cast<float>().eval().data());
  std::vector<remat::OpInfo> seen;
  remat::checkpoint(
      [&](const Var<float>& in) {
        return remat::batch_norm(in, nullptr, nullptr, BatchNormFuncOptions<float>().training(true));
      },
      [&](const remat::OpInfo& op) {
        seen.push_back(op);
        return false;
      })(x);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].name, "batch_norm");
  EXPECT_EQ(seen[0].kind, remat::OpKind::normalization);
  EXPECT_EQ(seen[0].shape, (Shape{2, 3, 4, 4}));
  EXPECT_FALSE(remat::policies::dots_saveable(seen[0]));
}

TEST(BatchNorm, BadInputsThrowNamingBatchNormAndChangeNothing) {
  Tape<double> tape;
  auto var = [&](const Shape& s) { return tape.variable(s, remat_test::nd_values(s, 5).data()); };
  const V x = var({2, 3, 4, 4}), w = var({3}), b = var({3}), w4 = var({4}), vector = var({3}), one = var({1, 3});
  Parameter<double> mean{Matrix::Zero(1, 3)}, var3{Matrix::Ones(1, 3)}, mean4{Matrix::Zero(1, 4)};
  const std::size_t size = tape.size();
  const auto train = BatchNormFuncOptions<double>().training(true);
  using remat_test::expect_error_naming;
  expect_error_naming<remat::shape_error>([&] { remat::batch_norm(vector, &mean, &var3, train); },
                                          {"batch_norm", "[3]", "[N, C, *]"});
  expect_error_naming<remat::shape_error>(
      [&] { remat::batch_norm(x, &mean, &var3, BatchNormFuncOptions<double>(train).weight(w4).bias(b)); },
      {"batch_norm", "[2,3,4,4]", "weight", "[4]"});
  expect_error_naming<remat::shape_error>([&] { remat::batch_norm(x, &mean4, &var3, train); },
                                          {"batch_norm", "running_mean", "4 elements", "3"});
  expect_error_naming<remat::shape_error>([&] { remat::batch_norm(one, &mean, &var3, train); },
                                          {"batch_norm", "more than one value per channel"});
  expect_error_naming<remat::domain_error>(
      [&] { remat::batch_norm(x, &mean, &var3, BatchNormFuncOptions<double>(train).momentum(1.5)); },
      {"batch_norm", "momentum", "1.5"});
  expect_error_naming<remat::domain_error>(
      [&] { remat::batch_norm(x, &mean, &var3, BatchNormFuncOptions<double>(train).eps(-1)); },
      {"batch_norm", "eps", "-1"});
  expect_error_naming<remat::domain_error>(
      [&] { remat::batch_norm(x, nullptr, &var3, BatchNormFuncOptions<double>().weight(w).bias(b)); },
      {"batch_norm", "evaluation", "running_mean or running_var is null"});
  EXPECT_EQ(tape.size(), size);
  EXPECT_TRUE(bitwise(mean.value(), Matrix::Zero(1, 3)));
  EXPECT_TRUE(bitwise(var3.value(), Matrix::Ones(1, 3)));
  (void)w;
}

}  // namespace batch_norm_test
