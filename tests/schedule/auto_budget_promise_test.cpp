// checkpoint_sequential_auto's promise (docs/schedules.md, "checkpoint_sequential_auto
// and the planner"): for every budget it accepts, tape.memory().peak_bytes from the call through
// tape.backward(loss) stays ≤ the budget (the loss being the chain's last layer), the loss and every gradient
// are bitwise those of the plain tape; a budget that fits nothing throws memory_budget_error whose
// least_budget_bytes() then works, and the tape stays usable.
//
// Each test builds a chain that leans on one of the model's exact rules (a layer's last op reading its
// output, a layer returning its input or an outside value, branches, regions of its own with each policy,
// shared weights, leaves recorded inside a layer, pre-chain ops, 1 and 14 layers, coarse resolutions,
// float and double) and checks the promise at the least budget, least + 1, least − 1 (must throw) and random
// budgets up to twice the plain peak.
#include <gtest/gtest.h>

#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "memory.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

namespace auto_budget_promise_test {

template <class T>
using Layer = std::function<remat::Var<T>(remat::Var<T>)>;

/// How a chain's weights are held.
enum class Hold {
  variable,            // tape variables recorded before the chain
  parameter,           // Parameters recorded before the chain
  parameter_in_layer,  // Parameters recorded by each layer where it uses them
};

/// Everything one run of a chain owns: its weights, its layers, x_0, what the gradients are read from.
template <class T>
struct Model {
  remat::Tape<T>* tape = nullptr;
  Hold hold = Hold::variable;
  std::deque<remat::Parameter<T>> params;
  std::vector<remat::Var<T>> before;  // weights recorded before the chain (Hold::variable, Hold::parameter)
  std::vector<remat::Var<T>> slots;   // variables recorded inside layers: the latest recording of each
  std::vector<remat::Var<T>> extra;   // other variables whose gradient is compared (x_0, pre-chain leaves)
  std::vector<Layer<T>> layers;
  remat::Var<T> x0;
  std::vector<int> labels;
  std::uint64_t seed = 1;

  /// A new weight of m × n values, scaled; its index.
  std::size_t add(remat::Index m, remat::Index n, double scale) {
    remat::Matrix<T> v = remat_test::random_matrix<T>(m, n, seed++) * static_cast<T>(scale);
    if (hold == Hold::variable) {
      params.emplace_back(remat::Matrix<T>(1, 1));  // unused: keeps the indices of params and weights equal
      before.push_back(tape->variable(v));
    } else {
      params.emplace_back(v);
      if (hold == Hold::parameter) before.push_back(tape->variable(params.back()));
    }
    return params.size() - 1;
  }
  /// Weight k as a layer uses it: the Var recorded before the chain, or a new leaf of its Parameter.
  remat::Var<T> w(std::size_t k) { return hold == Hold::parameter_in_layer ? tape->variable(params[k]) : before[k]; }

