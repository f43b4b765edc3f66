// Property: on random graphs the shapes-only tape counts exactly what the real run counts — saved bytes
// after the forward pass, live and peak after it and after backward, replayed bytes and ops.
//
// Two families, 200 seeded cases each: the checkpoint tests' random programs (tests/checkpoint/
// random_program.hpp: DAGs of every op, broadcasting, constants inside regions, regions nested three deep
// with every library policy and random custom ones, one or two arguments and results), and random chains
// of layers of random widths and batch sizes (attention of random heads and sequence lengths, with its
// temporaries, layer_norm, dropout, names) under random nested regions, with weights that are Parameters,
// tape variables or constants, ending in one of three losses.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../checkpoint/random_program.hpp"
#include "estimate_support.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace estimate_property_test {

using remat::Matrix;
using remat::OpInfo;
using remat::Parameter;
using remat::Tape;
using remat::Var;

constexpr int cases = 200;  // per family

/// memory() after the forward pass and after backward of a random program recorded on its own tape.
template <class T>
estimate_test::Measured measure(random_program::Run<T>& run) {
  estimate_test::Measured m;
  m.forward = run.tape.memory();
  run.tape.backward(run.loss.var);
  m.step = run.tape.memory();
  return m;
}

void expect_same(const estimate_test::Measured& shapes, const estimate_test::Measured& real) {
  EXPECT_EQ(shapes.forward.saved_bytes, real.forward.saved_bytes);
  EXPECT_EQ(shapes.forward.live_bytes, real.forward.live_bytes);
  EXPECT_EQ(shapes.forward.peak_bytes, real.forward.peak_bytes);
  EXPECT_EQ(shapes.step.live_bytes, real.step.live_bytes);
  EXPECT_EQ(shapes.step.peak_bytes, real.step.peak_bytes);
  EXPECT_EQ(shapes.step.replayed_bytes, real.step.replayed_bytes);
  EXPECT_EQ(shapes.step.replayed_ops, real.step.replayed_ops);
}

// In float only: the counting is the same code for double (the typed policy and nesting tests of
// estimate_models_test.cpp run both), and a second scalar type here cost 5 CPU s of compile per build.
using Scalar = float;

TEST(EstimateProperty, RandomProgramsOfEveryOpRegionAndPolicy) {
  int replaying = 0;
  for (int i = 0; i < cases; ++i) {
    const auto seed = 31000 + static_cast<std::uint64_t>(i);
    const random_program::Program program = random_program::Generator(seed).generate();
    random_program::Run<Scalar> shapes(program, seed, remat::shapes_only);
    random_program::Run<Scalar> real(program, seed, /*checkpoint=*/true);
    const auto s = measure(shapes), r = measure(real);
    {
      SCOPED_TRACE("program " + std::to_string(seed) + ":\n" + random_program::describe(program));
      expect_same(s, r);
    }
    replaying += r.step.replayed_ops > 0;
    if (::testing::Test::HasFailure()) break;  // one program's report is enough
  }
  EXPECT_GE(replaying, cases / 8) << "too few programs replay anything: the generator lost its regions";
}

// ---- random chains of layers ----

/// One chain, drawn from a seed: batch B·S, widths, per layer its kind and extras, the weights' leaf kinds.
struct Chain {
  struct Layer {
    int kind = 0;  // 0 tanh(linear), 1 relu(matmul), 2 gelu(linear(layer_norm)), 3 residual attention
    remat::Index in = 1, out = 1, heads = 1;
    bool causal = false, fused = false, dropout = false;
    int tag = -1;  // checkpoint_name "a" or "b" on its output
    int leaf = 0;  // its weights: 0 Parameters, 1 tape variables, 2 constants
  };
  remat::Index B = 1, S = 1;
  std::vector<Layer> layers;
  int loss = 0;  // 0 sum, 1 cross_entropy, 2 mse_loss against a constant
};

