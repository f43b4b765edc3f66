// The GPT of docs/gpt.md (examples/gpt/gpt.hpp) against PyTorch float64 (tests/gpt/reference.txt, written
// by tests/gpt/make_reference.py from the model contract alone), every recompute mode bitwise equal to
// none, and the saved bytes after the forward pass equal to the formulas of examples/gpt/memory_formula.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gpt/gpt.hpp"
#include "gpt/memory_formula.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

namespace gpt_test {

using remat::Index;
using remat::Matrix;
using remat::Tape;
using remat::Var;

struct Reference {
  gpt::Config config;
  Index batch = 0;
  double loss = 0, logits_checksum = 0;
  std::vector<std::string> names;
  std::vector<Matrix<double>> grads;
};

/// Parses reference.txt (format: tests/gpt/make_reference.py's docstring).
std::vector<Reference> read_references() {
  std::ifstream in(REMAT_GPT_REFERENCE_FILE);
  EXPECT_TRUE(in) << "cannot open " << REMAT_GPT_REFERENCE_FILE;
  std::vector<Reference> refs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string key;
    s >> key;
    if (key == "config") {
      refs.emplace_back();
      Reference& r = refs.back();
      s >> r.config.vocabulary >> r.config.width >> r.config.heads >> r.config.seq_len >> r.batch >> r.config.blocks;
    } else if (key == "loss") {
      s >> refs.back().loss;
    } else if (key == "logits_checksum") {
      s >> refs.back().logits_checksum;
    } else if (key == "grad") {
      std::string name;
      Index rows = 0, cols = 0;
      s >> name >> rows >> cols;
      std::string values;
      std::getline(in, values);
      std::istringstream v(values);
      Matrix<double> g(rows, cols);
      for (Index k = 0; k < g.size(); ++k) v >> g.data()[k];
      EXPECT_TRUE(v) << "short gradient line for " << name;
      refs.back().names.push_back(name);
      refs.back().grads.push_back(g);
    }
  }
  return refs;
}

/// The reference inputs: ids[r] = (5r + 3) mod V, targets[r] = (5r + 8) mod V.
struct Batch {
  std::vector<int> ids, targets;
};
Batch reference_batch(const gpt::Config& c, Index batch) {
  Batch b;
  for (Index r = 0; r < batch * c.seq_len; ++r) {
    b.ids.push_back(static_cast<int>((5 * r + 3) % c.vocabulary));
    b.targets.push_back(static_cast<int>((5 * r + 8) % c.vocabulary));
  }
  return b;
}

/// Loss and gradients of one step.
template <class T>
struct Step {
  T loss = 0;
  double logits_checksum = 0;
  std::vector<Matrix<T>> grads;
  remat::MemoryStats after_forward, after_backward;
};

template <class T>
Step<T> run(gpt::Model<T>& model, const Batch& batch, const gpt::Options& options, std::uint64_t seed = 1) {
  for (auto* p : model.parameters()) p->zero_grad();
  Tape<T> tape(seed);
  Var<T> logits = model.logits(tape, batch.ids, options);
  Step<T> step;
  step.logits_checksum = static_cast<double>(logits.value().template cast<double>().sum());
  Var<T> loss = remat::cross_entropy(logits, batch.targets);
  logits = Var<T>();
  step.after_forward = tape.memory();
  tape.backward(loss);
  step.after_backward = tape.memory();
  step.loss = loss.item();
  for (auto* p : model.parameters()) step.grads.emplace_back(p->grad());
  return step;
}

const gpt::Recompute all_modes[] = {gpt::Recompute::none, gpt::Recompute::block, gpt::Recompute::attention,
                                    gpt::Recompute::dots_no_batch, gpt::Recompute::sqrt};