  std::vector<remat::Matrix<T>> gradients() const {
    std::vector<remat::Matrix<T>> g;
    if (hold == Hold::parameter_in_layer)
      for (const auto& p : params) g.emplace_back(p.grad());
    else if (hold == Hold::parameter)
      for (const auto& p : params) g.emplace_back(p.grad());
    else
      for (const auto& v : before) g.emplace_back(v.grad());
    for (const auto& v : slots) g.emplace_back(v.grad());
    for (const auto& v : extra) g.emplace_back(v.grad());
    return g;
  }
};

template <class T>
using Builder = std::function<void(Model<T>&)>;

template <class T>
struct Outcome {
  remat::Matrix<T> loss;
  std::vector<remat::Matrix<T>> grads;
  remat::MemoryStats before_backward, after_backward;
  remat::AutoScheduleReport report;
};

/// budget 0: the plain tape; otherwise checkpoint_sequential_auto over every layer.
template <class T>
Outcome<T> run(const Builder<T>& build, std::size_t budget, int resolution) {
  remat::Tape<T> tape;
  Model<T> m;
  m.tape = &tape;
  build(m);
  Outcome<T> o;
  remat::Var<T> loss;
  if (budget == 0) {
    loss = m.x0;
    for (auto& layer : m.layers) loss = layer(loss);
  } else {
    loss = remat::checkpoint_sequential_auto(m.layers, m.x0, budget, &o.report, resolution);
  }
  o.loss = loss.value();
  o.before_backward = tape.memory();
  tape.backward(loss);
  o.after_backward = tape.memory();
  o.grads = m.gradients();
  return o;
}

/// A hopeless budget: must throw memory_budget_error; then the plain chain on the same tape must give the
/// plain gradients (the tape stays usable). Returns least_budget_bytes().
template <class T>
std::size_t least_budget(const Builder<T>& build, std::size_t budget, int resolution, const Outcome<T>& plain) {
  remat::Tape<T> tape;
  Model<T> m;
  m.tape = &tape;
  build(m);
  std::size_t least = 0;
  try {
    remat::checkpoint_sequential_auto(m.layers, m.x0, budget, nullptr, resolution);
    ADD_FAILURE() << "budget " << budget << " did not throw";
    return budget;
  } catch (const remat::memory_budget_error& e) {
    EXPECT_EQ(e.budget_bytes(), budget);
    least = e.least_budget_bytes();
  }
  remat::Var<T> loss = m.x0;
  for (auto& layer : m.layers) loss = layer(loss);
  EXPECT_EQ(remat::Matrix<T>(loss.value()), plain.loss) << "after the throw";
  tape.backward(loss);
  const auto g = m.gradients();
  EXPECT_EQ(g.size(), plain.grads.size());
  for (std::size_t i = 0; i < g.size() && i < plain.grads.size(); ++i)
    EXPECT_TRUE(g[i].rows() == plain.grads[i].rows() && g[i].cols() == plain.grads[i].cols() &&
                (g[i].array() == plain.grads[i].array()).all())
        << "gradient " << i << " after the throw";
  return least;
}

template <class T>
bool bitwise_equal(const remat::Matrix<T>& a, const remat::Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

std::string describe_chain(const remat::AutoScheduleReport& r) {
  std::string s = "unit " + std::to_string(r.unit_bytes) + " B, baseline " + std::to_string(r.baseline_bytes) +
                  " B; per layer (units) x/x̄/o_f/o_f̄/o_b/g/read:";
  const remat::Chain& c = r.chain;
  for (std::size_t i = 0; i < c.tape_size.size(); ++i)
    s += " [" + std::to_string(c.activation_size[i + 1]) + "/" + std::to_string(c.tape_size[i]) + "/" +
         std::to_string(c.forward_overhead[i]) + "/" + std::to_string(c.forward_all_overhead[i]) + "/" +
         std::to_string(c.backward_overhead[i]) + "/" + std::to_string(c.gradient_size[i]) + "/" +
         std::to_string(c.output_read[i]) + "]";
  s += "; schedule:";
  static const char* const op_names[] = {" F", " Fall", " B", " free"};
  for (const remat::ScheduleOperation& op : r.schedule.operations) s += op_names[op.kind] + std::to_string(op.layer);
  return s;
}

struct Stats {
  int runs = 0;
  double worst = 0;  // largest peak / budget
};

/// The promise for one chain at the least budget, least + 1, random budgets up to 2 × the plain peak; least − 1
/// must throw. Returns the worst peak/budget seen.
template <class T>
double check(const std::string& name, const Builder<T>& build, int resolution = 500, int random_budgets = 3,
             std::uint64_t seed = 7) {
  SCOPED_TRACE(name);
  const Outcome<T> plain = run(build, 0, resolution);
  const std::size_t plain_peak = plain.after_backward.peak_bytes;
  const std::size_t least = least_budget(build, 1, resolution, plain);
  if (least > 1) {  // least − 1 throws and names the same least
    EXPECT_EQ(least_budget(build, least - 1, resolution, plain), least);
  }
  std::vector<std::size_t> budgets{least, least + 1};
  std::mt19937_64 rng(seed);
  const std::size_t high = std::max(least, 2 * plain_peak);
  for (int k = 0; k < random_budgets; ++k)
    budgets.push_back(std::uniform_int_distribution<std::size_t>(least, high)(rng));
  double worst = 0;
  for (std::size_t budget : budgets) {
    const Outcome<T> o = run(build, budget, resolution);
    const std::string where =
        name + ": budget " + std::to_string(budget) + " (least " + std::to_string(least) + "), plain peak " +
        std::to_string(plain_peak) + "\n  before backward: " + remat_test::describe(o.before_backward) +
        "\n  after backward:  " + remat_test::describe(o.after_backward) + "\n  " + describe_chain(o.report);
    EXPECT_LE(o.after_backward.peak_bytes, budget) << where;
    worst = std::max(worst, static_cast<double>(o.after_backward.peak_bytes) / static_cast<double>(budget));
    EXPECT_TRUE(bitwise_equal(o.loss, plain.loss)) << where << "\n  loss differs";
    EXPECT_EQ(o.grads.size(), plain.grads.size()) << where;
    for (std::size_t i = 0; i < o.grads.size() && i < plain.grads.size(); ++i)
      EXPECT_TRUE(bitwise_equal(o.grads[i], plain.grads[i])) << where << "\n  gradient " << i << " differs";
  }
  std::printf("%-60s least %8zu plain peak %8zu worst peak/budget %.3f\n", name.c_str(), least, plain_peak, worst);
  return worst;
}

// ---- layer kinds ----

/// The loss layer: cross_entropy(linear(h), labels) over 3 classes.
template <class T>
void add_loss(Model<T>& m, remat::Index width) {
  const std::size_t k = m.add(width, 3, 0.5);
  m.add(1, 3, 0.1);
  const remat::Index rows = m.x0.shape().rows();
  m.labels.clear();
  for (remat::Index r = 0; r < rows; ++r) m.labels.push_back(static_cast<int>(r % 3));
  m.layers.push_back(
      [&m, k](remat::Var<T> h) { return remat::cross_entropy(remat::linear(h, m.w(k), m.w(k + 1)), m.labels); });
}

/// Layer kinds that map a width to another (or the same) width.
enum Kind {
  k_tanh_linear,        // tanh(linear(h))
  k_sigmoid_linear,     // sigmoid(linear(h)): last op reads its output
  k_exp_linear,         // exp(0.1 · linear(h)): last op reads its output
  k_softmax_linear,     // softmax(linear(h))
  k_log_softmax,        // log_softmax(linear(h))
  k_relu_linear,        // relu(linear(h))
  k_dropout,            // dropout(tanh(linear(h))), fixed seed per call
  k_layer_norm,         // layer_norm(linear(h)): same width out
  k_identity,           // h
  k_two_branches,       // tanh(h) + sigmoid(h) (same width)
  k_square_product,     // h · h (multiply reads both inputs, the same value)
  k_region_nothing,     // checkpoint(tanh(linear(tanh(h)))), nothing_saveable
  k_region_everything,  // the same, everything_saveable
  k_region_dots,        // the same, dots_saveable
  k_region_names,       // the same with checkpoint_name, save_only_these_names
  k_exp_exp,            // exp(exp(0.1·h)) · 0.1: two ops reading their outputs
  k_input_dropped,      // linear(softmax(h)), h's handle reassigned: no backward reads h, freed mid-layer
  kind_count
};

inline const char* kind_name(int k) {
  static const char* names[] = {
      "tanh_linear",       "sigmoid_linear", "exp_linear",   "softmax_linear", "log_softmax",    "relu_linear",
      "dropout",           "layer_norm",     "identity",     "two_branches",   "square_product", "region_nothing",
      "region_everything", "region_dots",    "region_names", "exp_exp",        "input_dropped"};
  return names[k];
}

inline bool keeps_width(int k) {
  return k == k_identity || k == k_two_branches || k == k_square_product || k == k_exp_exp || k == k_dropout ||
         k == k_layer_norm;
}

/// Adds a layer of kind `kind` from width a to b (b = a for the width-keeping kinds).
template <class T>
void add_layer(Model<T>& m, int kind, remat::Index a, remat::Index b) {
  using V = remat::Var<T>;
  switch (kind) {
    case k_tanh_linear:
    case k_sigmoid_linear:
    case k_exp_linear:
    case k_softmax_linear:
    case k_log_softmax:
    case k_relu_linear: {
      const std::size_t k = m.add(a, b, 0.5);
      m.add(1, b, 0.1);
      m.layers.push_back([&m, k, kind](V h) {
        V z = remat::linear(h, m.w(k), m.w(k + 1));
        switch (kind) {
          case k_tanh_linear:
            return remat::tanh(z);
          case k_sigmoid_linear:
            return remat::sigmoid(z);
          case k_exp_linear:
            return remat::exp(z * 0.1);
          case k_softmax_linear:
            return remat::softmax(z);
          case k_log_softmax:
            return remat::log_softmax(z);
          default:
            return remat::relu(z);
        }
      });
      break;
    }
    case k_input_dropped: {
      const std::size_t k = m.add(a, b, 0.5);
      m.add(1, b, 0.1);
      m.layers.push_back([&m, k](V h) {
        h = remat::softmax(h);  // the layer's input has no handle left, and no backward reads it
        return remat::linear(h, m.w(k), m.w(k + 1));
      });
      break;
    }
    case k_dropout: {
      const std::size_t k = m.add(a, a, 0.5);
      m.add(1, a, 0.1);
      m.layers.push_back([&m, k](V h) {
        m.tape->seed(99);  // the same mask at every evaluation (the probe's, the real pass's, the plain run's)
        return remat::dropout(remat::tanh(remat::linear(h, m.w(k), m.w(k + 1))), 0.3);
      });
      break;
    }
    case k_layer_norm: {
      const std::size_t k = m.add(a, a, 0.5);
      m.add(1, a, 0.1);
      m.add(1, a, 1.0);
      m.add(1, a, 0.1);
      m.layers.push_back(
          [&m, k](V h) { return remat::layer_norm(remat::linear(h, m.w(k), m.w(k + 1)), m.w(k + 2), m.w(k + 3)); });
      break;
    }
    case k_identity:
      m.layers.push_back([](V h) { return h; });
      break;
    case k_two_branches:
      m.layers.push_back([](V h) { return remat::tanh(h) + remat::sigmoid(h); });
      break;
    case k_square_product:
      m.layers.push_back([](V h) { return h * h; });
      break;
    case k_exp_exp:
      m.layers.push_back([](V h) { return remat::exp(remat::exp(h * 0.1)) * 0.1; });
      break;
    case k_region_nothing:
    case k_region_everything:
    case k_region_dots:
    case k_region_names: {
      const std::size_t k = m.add(a, b, 0.5);
      m.add(1, b, 0.1);
      m.layers.push_back([&m, k, kind](V h) {
        auto f = [&m, k](V v) {
          V t = remat::checkpoint_name(remat::tanh(v), "t");
          return remat::tanh(remat::linear(t, m.w(k), m.w(k + 1)));
        };
        switch (kind) {
          case k_region_nothing:
            return remat::checkpoint(f)(h);
          case k_region_everything:
            return remat::checkpoint(f, remat::policies::everything_saveable)(h);
          case k_region_dots:
            return remat::checkpoint(f, remat::policies::dots_saveable)(h);
          default:
            return remat::checkpoint(f, remat::policies::save_only_these_names({"t"}))(h);
        }
      });
      break;
    }
  }
}

/// A chain of `kinds` then the loss layer, over rows × width0 inputs.
template <class T>
Builder<T> chain(std::vector<int> kinds, remat::Index rows, std::vector<remat::Index> widths, Hold hold,
                 bool x0_variable) {
  return [=](Model<T>& m) {
    m.hold = hold;
    const remat::Matrix<T> x = remat_test::random_matrix<T>(rows, widths[0], 4242);
    m.x0 = x0_variable ? m.tape->variable(x) : m.tape->constant(x);
    if (x0_variable) m.extra.push_back(m.x0);
    remat::Index width = widths[0];
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      const remat::Index next = keeps_width(kinds[i]) ? width : widths[(i + 1) % widths.size()];
      add_layer(m, kinds[i], width, next);
      width = next;
    }
    add_loss(m, width);
  };
}

// ---- tests ----

TEST(AutoBudgetPromise, EachLayerKindAloneAndRepeated) {
  for (int kind = 0; kind < kind_count; ++kind)
    for (Hold hold : {Hold::variable, Hold::parameter_in_layer})
      for (bool var : {false, true}) {
        const std::string name = std::string(kind_name(kind)) + (hold == Hold::variable ? " var" : " param") +
                                 (var ? " x0 var" : " x0 const");
        check<float>(name + " x1", chain<float>({kind}, 24, {6, 8}, hold, var), 500, 2);
        check<float>(name + " x4", chain<float>({kind, kind, kind, kind}, 24, {6, 8, 5, 7}, hold, var), 500, 2);
      }
}

TEST(AutoBudgetPromise, OutputReadingLastOpsBetweenWideLayers) {
  // A checkpoint x_k whose own layer's backward reads it, between layers whose tapes are large.
  for (int kind : {k_sigmoid_linear, k_exp_linear, k_softmax_linear, k_log_softmax, k_exp_exp, k_two_branches})
    check<float>(std::string("wide/") + kind_name(kind) + "/wide",
                 chain<float>({k_tanh_linear, kind, k_tanh_linear, kind, k_layer_norm}, 40, {4, 16, 16, 16, 16},
                              Hold::variable, true),
                 500, 4);
}

TEST(AutoBudgetPromise, LayerReturningAnOutsideValue) {
  // Layer 2 ignores its input and returns a tape variable recorded before the chain (its gradient is the
  // chain's δ_2, kept to the end as that variable's gradient); layer 3 returns a constant recorded before.
  for (bool constant : {false, true}) {
    Builder<float> b = [constant](Model<float>& m) {
      m.hold = Hold::variable;
      m.x0 = m.tape->variable(remat_test::random_matrix<float>(32, 8, 1));
      m.extra.push_back(m.x0);
      remat::Var<float> outside = constant ? m.tape->constant(remat_test::random_matrix<float>(32, 8, 2))
                                           : m.tape->variable(remat_test::random_matrix<float>(32, 8, 2));
      if (!constant) m.extra.push_back(outside);
      add_layer(m, k_tanh_linear, 8, 8);
      m.layers.push_back([outside](remat::Var<float> h) {
        (void)h;
        return outside;
      });
      add_layer(m, k_sigmoid_linear, 8, 8);
      add_layer(m, k_tanh_linear, 8, 8);
      add_loss(m, 8);
    };
    check<float>(constant ? "outside constant" : "outside variable", b, 500, 4);
  }
}

TEST(AutoBudgetPromise, WeightSharedByEveryLayerRecordedBeforeTheChain) {
  // One square weight recorded before the chain and read by every layer: its gradient is allocated by the
  // last layer's backward (the first the sweep reaches) and stays to the end of the sweep.
  for (Hold hold : {Hold::variable, Hold::parameter})
    for (remat::Index n : {8, 24, 48}) {
      Builder<float> b = [hold, n](Model<float>& m) {
        m.hold = hold;
        m.x0 = m.tape->constant(remat_test::random_matrix<float>(16, n, 3));
        const std::size_t k = m.add(n, n, 0.3);
        for (int i = 0; i < 5; ++i)
          m.layers.push_back([&m, k](remat::Var<float> h) { return remat::tanh(remat::matmul(h, m.w(k))); });
        add_loss(m, n);
      };
      check<float>(
          std::string("shared weight before ") + (hold == Hold::variable ? "var" : "param") + " n=" + std::to_string(n),
          b, 500, 4);
    }
}

TEST(AutoBudgetPromise, ParameterSharedByEveryLayerRecordedInEachLayer) {
  for (remat::Index n : {8, 24, 48}) {
    Builder<float> b = [n](Model<float>& m) {
      m.hold = Hold::parameter_in_layer;
      m.x0 = m.tape->constant(remat_test::random_matrix<float>(16, n, 3));
      const std::size_t k = m.add(n, n, 0.3);
      for (int i = 0; i < 5; ++i)
        m.layers.push_back([&m, k](remat::Var<float> h) { return remat::tanh(remat::matmul(h, m.w(k))); });
      add_loss(m, n);
    };
    check<float>("shared parameter in each layer n=" + std::to_string(n), b, 500, 4);
  }
}

TEST(AutoBudgetPromise, TapeVariableRecordedInsideALayer) {
  // Each layer records its own tape variable (a weight the tape owns) and multiplies by it: the variable's
  // value is read by the backward, its gradient stays to the end.
  for (remat::Index rows : {4, 32}) {
    Builder<float> b = [rows](Model<float>& m) {
      m.hold = Hold::variable;
      m.x0 = m.tape->constant(remat_test::random_matrix<float>(rows, 16, 3));
      for (int i = 0; i < 4; ++i) {
        m.slots.emplace_back();
        const std::size_t s = m.slots.size() - 1;
        m.layers.push_back([&m, s, i](remat::Var<float> h) {
          m.slots[s] = m.tape->variable(remat_test::random_matrix<float>(16, 16, 100 + i) * 0.3f);
          return remat::tanh(remat::matmul(h, m.slots[s]));
        });
      }
      add_loss(m, 16);
    };
    check<float>("tape variable inside layer rows=" + std::to_string(rows), b, 500, 4);
  }
}

TEST(AutoBudgetPromise, ConstantRecordedInsideALayer) {
  // Each layer multiplies its input by a constant it records (a mask the tape owns, read by the backward).
  for (remat::Index rows : {8, 32}) {
    Builder<float> b = [rows](Model<float>& m) {
      m.hold = Hold::variable;
      m.x0 = m.tape->variable(remat_test::random_matrix<float>(rows, 16, 3));
      m.extra.push_back(m.x0);
      for (int i = 0; i < 4; ++i) {
        const std::size_t k = m.add(16, 16, 0.3);
        m.layers.push_back([&m, k, i, rows](remat::Var<float> h) {
          remat::Var<float> mask = m.tape->constant(remat_test::random_matrix<float>(rows, 16, 200 + i));
          return remat::tanh(remat::matmul(h * mask, m.w(k)));
        });
      }
      add_loss(m, 16);
    };
    check<float>("constant inside layer rows=" + std::to_string(rows), b, 500, 4);
  }
}

// The backward of what was recorded before the chain runs after the chain's: before it was bounded
// (detail::after_chain_bytes), the minimal case peaked at 34,332 B against a budget of 26,594 B.
TEST(AutoBudgetPromise, InputComputedBeforeTheChain) {
  // x_0 = tanh(A · W0) recorded before the chain: the sweep goes on through those ops after the chain's
  // backward, allocating A's and W0's gradients.
  for (remat::Index width : {8, 64}) {
    Builder<float> b = [width](Model<float>& m) {
      m.hold = Hold::variable;
      remat::Var<float> a = m.tape->variable(remat_test::random_matrix<float>(32, width, 5));
      remat::Var<float> w0 = m.tape->variable(remat_test::random_matrix<float>(width, 8, 6) * 0.3f);
      m.extra.push_back(a);
      m.extra.push_back(w0);
      m.x0 = remat::tanh(remat::matmul(a, w0));
      add_layer(m, k_tanh_linear, 8, 8);
      add_layer(m, k_sigmoid_linear, 8, 8);
      add_layer(m, k_tanh_linear, 8, 4);
      add_loss(m, 4);
    };
    check<float>("input computed before chain width=" + std::to_string(width), b, 500, 4);
  }
}

TEST(AutoBudgetPromise, InputComputedBeforeTheChainInARegionOrWithAWeightTheChainShares) {
  // x_0 from a checkpoint region that saves nothing (its replay, after the chain's backward, regenerates
  // what it dropped); or x_0 = tanh(A · W) with W [8,8] also a weight of the chain's first layer (its
  // gradient is allocated by the chain's B_1 and only added to before the call's ops).
  for (int variant = 0; variant < 2; ++variant)
    for (Hold hold : {Hold::variable, Hold::parameter}) {
      Builder<float> b = [variant, hold](Model<float>& m) {
        m.hold = hold;
        remat::Var<float> a = m.tape->variable(remat_test::random_matrix<float>(32, 8, 5));
        m.extra.push_back(a);
        const std::size_t k = m.add(8, 8, 0.3);
        m.add(1, 8, 0.1);
        if (variant == 0) {  // 8 → 64 → 8 inside the region: its replay regenerates two [32,64] values
          const std::size_t up = m.add(8, 64, 0.3);
          m.add(64, 8, 0.3);
          auto f = [&m, k, up](remat::Var<float> h) {
            remat::Var<float> wide = remat::tanh(remat::matmul(remat::tanh(h), m.w(up)));
            return remat::tanh(remat::linear(remat::matmul(wide, m.w(up + 1)), m.w(k), m.w(k + 1)));
          };
          m.x0 = remat::checkpoint(f)(a);
        } else {
          m.x0 = remat::tanh(remat::matmul(a, m.w(k)));
          m.layers.push_back(
              [&m, k](remat::Var<float> h) { return remat::tanh(remat::linear(h, m.w(k), m.w(k + 1))); });
        }
        add_layer(m, k_sigmoid_linear, 8, 8);
        add_layer(m, k_layer_norm, 8, 8);
        add_loss(m, 8);
      };
      check<float>(std::string(variant == 0 ? "input from a region" : "input shares a weight") +
                       (hold == Hold::variable ? " var" : " param"),
                   b, 500, 4);
    }
}

/// x_0 = checkpoint_sequential_auto(first chain of 4 tanh(linear) layers 8 → 48 → 48 → 48 → 8, a [32,8])
/// recorded on `tape`, its weights tape variables, at `budget` (its least budget if 0: found on a scratch
/// tape). The second chain's call then sees the first chain's regions before it.
remat::Var<float> first_chain(remat::Tape<float>& tape, std::size_t budget, std::vector<remat::Var<float>>& grads) {
  if (budget == 0) {
    remat::Tape<float> scratch;
    std::vector<remat::Var<float>> unused;
    try {
      first_chain(scratch, 1, unused);
    } catch (const remat::memory_budget_error& e) {
      budget = e.least_budget_bytes();
    }
  }
  remat::Var<float> a = tape.variable(remat_test::random_matrix<float>(32, 8, 15));
  grads.push_back(a);
  std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers;
  const remat::Index widths[] = {8, 48, 48, 48, 8};
  for (int i = 0; i < 4; ++i) {
    remat::Var<float> w = tape.variable(remat_test::random_matrix<float>(widths[i], widths[i + 1], 20 + i) * 0.3f);
    remat::Var<float> b = tape.variable(remat_test::random_matrix<float>(1, widths[i + 1], 30 + i) * 0.1f);
    grads.push_back(w);
    grads.push_back(b);
    layers.push_back([w, b](remat::Var<float> h) { return remat::tanh(remat::linear(h, w, b)); });
  }
  return remat::checkpoint_sequential_auto(layers, a, budget);
}

TEST(AutoBudgetPromise, InputFromAnotherAutoChain) {
  // Two checkpoint_sequential_auto calls in a row: the second one's budget bounds the first one's backward
  // (its regions replay after the second chain's backward) by the largest of its regions.
  Builder<float> b = [](Model<float>& m) {
    m.hold = Hold::variable;
    m.x0 = first_chain(*m.tape, 0, m.extra);
    add_layer(m, k_tanh_linear, 8, 16);
    add_layer(m, k_layer_norm, 16, 16);
    add_loss(m, 16);
  };
  check<float>("input from another auto chain", b, 500, 4);
}

TEST(AutoBudgetPromise, WeightsDominateAndActivationsDominate) {
  const std::vector<int> kinds{k_tanh_linear, k_layer_norm, k_relu_linear, k_sigmoid_linear, k_two_branches};
  for (Hold hold : {Hold::variable, Hold::parameter, Hold::parameter_in_layer}) {
    check<float>("weights dominate", chain<float>(kinds, 2, {32, 48, 40, 48, 32}, hold, true), 500, 3);
    check<float>("activations dominate", chain<float>(kinds, 96, {3, 4, 3, 5, 4}, hold, true), 500, 3);
  }
}

TEST(AutoBudgetPromise, OneLayerChains) {
  // The loss layer alone, and a lone layer whose output is the loss.
  check<float>("loss layer only", chain<float>({}, 16, {8}, Hold::variable, true), 500, 3);
  Builder<float> b = [](Model<float>& m) {
    m.hold = Hold::variable;
    m.x0 = m.tape->variable(remat_test::random_matrix<float>(16, 8, 9));
    m.extra.push_back(m.x0);
    m.layers.push_back([](remat::Var<float> h) { return remat::sum(remat::exp(h)); });
  };
  check<float>("sum(exp(h)) only", b, 500, 3);
}

TEST(AutoBudgetPromise, LongChains) {
  std::vector<int> mixed;
  for (int i = 0; i < 14; ++i) mixed.push_back(i % kind_count);
  check<float>("14 mixed layers", chain<float>(mixed, 16, {6, 8, 5, 9, 7}, Hold::variable, true), 500, 3);
  check<float>("14 mixed layers, parameters in layers",
               chain<float>(mixed, 16, {6, 8, 5, 9, 7}, Hold::parameter_in_layer, false), 500, 3);
  check<float>("13 sigmoid layers", chain<float>(std::vector<int>(13, k_sigmoid_linear), 24, {6}, Hold::variable, true),
               500, 3);
}

TEST(AutoBudgetPromise, CoarseResolutions) {
  const std::vector<int> kinds{k_tanh_linear, k_exp_linear, k_region_nothing, k_layer_norm, k_sigmoid_linear};
  for (int resolution : {1, 2, 5, 20}) {
    check<float>("resolution " + std::to_string(resolution),
                 chain<float>(kinds, 24, {6, 8, 5, 9, 7}, Hold::variable, true), resolution, 3);
    check<float>("resolution " + std::to_string(resolution) + " params in layers",
                 chain<float>(kinds, 24, {6, 8, 5, 9, 7}, Hold::parameter_in_layer, false), resolution, 3);
  }
}

TEST(AutoBudgetPromise, DoubleTape) {
  const std::vector<int> kinds{k_sigmoid_linear, k_region_dots, k_exp_exp, k_softmax_linear, k_dropout};
  check<double>("double", chain<double>(kinds, 24, {6, 8, 5, 9, 7}, Hold::variable, true), 500, 3);
  check<double>("double params in layers", chain<double>(kinds, 24, {6, 8, 5, 9, 7}, Hold::parameter_in_layer, true),
                500, 3);
}

// Regression: a layer_norm layer whose kept output held its row statistics (the op's extra buffer, which a tape
// keeps with a region output whose backward reads it) beyond the model's ω_x: chain 38 (exp_linear,
// layer_norm, tanh_linear) exceeded its budget by 105 B until the model counted ω_c (Chain::checkpoint_size).
TEST(AutoBudgetPromise, RandomMixedChains) {
  std::mt19937 rng(20261202);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int c = 0; c < 40; ++c) {
    std::vector<int> kinds(static_cast<std::size_t>(uniform(1, 7)));
    for (int& k : kinds) k = uniform(0, kind_count - 1);
    std::vector<remat::Index> widths;
    for (int i = 0; i < 5; ++i) widths.push_back(uniform(2, 12));
    const Hold hold = static_cast<Hold>(uniform(0, 2));
    const bool var = uniform(0, 1) == 1;
    const int resolution = uniform(0, 3) == 0 ? uniform(3, 30) : 500;
    const int rows = uniform(4, 40);
    std::string name = "random " + std::to_string(c) + ":";
    for (int k : kinds) name += std::string(" ") + kind_name(k);
    name += " rows " + std::to_string(rows) + " widths";
    for (auto w : widths) name += " " + std::to_string(w);
    name += " hold " + std::to_string(static_cast<int>(hold)) + (var ? " x0 var" : " x0 const") + " resolution " +
            std::to_string(resolution);
    if (uniform(0, 1) == 0)
      check<float>(name, chain<float>(kinds, rows, widths, hold, var), resolution, 2, c);
    else
      check<double>(name + " (double)", chain<double>(kinds, rows, widths, hold, var), resolution, 2, c);
  }
}