inline Chain draw_chain(std::uint64_t seed) {
  remat_test::Random r(seed);
  Chain c;
  c.B = 1 + r.integer(4);
  c.S = 1 + r.integer(6);
  remat::Index width = 1 + r.integer(24);
  const int count = 2 + r.integer(7);
  for (int i = 0; i < count; ++i) {
    Chain::Layer l;
    l.kind = r.integer(4);
    l.in = width;
    if (l.kind == 3) {
      std::vector<remat::Index> divisors;
      for (remat::Index d = 1; d <= width; ++d)
        if (width % d == 0) divisors.push_back(d);
      l.heads = divisors[static_cast<std::size_t>(r.integer(static_cast<int>(divisors.size())))];
      l.causal = r.uniform() < 0.5;
      l.fused = r.uniform() < 0.4;
      l.out = width;
    } else {
      l.out = 1 + r.integer(32);
      if (l.kind == 2 && width < 2) l.kind = 0;  // layer_norm needs two columns
    }
    l.dropout = !l.fused && r.uniform() < 0.25;
    l.tag = r.uniform() < 0.3 ? r.integer(2) : -1;
    l.leaf = r.uniform() < 0.6 ? 0 : 1 + r.integer(2);
    width = l.out;
    c.layers.push_back(l);
  }
  c.loss = r.integer(3);
  return c;
}

/// The weights of every layer (drawn once: both runs read the same Parameters and matrices).
template <class T>
struct Weights {
  std::vector<std::unique_ptr<Parameter<T>>> parameters;  // three per layer (weight(layer, k))
  std::vector<Matrix<T>> matrices;                        // the same values, for tape variables and constants
  Matrix<T> input, target;
  std::vector<int> labels;

  Weights(const Chain& c, std::uint64_t seed) {
    const remat::Index rows = c.B * c.S;
    std::uint64_t k = seed * 131;
    for (const Chain::Layer& l : c.layers) {
      // Attention: Wq, Wk, Wv; otherwise W, the bias and a layer_norm gain (and shift).
      const bool attention = l.kind == 3;
      const remat::Shape shapes[3] = {{l.in, l.out},
                                      attention ? remat::Shape{l.in, l.out} : remat::Shape{1, l.out},
                                      attention ? remat::Shape{l.in, l.out} : remat::Shape{1, l.in}};
      for (const remat::Shape& s : shapes) {
        matrices.push_back(remat_test::random_matrix<T>(s, ++k) * T(0.5));
        parameters.push_back(std::make_unique<Parameter<T>>(matrices.back()));
      }
    }
    input = remat_test::random_matrix<T>(rows, c.layers.front().in, ++k);
    target = remat_test::random_matrix<T>(rows, c.layers.back().out, ++k);
    for (remat::Index i = 0; i < rows; ++i) labels.push_back(static_cast<int>(i % c.layers.back().out));
  }
};

/// The policies a region may draw (the library's and two custom ones).
template <class T>
std::vector<std::function<bool(const OpInfo&)>> region_policies() {
  namespace p = remat::policies;
  return {p::nothing_saveable,
          p::everything_saveable,
          p::dots_saveable,
          p::dots_with_no_batch_dims_saveable,
          p::save_only_these_names({"a"}),
          p::save_any_names_but_these({"a"}),
          p::save_anything_except_these_names({"b"}),
          p::save_from_both_policies(p::dots_saveable, p::save_only_these_names({"b"})),
          [](const OpInfo& op) { return op.bytes > 40 * sizeof(T); },
          [](const OpInfo& op) { return op.kind == remat::OpKind::normalization || op.shape.cols() % 2 == 0; }};
}

/// Records a chain on a tape: its region structure is drawn while recording, from `seed` (the same draws in
/// both runs, since a checkpointed function runs once).
template <class T>
class ChainRecorder {
 public:
  ChainRecorder(const Chain& c, Weights<T>& w, std::uint64_t seed, Tape<T>& tape)
      : c_(c), w_(w), random_(seed), tape_(tape), policies_(region_policies<T>()) {}

  Var<T> loss() {
    Var<T> h = run(0, static_cast<int>(c_.layers.size()), tape_.constant(w_.input), 0);
    if (c_.loss == 1) return remat::cross_entropy(h, w_.labels);
    if (c_.loss == 2) return remat::mse_loss(h, tape_.constant(w_.target));
    return remat::sum(h);
  }