TEST(Gpt, MatchesPyTorchFloat64FusedAndUnfused) {
  const auto refs = read_references();
  ASSERT_EQ(refs.size(), 3u);
  for (const Reference& ref : refs) {
    auto model = gpt::Model<double>::deterministic(ref.config);
    ASSERT_EQ(model.parameter_names(), ref.names);
    const Batch batch = reference_batch(ref.config, ref.batch);
    for (const auto attention : {gpt::Attention::unfused, gpt::Attention::fused}) {
      SCOPED_TRACE(std::string("H = ") + std::to_string(ref.config.width) +
                   (attention == gpt::Attention::fused ? ", fused" : ", unfused"));
      const Step<double> step = run(model, batch, {gpt::Recompute::none, attention});
      EXPECT_NEAR(step.loss, ref.loss, 1e-10 * std::abs(ref.loss));
      EXPECT_NEAR(step.logits_checksum, ref.logits_checksum, 1e-10 * std::max(1.0, std::abs(ref.logits_checksum)));
      for (std::size_t n = 0; n < ref.grads.size(); ++n) {
        const double scale = ref.grads[n].cwiseAbs().maxCoeff();
        const double error = (step.grads[n] - ref.grads[n]).cwiseAbs().maxCoeff();
        EXPECT_LE(error, 1e-10 * scale) << ref.names[n] << ": max |remat − torch| " << error << ", max |torch| "
                                        << scale;
      }
    }
  }
}

TEST(Gpt, EveryRecomputeModeGivesBitwiseEqualLossAndGradients) {
  for (const double dropout : {0.0, 0.2}) {
    for (const auto attention : {gpt::Attention::unfused, gpt::Attention::fused}) {
      if (dropout > 0 && attention == gpt::Attention::fused) continue;  // fused attention takes no dropout
      gpt::Config c{16, 8, 2, 4, 3, dropout};
      remat::nn::Generator generator(7);
      auto model = gpt::Model<float>::random(c, generator);
      Batch batch;
      for (int r = 0; r < 2 * 4; ++r) {
        batch.ids.push_back((7 * r + 1) % 16);
        batch.targets.push_back((3 * r + 2) % 16);
      }
      const Step<float> reference = run(model, batch, {gpt::Recompute::none, attention});
      for (const auto mode : all_modes) {
        SCOPED_TRACE(std::string(gpt::to_string(mode)) + (attention == gpt::Attention::fused ? " fused" : " unfused") +
                     " dropout " + std::to_string(dropout));
        const Step<float> step = run(model, batch, {mode, attention});
        // Every mode but none recomputes something; selective with fused attention too: its region holds
        // only the fused op, whose statistics it drops (its output stays: proj's backward reads it).
        const bool nothing_dropped = mode == gpt::Recompute::none;
        EXPECT_EQ(step.after_backward.replayed_ops > 0, !nothing_dropped);
        EXPECT_EQ(step.loss, reference.loss);
        for (std::size_t n = 0; n < step.grads.size(); ++n)
          EXPECT_TRUE(step.grads[n] == reference.grads[n]) << model.parameter_names()[n];
      }
    }
  }
}

TEST(Gpt, TheCallersBlockRunnerGivesTheSameStep) {
  // model.loss(tape, ids, targets, attention, run_blocks): a plain loop, run_schedule's planner under a
  // budget, checkpoint_sequential; loss and gradients bitwise those of Recompute::none, and the planned run
  // recomputes something and stays within its budget.
  for (const auto attention : {gpt::Attention::unfused, gpt::Attention::fused}) {
    gpt::Config c{16, 16, 2, 16, 3, 0.0};  // activations outweigh the weights: 3/4 of the plain peak fits
    remat::nn::Generator generator(11);
    auto model = gpt::Model<float>::random(c, generator);
    const Batch batch = reference_batch(c, 4);
    const Step<float> reference = run(model, batch, {gpt::Recompute::none, attention});
    const std::size_t plain_peak = reference.after_backward.peak_bytes;
    for (int runner = 0; runner < 3; ++runner) {
      SCOPED_TRACE("runner " + std::to_string(runner));
      for (auto* p : model.parameters()) p->zero_grad();
      Tape<float> tape;
      const std::size_t budget = plain_peak * 3 / 4;
      Var<float> loss = model.loss(tape, batch.ids, batch.targets, attention, [&](const auto& blocks, Var<float> x) {
        if (runner == 1) return remat::checkpoint_sequential_auto(blocks, x, budget);
        if (runner == 2) return remat::checkpoint_sequential(blocks, 2, x);
        for (std::size_t l = 0; l < blocks.size(); ++l) x = blocks[l](x);
        return x;
      });
      tape.backward(loss);
      EXPECT_EQ(loss.item(), reference.loss);
      for (std::size_t n = 0; n < model.parameters().size(); ++n)
        EXPECT_TRUE(model.parameters()[n]->grad() == reference.grads[n]) << model.parameter_names()[n];
      EXPECT_EQ(tape.memory().replayed_ops > 0, runner > 0);
      if (runner == 0) {
        EXPECT_EQ(tape.memory().peak_bytes, plain_peak);
      } else if (runner == 1) {
        EXPECT_LE(tape.memory().peak_bytes, budget);
      }
    }
  }
}