// ---- regression cases reduced from RandomMixedChains, each at its least budget ----

/// The least budget of `build`, then one run at it: EXPECT peak ≤ budget, printing the memory before and after
/// the backward.
template <class T>
void check_least(const std::string& name, const Builder<T>& build, int resolution = 500) {
  SCOPED_TRACE(name);
  const Outcome<T> plain = run(build, 0, resolution);
  const std::size_t least = least_budget(build, 1, resolution, plain);
  const Outcome<T> o = run(build, least, resolution);
  std::printf("%-50s budget %zu: before backward %s\n%-50s after backward %s (plain peak %zu)\n", name.c_str(), least,
              remat_test::describe(o.before_backward).c_str(), "", remat_test::describe(o.after_backward).c_str(),
              plain.after_backward.peak_bytes);
  EXPECT_LE(o.after_backward.peak_bytes, least)
      << "before backward: " << remat_test::describe(o.before_backward)
      << "\nafter backward: " << remat_test::describe(o.after_backward) << "\n"
      << describe_chain(o.report);
  for (std::size_t i = 0; i < o.grads.size() && i < plain.grads.size(); ++i)
    EXPECT_TRUE(bitwise_equal(o.grads[i], plain.grads[i])) << "gradient " << i;
}

TEST(AutoBudgetPromiseMinimal, SharedWeightTwoLayers) {
  // W [48,48] recorded before the chain; layers 1 and 2 are tanh(h·W), then the loss layer.
  Builder<float> b = [](Model<float>& m) {
    m.hold = Hold::variable;
    m.x0 = m.tape->constant(remat_test::random_matrix<float>(16, 48, 3));
    const std::size_t k = m.add(48, 48, 0.3);
    for (int i = 0; i < 2; ++i)
      m.layers.push_back([&m, k](remat::Var<float> h) { return remat::tanh(remat::matmul(h, m.w(k))); });
    add_loss(m, 48);
  };
  check_least<float>("minimal shared weight, 2 layers", b);
}

