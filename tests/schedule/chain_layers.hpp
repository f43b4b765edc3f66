// Shared by the chain-region tests (chain_region_layers_test.cpp, chain_region_budget_test.cpp): a Net of
// layers of every kind (tanh∘linear, identity, Parameters recorded inside the layer, a checkpoint region of its
// own with each policy, layer_norm, a cross-entropy loss layer, dropout reseeded inside the layer), the
// schedules run_schedule may be given (detail::run_chain_schedule, non-persistent ones included), and the
// oracle: the same layers on a plain tape, loss and every gradient bitwise equal, held handles' values equal;
// for checkpoint_sequential_auto, peak_bytes ≤ budget.
#pragma once

#include <gtest/gtest.h>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

namespace chain_layers {

using V = remat::Var<float>;
using M = remat::Matrix<float>;
using Layer = std::function<V(V)>;
using Tape = remat::Tape<float>;

constexpr remat::Index rows = 16, width = 8;

inline bool same(const M& a, const M& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && (a.array() == b.array()).all();
}

// ---- non-persistent schedules for L layers ----

/// A synthetic heterogeneous chain of L layers (sizes and times only matter for which schedule comes out).
inline remat::Chain synthetic_chain(int L) {
  remat::Chain c;
  for (int j = 0; j <= L; ++j) c.activation_size.push_back(2 + (j * 5) % 7);
  for (int i = 0; i < L; ++i) {
    c.tape_size.push_back(c.activation_size[static_cast<std::size_t>(i + 1)] + 1 + (i * 3) % 5);
    c.forward_time.push_back(1 + (i * 7) % 10);
    c.backward_time.push_back(2 * c.forward_time.back() + i % 3);
  }
  return c;
}

inline bool same_ops(const remat::Schedule& a, const remat::Schedule& b) {
  if (a.operations.size() != b.operations.size()) return false;
  for (std::size_t k = 0; k < a.operations.size(); ++k)
    if (a.operations[k].kind != b.operations[k].kind || a.operations[k].layer != b.operations[k].layer) return false;
  return true;
}

/// Up to `most` distinct non-persistent schedules for L layers (different budgets of the synthetic chain;
/// for L = 6 also the one of chain_region_test).
inline std::vector<remat::Schedule> schedules_for(int L, std::size_t most = 3) {
  std::vector<remat::Schedule> out;
  auto add = [&](remat::Schedule s) {
    if (!s.feasible || remat::detail::persistent(s)) return;
    for (const auto& o : out)
      if (same_ops(o, s)) return;
    out.push_back(std::move(s));
  };
  if (L == 6) {
    remat::Chain c{{10, 10, 10, 3, 8, 1},
                   {2, 19, 19, 11, 4, 15},
                   {6, 4, 2, 6, 4, 2, 4},
                   {10, 8, 7, 4, 6, 9},
                   {},
                   {},
                   {},
                   {},
                   {},
                   {}};
    add(remat::plan_schedule(c, 26, false));
  }
  const remat::Chain c = synthetic_chain(L);
  for (std::int64_t b = 1; b < 200 && out.size() < most; ++b) add(remat::plan_schedule(c, b, false));
  return out;
}

inline std::string describe(const remat::Schedule& s) {
  static const char* const names[] = {" F", " Fall", " B", " free"};
  std::string r;
  for (const auto& op : s.operations) r += names[op.kind] + std::to_string(op.layer);
  return r;
}

// ---- the model ----

/// Everything one run owns. Built afresh for every run by a Build function, so both runs see the same
/// weights, inputs and masks.
struct Net {
  Tape* tape = nullptr;
  std::deque<remat::Parameter<float>> params;  // recorded inside layers (or before: see `vars`)
  std::vector<V> vars;                         // tape variables recorded before the chain (x_0 among them)
  std::vector<Layer> layers;
  V x0;
  std::vector<int> labels;
  std::vector<V> held;  // handles to values inside layers, captured by the layers (latest recording of each)
  std::vector<std::size_t> held_slot;
  std::uint64_t seed = 1;