 private:
  /// Layers [begin, end) on h; at depth < 3 a random sub-range becomes a region with a random policy.
  Var<T> run(int begin, int end, Var<T> h, int depth) {
    for (int i = begin; i < end;) {
      if (depth < 3 && random_.uniform() < 0.35) {
        const int stop = i + 1 + random_.integer(end - i);
        const auto& policy = policies_[static_cast<std::size_t>(random_.integer(static_cast<int>(policies_.size())))];
        h = remat::checkpoint([this, i, stop, depth](Var<T> a) { return run(i, stop, a, depth + 1); }, policy)(h);
        i = stop;
      } else {
        h = layer(i++, h);
      }
    }
    return h;
  }

  Var<T> weight(int layer, int k) {
    const auto index = static_cast<std::size_t>(3 * layer + k);
    switch (c_.layers[static_cast<std::size_t>(layer)].leaf) {
      case 0:
        return tape_.variable(*w_.parameters[index]);
      case 1:
        return tape_.variable(w_.matrices[index]);
      default:
        return tape_.constant(w_.matrices[index]);
    }
  }

  Var<T> layer(int i, const Var<T>& h) {
    const Chain::Layer& l = c_.layers[static_cast<std::size_t>(i)];
    Var<T> y;
    switch (l.kind) {
      case 0:
        y = remat::tanh(remat::linear(h, weight(i, 0), weight(i, 1)));
        break;
      case 1:
        y = remat::relu(remat::matmul(h, weight(i, 0)));
        break;
      case 2: {
        const Var<T> gain = weight(i, 2);
        y = remat::gelu(remat::linear(remat::layer_norm(h, gain, gain), weight(i, 0), weight(i, 1)));
        break;
      }
      default: {
        const Var<T> q = remat::matmul(h, weight(i, 0)), k = remat::matmul(h, weight(i, 1)),
                     v = remat::matmul(h, weight(i, 2));
        Var<T> a;
        if (l.fused) {
          a = remat::scaled_dot_product_attention(q, k, v, l.heads, c_.S, l.causal);
        } else {
          Var<T> p = remat::softmax(remat::attention_scores(q, k, l.heads, c_.S, l.causal));
          if (l.dropout) p = remat::dropout(p, 0.3);
          a = remat::attention_values(p, v, l.heads, c_.S);
        }
        y = h + a;
      }
    }
    if (l.dropout && l.kind != 3) y = remat::dropout(y, 0.2);
    if (l.tag >= 0) y = remat::checkpoint_name(y, l.tag == 0 ? "a" : "b");
    return y;
  }

  const Chain& c_;
  Weights<T>& w_;
  remat_test::Random random_;
  Tape<T>& tape_;
  std::vector<std::function<bool(const OpInfo&)>> policies_;
};

std::string describe(const Chain& c) {
  std::string s = "B " + std::to_string(c.B) + ", S " + std::to_string(c.S) + ", loss " + std::to_string(c.loss);
  for (const Chain::Layer& l : c.layers)
    s += "\n  kind " + std::to_string(l.kind) + " [" + std::to_string(l.in) + "→" + std::to_string(l.out) + "] heads " +
         std::to_string(l.heads) + (l.causal ? " causal" : "") + (l.fused ? " fused" : "") +
         (l.dropout ? " dropout" : "") + " tag " + std::to_string(l.tag) + " leaf " + std::to_string(l.leaf);
  return s;
}

TEST(EstimateProperty, RandomChainsOfRandomWidthsUnderRandomNestedRegions) {
  int replaying = 0;
  for (int i = 0; i < cases; ++i) {
    const auto seed = 47000 + static_cast<std::uint64_t>(i);
    const Chain chain = draw_chain(seed);
    Weights<Scalar> weights(chain, seed);
    const auto e = estimate_test::expect_estimate_equals_real_run<Scalar>(
        [&](Tape<Scalar>& tape) {
          tape.seed(seed);
          return ChainRecorder<Scalar>(chain, weights, seed, tape).loss();
        },
        "chain " + std::to_string(seed) + ": " + describe(chain));
    replaying += e.replayed_ops > 0;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GE(replaying, cases / 8) << "too few chains replay anything";
}

}  // namespace estimate_property_test