TEST(AutoBudgetPromiseMinimal, TapeVariableInsideOneLayer) {
  // One layer tanh(h·V) recording its own tape variable V [16,16], then the loss layer.
  Builder<float> b = [](Model<float>& m) {
    m.hold = Hold::variable;
    m.x0 = m.tape->constant(remat_test::random_matrix<float>(4, 16, 3));
    m.slots.emplace_back();
    m.layers.push_back([&m](remat::Var<float> h) {
      m.slots[0] = m.tape->variable(remat_test::random_matrix<float>(16, 16, 100) * 0.3f);
      return remat::tanh(remat::matmul(h, m.slots[0]));
    });
    add_loss(m, 16);
  };
  check_least<float>("minimal tape variable inside 1 layer", b);
}

TEST(AutoBudgetPromiseMinimal, ConstantInsideOneLayer) {
  // One layer h ⊙ C recording its own constant C [32,16] (read by multiply's backward), then the loss layer.
  Builder<float> b = [](Model<float>& m) {
    m.hold = Hold::variable;
    m.x0 = m.tape->variable(remat_test::random_matrix<float>(32, 16, 3));
    m.extra.push_back(m.x0);
    m.layers.push_back(
        [&m](remat::Var<float> h) { return h * m.tape->constant(remat_test::random_matrix<float>(32, 16, 200)); });
    add_loss(m, 16);
  };
  check_least<float>("minimal constant inside 1 layer", b);
}