TEST(Gpt, SavedBytesEqualTheFormulasOfMemoryFormulaHpp) {
  // examples/gpt/memory_formula.hpp derives the formulas; bench W3 checks the same header on its step.
  // L = 3 and 4 make sqrt checkpoint segments (round(√2) = 1 segment is the plain model).
  for (const gpt::Config c : {gpt::Config{32, 16, 2, 8, 2, 0}, gpt::Config{11, 6, 1, 1, 3, 0},
                              gpt::Config{32, 12, 3, 5, 2, 0}, gpt::Config{32, 8, 2, 4, 4, 0}}) {
    auto model = gpt::Model<float>::deterministic(c);
    const Index B = 3;
    const Batch batch = reference_batch(c, B);
    const gpt::Sizes z = gpt::sizes(c, B);
    for (const auto mode : all_modes)
      for (const auto attention : {gpt::Attention::unfused, gpt::Attention::fused}) {
        SCOPED_TRACE(std::string(gpt::to_string(mode)) + (attention == gpt::Attention::fused ? " fused" : "") +
                     " L = " + std::to_string(c.blocks));
        const Step<float> step = run(model, batch, {mode, attention});
        EXPECT_EQ(step.after_forward.saved_bytes,
                  static_cast<std::size_t>(gpt::saved_floats(mode, attention, z)) * sizeof(float));
      }
  }
}

TEST(Gpt, FusedAttentionNeverHoldsAnSxSMatrixBeyondItsTemporary) {
  // The fused op's only S×S buffer is its [2S, S] temporary, live while it runs: the peak of a step with
  // fused attention is below the unfused step's by at least the a·N·S probabilities of every block but
  // for that temporary.
  const gpt::Config c{32, 16, 2, 16, 2, 0};
  auto model = gpt::Model<float>::deterministic(c);
  const Batch batch = reference_batch(c, 4);
  const Step<float> unfused = run(model, batch, {gpt::Recompute::none, gpt::Attention::unfused});
  const Step<float> fused = run(model, batch, {gpt::Recompute::none, gpt::Attention::fused});
  const std::size_t probabilities = static_cast<std::size_t>(c.heads * 4 * c.seq_len * c.seq_len) * sizeof(float);
  EXPECT_LE(fused.after_backward.peak_bytes + c.blocks * probabilities - 2 * c.seq_len * c.seq_len * sizeof(float),
            unfused.after_backward.peak_bytes);
}

TEST(Gpt, RejectsBadInputWithTypedErrorsAndLeavesTheTapeUsable) {
  auto model = gpt::Model<float>::deterministic({8, 4, 2, 3, 1, 0});
  Tape<float> tape;
  EXPECT_THROW(model.logits(tape, {1, 2}), remat::shape_error);     // not a whole sequence
  EXPECT_THROW(model.logits(tape, {1, 2, 8}), remat::index_error);  // id 8 outside [0, 8)
  const Var<float> loss = model.loss(tape, {1, 2, 3}, {2, 3, 4});
  EXPECT_NO_THROW(tape.backward(loss));
  EXPECT_THROW(gpt::Model<float>({8, 6, 4, 3, 1, 0}), remat::shape_error);  // 6 not divisible by 4 heads
}

TEST(Gpt, EvaluationModeTurnsDropoutOff) {
  auto model = gpt::Model<float>::deterministic({8, 4, 2, 3, 1, 0.5});
  const std::vector<int> ids = {1, 2, 3}, targets = {2, 3, 4};
  Tape<float> eval;
  eval.set_training(false);
  auto no_dropout = gpt::Model<float>::deterministic({8, 4, 2, 3, 1, 0});
  Tape<float> reference;
  EXPECT_EQ(model.loss(eval, ids, targets).item(), no_dropout.loss(reference, ids, targets).item());
  EXPECT_EQ(eval.size(), reference.size());  // no dropout node recorded
  Tape<float> train;
  EXPECT_NE(model.loss(train, ids, targets).item(), no_dropout.loss(reference, ids, targets).item());
}

}  // namespace gpt_test