  M rnd(remat::Index r, remat::Index c, float scale) { return remat_test::random_matrix<float>(r, c, seed++) * scale; }
  V var(remat::Index r, remat::Index c, float scale) {
    vars.push_back(tape->variable(rnd(r, c, scale)));
    return vars.back();
  }
  std::size_t param(remat::Index r, remat::Index c, float scale) {
    params.emplace_back(rnd(r, c, scale));
    return params.size() - 1;
  }
  /// Keeps `v` in held[slot] (slot allocated at build time); returns v.
  V hold(std::size_t slot, V v) {
    held[slot] = v;
    return v;
  }
  std::size_t new_slot() {
    held.emplace_back();
    return held.size() - 1;
  }
};

using Build = std::function<void(Net&)>;

struct Result {
  M loss;
  std::vector<M> grads;
  std::vector<M> held_values;
  remat::MemoryStats before_backward, after;
  remat::Schedule schedule;  // what auto ran
};

inline std::vector<M> gradients(const Net& n) {
  std::vector<M> g;
  for (const auto& v : n.vars) g.emplace_back(v.grad());
  for (const auto& p : n.params) g.emplace_back(p.grad());
  return g;
}

/// How the chain runs: 0 plain, 1 run_schedule(schedule), 2 checkpoint_sequential_auto(budget).
struct How {
  int kind = 0;
  const remat::Schedule* schedule = nullptr;
  std::size_t budget = 0;
};

inline V run_chain_on(Net& n, V x, const How& how, remat::AutoScheduleReport* report = nullptr) {
  if (how.kind == 1) return remat::run_schedule(n.layers, *how.schedule, x);
  if (how.kind == 2) return remat::checkpoint_sequential_auto(n.layers, x, how.budget, report);
  for (const auto& layer : n.layers) x = layer(x);
  return x;
}

/// Loss, backward, gradients and held values of a step recorded on `tape` for `n`.
inline Result backward_step(Tape& tape, const Net& n, const V& loss) {
  Result r;
  r.loss = loss.value();
  r.before_backward = tape.memory();
  tape.backward(loss);
  r.after = tape.memory();
  r.grads = gradients(n);
  for (const auto& h : n.held) r.held_values.emplace_back(h.value());
  return r;
}

/// The chain's output is the loss when `head` is empty; otherwise loss = head(output).
inline Result run(const Build& build, const How& how, const std::function<V(Net&, V)>& head = {}) {
  Tape tape;
  Net n;
  n.tape = &tape;
  build(n);
  remat::AutoScheduleReport report;
  V y = run_chain_on(n, n.x0, how, &report);
  Result r = backward_step(tape, n, head ? head(n, y) : y);
  r.schedule = report.schedule;
  return r;
}

inline void expect_same(const Result& want, const Result& got, const std::string& what) {
  EXPECT_TRUE(same(want.loss, got.loss)) << what << ": loss " << want.loss << " vs " << got.loss;
  ASSERT_EQ(want.grads.size(), got.grads.size()) << what;
  for (std::size_t k = 0; k < want.grads.size(); ++k)
    EXPECT_TRUE(same(want.grads[k], got.grads[k])) << what << ": gradient " << k;
  ASSERT_EQ(want.held_values.size(), got.held_values.size()) << what;
  for (std::size_t k = 0; k < want.held_values.size(); ++k)
    EXPECT_TRUE(same(want.held_values[k], got.held_values[k])) << what << ": held value " << k;
}

/// Every non-persistent schedule of schedules_for(L) against the plain tape.
inline void check_schedules(const std::string& name, const Build& build, const std::function<V(Net&, V)>& head = {}) {
  SCOPED_TRACE(name);
  const Result plain = run(build, How{}, head);
  Tape probe;
  Net n;
  n.tape = &probe;
  build(n);
  const int L = static_cast<int>(n.layers.size());
  const auto schedules = schedules_for(L);
  ASSERT_FALSE(schedules.empty()) << "no non-persistent schedule for L = " << L;
  for (const auto& s : schedules) {
    const Result got = run(build, How{1, &s, 0}, head);
    expect_same(plain, got, name + " schedule" + describe(s));
    EXPECT_EQ(got.after.saved_bytes, 0u) << name << " schedule" << describe(s);
  }
}

/// checkpoint_sequential_auto at the least budget, least + 1, between least and the plain peak, and
/// 2 × the plain peak: bitwise, peak ≤ budget. least − 1 throws memory_budget_error. The chain's last layer
/// must be the loss. Returns how many of the runs were non-persistent.
inline int check_auto(const std::string& name, const Build& build) {
  SCOPED_TRACE(name);
  const Result plain = run(build, How{});
  std::size_t least = 0;
  {
    Tape tape;
    Net n;
    n.tape = &tape;
    build(n);
    try {
      remat::checkpoint_sequential_auto(n.layers, n.x0, 1);
      ADD_FAILURE() << "budget 1 did not throw";
    } catch (const remat::memory_budget_error& e) {
      least = e.least_budget_bytes();
    }
    // The tape stays usable after it: the plain chain on it.
    V y = run_chain_on(n, n.x0, How{});
    tape.backward(y);
    const auto g = gradients(n);
    for (std::size_t k = 0; k < g.size(); ++k) EXPECT_TRUE(same(g[k], plain.grads[k])) << "after throw " << k;
  }
  if (least > 1) {
    Tape tape;
    Net n;
    n.tape = &tape;
    build(n);
    EXPECT_THROW(remat::checkpoint_sequential_auto(n.layers, n.x0, least - 1), remat::memory_budget_error);
  }
  const std::size_t plain_peak = plain.after.peak_bytes;
  int non_persistent = 0;
  for (std::size_t budget : {least, least + 1, least + (std::max(least, plain_peak) - least) / 2, 2 * plain_peak}) {
    if (budget < least) continue;
    const Result got = run(build, How{2, nullptr, budget});
    const std::string what = name + " budget " + std::to_string(budget) + " (least " + std::to_string(least) +
                             ", plain peak " + std::to_string(plain_peak) + ")" + describe(got.schedule);
    EXPECT_LE(got.after.peak_bytes, budget) << what;
    expect_same(plain, got, what);
    non_persistent += remat::detail::persistent(got.schedule) ? 0 : 1;
  }
  std::printf("%-44s least %6zu plain peak %6zu, %d of 4 runs non-persistent\n", name.c_str(), least, plain_peak,
              non_persistent);
  return non_persistent;
}

// ---- layer kinds ----

inline Layer tanh_linear(Net& n) {
  V w = n.var(width, width, 0.5f), b = n.var(1, width, 0.1f);
  return [w, b](V h) { return remat::tanh(remat::linear(h, w, b)); };
}
inline Layer sum_loss() {
  return [](V h) { return remat::sum(h); };
}
inline Layer identity() {
  return [](V h) { return h; };
}
/// tanh(linear(h)) with a fresh leaf of a Parameter each call.
inline Layer param_layer(Net& n) {
  const std::size_t k = n.param(width, width, 0.5f);
  Net* p = &n;
  return [p, k](V h) { return remat::sigmoid(remat::matmul(h, p->tape->variable(p->params[k]))); };
}
/// A layer with a checkpoint region of its own, policy `policy`: 0 nothing, 1 dots, 2 names, 3 region whose
/// input is an intermediate of the layer, 4 a region nested in a region.
inline Layer region_layer(Net& n, int policy) {
  V w = n.var(width, width, 0.5f), b = n.var(1, width, 0.1f);
  auto f = [w, b](V v) {
    V t = remat::checkpoint_name(remat::tanh(v), "t");
    return remat::tanh(remat::linear(t, w, b));
  };
  switch (policy) {
    case 0:
      return [f](V h) { return remat::checkpoint(f, remat::policies::nothing_saveable)(h); };
    case 1:
      return [f](V h) { return remat::checkpoint(f, remat::policies::dots_saveable)(h); };
    case 2:
      return [f](V h) { return remat::checkpoint(f, remat::policies::save_only_these_names({"t"}))(h); };
    case 3:
      return [f](V h) { return remat::exp(remat::checkpoint(f)(remat::sigmoid(h)) * 0.5); };
    default:
      return [f](V h) {
        return remat::checkpoint([f](V v) { return remat::checkpoint(f, remat::policies::dots_saveable)(v) * v; })(h);
      };
  }
}
inline Layer layer_norm_layer(Net& n) {
  V w = n.var(width, width, 0.5f), b = n.var(1, width, 0.1f), g = n.var(1, width, 1.0f), c = n.var(1, width, 0.1f);
  return [w, b, g, c](V h) { return remat::layer_norm(remat::linear(h, w, b), g, c); };
}
inline Layer cross_entropy_loss(Net& n) {
  V w = n.var(width, 3, 0.5f), b = n.var(1, 3, 0.1f);
  for (remat::Index r = 0; r < rows; ++r) n.labels.push_back(static_cast<int>(r % 3));
  Net* p = &n;
  return [p, w, b](V h) { return remat::cross_entropy(remat::linear(h, w, b), p->labels); };
}
inline Layer dropout_layer(Net& n, std::uint64_t seed) {
  V w = n.var(width, width, 0.5f), b = n.var(1, width, 0.1f);
  Net* p = &n;
  return [p, w, b, seed](V h) {
    p->tape->seed(seed);
    return remat::dropout(remat::tanh(remat::linear(h, w, b)), 0.3);
  };
}

inline void input(Net& n, bool variable = true) {
  M x = n.rnd(rows, width, 1.0f);
  if (variable) {
    n.vars.push_back(n.tape->variable(x));
    n.x0 = n.vars.back();
  } else {
    n.x0 = n.tape->constant(x);
  }
}

}  // namespace chain_layers