// The backward of what was recorded before the chain runs after the chain's: before it was bounded
// (detail::after_chain_bytes), the minimal case peaked at 34,332 B against a budget of 26,594 B.
TEST(AutoBudgetPromiseMinimal, InputComputedBeforeTheChainOneLayer) {
  // x_0 = A · 2 with A a tape variable [32,64]; the chain is the loss layer alone.
  Builder<float> b = [](Model<float>& m) {
    m.hold = Hold::variable;
    remat::Var<float> a = m.tape->variable(remat_test::random_matrix<float>(32, 64, 5));
    m.extra.push_back(a);
    m.x0 = a * 2.0f;
    add_loss(m, 64);
  };
  check_least<float>("minimal input computed before chain", b);
}

TEST(AutoBudgetPromiseMinimal, LossValueHeldThroughTheBackward) {
  // tanh(linear(h)) with its Parameters recorded in the layer, x_0 a constant [20,7], then the loss layer
  // (reduced from RandomMixedChains: 4 B over for float, 8 B for double: one element, the loss value).
  check_least<float>("minimal tanh_linear, params in layer, x0 const",
                     chain<float>({k_tanh_linear}, 20, {7, 4}, Hold::parameter_in_layer, false));
  check_least<double>("minimal tanh_linear, params in layer, x0 const (double)",
                      chain<double>({k_tanh_linear}, 20, {7, 4}, Hold::parameter_in_layer, false));
}

// The checkpoint x_1 = layer_norm(linear(x_0)) holds its row statistics ([20,2], 160 B) with its value until
// B_1, which replays only the linear: without ω_c the model counted 560 B for it, and B_2 peaked 28 B over
// the least budget (4,252 against 4,224 B).
TEST(AutoBudgetPromiseMinimal, LayerNormThenTanhLinear) {
  // layer_norm(linear(h)) [20,7] → tanh(linear(h)) [20,9] → loss, weights tape variables before the chain,
  // x_0 a constant (reduced from RandomMixedChains; 28 B over at the least budget).
  check_least<float>("minimal layer_norm, tanh_linear",
                     chain<float>({k_layer_norm, k_tanh_linear}, 20, {7, 4, 9}, Hold::variable, false));
}

}  // namespace auto_budget_promise_test
