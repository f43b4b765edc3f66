// Chain regions (run_schedule with non-persistent schedules: detail::run_chain_schedule; the backward runs them
// in detail/sweep.hpp, run_chain) on layers and situations chain_region_test.cpp and auto_budget_promise_test.cpp
// do not cover: layers with regions of their own, Parameters and variables recorded inside layers, identity
// layers, layer_norm and a cross-entropy loss layer, dropout reseeded inside a layer, two chains on one tape, a
// chain output that receives no gradient, handles to values inside layers, interior values used after the chain,
// retained backwards, gradient targets inside and outside the chain, constants and skip connections, nested
// schedules, a layer that clears the tape or returns another tape's Var, the shapes-only estimate, a layer that
// throws on its k-th call. The oracle (chain_layers.hpp) is the same layers on a plain tape; after any exception
// the tape stays usable.
#include <gtest/gtest.h>

#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "chain_layers.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/schedule/checkpoint_sequential_auto.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace chain_region_layers_test {

using namespace chain_layers;  // NOLINT(google-build-using-namespace): the chain-region tests' shared helpers

// ---- tests ----

TEST(ChainRegionLayers, SchedulesAreNonPersistent) {
  for (int L : {3, 4, 5, 6, 7, 8}) {
    const auto s = schedules_for(L);
    EXPECT_FALSE(s.empty()) << L;
    for (const auto& x : s) std::printf("L=%d:%s\n", L, describe(x).c_str());
  }
}

TEST(ChainRegionLayers, LayersWithCheckpointRegionsOfTheirOwn) {
  for (int policy = 0; policy < 5; ++policy) {
    const Build b = [policy](Net& n) {
      input(n);
      n.layers.push_back(tanh_linear(n));
      n.layers.push_back(region_layer(n, policy));
      n.layers.push_back(tanh_linear(n));
      n.layers.push_back(region_layer(n, policy));
      n.layers.push_back(region_layer(n, (policy + 1) % 5));
      n.layers.push_back(sum_loss());
    };
    check_schedules("regions policy " + std::to_string(policy), b);
  }
  const Build all = [](Net& n) {
    input(n);
    for (int p = 0; p < 5; ++p) n.layers.push_back(region_layer(n, p));
    n.layers.push_back(sum_loss());
  };
  check_schedules("every region kind", all);
}

TEST(ChainRegionLayers, ParametersInsideLayersAndVariablesRecordedBefore) {
  const Build b = [](Net& n) {
    input(n);
    V shared = n.var(width, width, 0.4f);  // recorded before the chain, read by layers 1, 3 and 5
    n.layers.push_back([shared](V h) { return remat::tanh(remat::matmul(h, shared)); });
    n.layers.push_back(param_layer(n));
    n.layers.push_back([shared](V h) { return remat::sigmoid(remat::matmul(h, shared)) + h; });
    n.layers.push_back(param_layer(n));
    n.layers.push_back([shared](V h) { return remat::tanh(remat::matmul(h, shared)) * h; });
    n.layers.push_back(sum_loss());
  };
  check_schedules("parameters inside, variables before", b);
  // A Parameter shared by every layer, recorded in each.
  const Build shared_param = [](Net& n) {
    input(n, false);
    const std::size_t k = n.param(width, width, 0.5f);
    Net* p = &n;
    for (int i = 0; i < 5; ++i)
      n.layers.push_back([p, k](V h) { return remat::tanh(remat::matmul(h, p->tape->variable(p->params[k]))); });
    n.layers.push_back(sum_loss());
  };
  check_schedules("one parameter in every layer", shared_param);
}

TEST(ChainRegionLayers, IdentityLayers) {
  for (int where = 0; where < 6; ++where) {
    const Build b = [where](Net& n) {
      input(n);
      for (int i = 0; i < 5; ++i)
        n.layers.push_back(i == where || (where == 5 && i >= 3) ? identity() : tanh_linear(n));
      n.layers.push_back(sum_loss());
    };
    check_schedules("identity at " + std::to_string(where), b);
  }
  const Build all = [](Net& n) {
    input(n);
    for (int i = 0; i < 5; ++i) n.layers.push_back(identity());
    n.layers.push_back(sum_loss());
  };
  check_schedules("every layer identity", all);
  // A layer returning an outside value (a tape variable recorded before the chain).
  const Build outside = [](Net& n) {
    input(n);
    V c = n.var(rows, width, 1.0f);
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back([c](V) { return c; });
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(sum_loss());
  };
  check_schedules("outside value", outside);
}

TEST(ChainRegionLayers, LayerNormAndACrossEntropyLossLayer) {
  const Build b = [](Net& n) {
    input(n);
    n.layers.push_back(layer_norm_layer(n));
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(layer_norm_layer(n));
    n.layers.push_back(layer_norm_layer(n));
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(cross_entropy_loss(n));
  };
  check_schedules("layer_norm, cross_entropy", b);
}

TEST(ChainRegionLayers, DropoutReseededInsideTheLayer) {
  const Build b = [](Net& n) {
    input(n);
    n.layers.push_back(dropout_layer(n, 11));
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(dropout_layer(n, 12));
    n.layers.push_back(dropout_layer(n, 13));
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(sum_loss());
  };
  check_schedules("dropout", b);
}

TEST(ChainRegionLayers, TwoChainsInARowOnOneTape) {
  // The second chain's x_0 is the first's output: the schedules and holds of both on one tape.
  const auto s6 = schedules_for(6);
  const auto s5 = schedules_for(5);
  ASSERT_FALSE(s6.empty());
  ASSERT_FALSE(s5.empty());
  auto build = [](Net& n) {
    input(n);
    for (int i = 0; i < 6; ++i) n.layers.push_back(i % 2 ? region_layer(n, i % 5) : tanh_linear(n));
  };
  auto second = [](Net& n, std::vector<Layer>& l) {
    l.push_back(layer_norm_layer(n));
    l.push_back(tanh_linear(n));
    l.push_back(identity());
    l.push_back(tanh_linear(n));
    l.push_back(cross_entropy_loss(n));
  };
  for (int mode = 0; mode < 3; ++mode) {
    SCOPED_TRACE(mode);
    std::vector<Result> results;
    for (int scheduled = 0; scheduled < 2; ++scheduled) {
      Tape tape;
      Net n;
      n.tape = &tape;
      build(n);
      std::vector<Layer> l2;
      second(n, l2);
      V y = n.x0, loss;
      if (!scheduled) {
        for (const auto& f : n.layers) y = f(y);
        for (const auto& f : l2) y = f(y);
        loss = y;
      } else if (mode == 0) {
        loss = remat::run_schedule(l2, s5[0], remat::run_schedule(n.layers, s6[0], n.x0));
      } else if (mode == 1) {  // the second by checkpoint_sequential_auto at a generous budget
        loss = remat::checkpoint_sequential_auto(l2, remat::run_schedule(n.layers, s6.back(), n.x0), 1u << 20);
      } else {  // both auto, the first at its... generous budget (peak not checked: the second's head)
        remat::AutoScheduleReport rep;
        V mid = remat::checkpoint_sequential_auto(n.layers, n.x0, 1u << 20, &rep);
        loss = remat::run_schedule(l2, s5.back(), mid);
      }
      Result r = backward_step(tape, n, loss);
      r.after = tape.memory();
      results.push_back(r);
    }
    expect_same(results[0], results[1], "two chains");
    EXPECT_EQ(results[1].after.saved_bytes, 0u);
  }
}

TEST(ChainRegionLayers, ChainOutputReceivesNoGradient) {
  const auto schedules = schedules_for(5);
  ASSERT_FALSE(schedules.empty());
  auto build = [](Net& n) {
    input(n);
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(region_layer(n, 0));
    n.layers.push_back(param_layer(n));
    n.layers.push_back(layer_norm_layer(n));
    n.layers.push_back(tanh_linear(n));
  };
  // 0: result unused; 1: detached; 2: detached, then a second chain on the same tape from the same x_0 that
  // the loss does use. (A tape takes one backward without retain_graph per recording: no second step here.)
  for (int mode = 0; mode < 3; ++mode) {
    for (const auto& s : schedules) {
      SCOPED_TRACE(mode);
      std::vector<Result> results;
      for (int scheduled = 0; scheduled < 2; ++scheduled) {
        Tape tape;
        Net n;
        n.tape = &tape;
        build(n);
        V other = n.var(rows, width, 1.0f);
        V y = scheduled ? remat::run_schedule(n.layers, s, n.x0) : run_chain_on(n, n.x0, How{});
        V loss;
        if (mode == 0) loss = remat::sum(remat::tanh(other));
        if (mode == 1) loss = remat::sum(remat::detach(y) * other);
        if (mode == 2) {
          V y2 = scheduled ? remat::run_schedule(n.layers, s, n.x0) : run_chain_on(n, n.x0, How{});
          loss = remat::sum(remat::detach(y) * other) + remat::sum(y2 * other);
        }
        Result r = backward_step(tape, n, loss);
        r.after = tape.memory();
        results.push_back(r);
      }
      expect_same(results[0], results[1], "no gradient, mode " + std::to_string(mode) + describe(s));
      EXPECT_EQ(results[1].after.saved_bytes, 0u) << mode << describe(s);
      EXPECT_EQ(results[1].after.live_bytes, results[0].after.live_bytes) << mode << describe(s);
    }
  }
}

TEST(ChainRegionLayers, HandlesToValuesInsideLayersOutliveTheChain) {
  // Each layer captures an intermediate (inside its own region too) into an outer vector; read after backward.
  const Build b = [](Net& n) {
    input(n);
    Net* p = &n;
    for (int i = 0; i < 5; ++i) {
      V w = n.var(width, width, 0.5f);
      const std::size_t s1 = n.new_slot(), s2 = n.new_slot();
      if (i % 2 == 0) {
        n.layers.push_back([p, w, s1, s2](V h) {
          V z = p->hold(s1, remat::matmul(h, w));
          return p->hold(s2, remat::tanh(z)) * h;
        });
      } else {
        n.layers.push_back([p, w, s1, s2](V h) {
          return remat::checkpoint([p, w, s1, s2](V v) {
            V t = p->hold(s1, remat::tanh(v));
            return remat::sigmoid(p->hold(s2, remat::matmul(t, w)));
          })(h);
        });
      }
    }
    n.layers.push_back(sum_loss());
  };
  check_schedules("handles inside layers", b);
}

TEST(ChainRegionLayers, AnInteriorValueUsedAfterTheChainIsATapeErrorAndTheTapeStaysUsable) {
  // The chain is one region (docs/checkpointing.md: values used outside a region must be returned by it):
  // using a value of layer 3 after the chain throws tape_error; the chain's own output still works.
  const auto schedules = schedules_for(5);
  ASSERT_FALSE(schedules.empty());
  const Build b = [](Net& n) {
    input(n);
    Net* p = &n;
    const std::size_t slot = n.new_slot();
    for (int i = 0; i < 5; ++i) {
      if (i == 2) {
        Layer f = tanh_linear(n);
        n.layers.push_back([p, f, slot](V h) { return p->hold(slot, f(h)); });
      } else {
        n.layers.push_back(tanh_linear(n));
      }
    }
  };
  const Result plain = run(b, How{}, [](Net&, V y) { return remat::sum(y); });
  for (const auto& s : schedules) {
    Tape tape;
    Net n;
    n.tape = &tape;
    b(n);
    V y = remat::run_schedule(n.layers, s, n.x0);
    EXPECT_THROW(remat::sum(n.held[0]), remat::tape_error);
    V loss = remat::sum(y);
    Result r = backward_step(tape, n, loss);
    expect_same(plain, r, "after the tape_error" + describe(s));
  }
}

TEST(ChainRegionLayers, RetainedBackwardTwiceWithEveryLayerKind) {
  const Build b = [](Net& n) {
    input(n);
    n.layers.push_back(region_layer(n, 0));
    n.layers.push_back(param_layer(n));
    n.layers.push_back(identity());
    n.layers.push_back(layer_norm_layer(n));
    n.layers.push_back(dropout_layer(n, 5));
    n.layers.push_back(region_layer(n, 2));
    n.layers.push_back(cross_entropy_loss(n));
  };
  const auto schedules = schedules_for(7);
  ASSERT_FALSE(schedules.empty());
  for (const auto& s : schedules) {
    std::vector<Result> results;
    for (int scheduled = 0; scheduled < 2; ++scheduled) {
      Tape tape;
      Net n;
      n.tape = &tape;
      b(n);
      V loss = run_chain_on(n, n.x0, scheduled ? How{1, &s, 0} : How{});
      Result r;
      r.loss = loss.value();
      tape.backward(loss, true);
      r.grads = gradients(n);
      tape.backward(loss, true);
      for (const M& g : gradients(n)) r.grads.push_back(g);
      tape.backward(loss);
      for (const M& g : gradients(n)) r.grads.push_back(g);
      r.after = tape.memory();
      results.push_back(r);
    }
    expect_same(results[0], results[1], "retained" + describe(s));
    EXPECT_EQ(results[1].after.saved_bytes, 0u) << describe(s);
  }
}

TEST(ChainRegionLayers, GradientTargetsInsideAndOutsideTheChain) {
  const auto schedules = schedules_for(6);
  ASSERT_FALSE(schedules.empty());
  const Build b = [](Net& n) {
    input(n);
    Net* p = &n;
    const std::size_t leaf = n.new_slot(), inner = n.new_slot(), inregion = n.new_slot();
    const std::size_t k = n.param(width, width, 0.5f);
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(
        [p, k, leaf](V h) { return remat::tanh(remat::matmul(h, p->hold(leaf, p->tape->variable(p->params[k])))); });
    n.layers.push_back(region_layer(n, 1));
    Layer f = tanh_linear(n);
    n.layers.push_back([p, f, inner](V h) { return p->hold(inner, f(h)); });
    V w = n.var(width, width, 0.5f);
    n.layers.push_back([p, w, inregion](V h) {
      return remat::checkpoint([p, w, inregion](V v) { return remat::tanh(p->hold(inregion, remat::matmul(v, w))); })(
          h);
    });
    n.layers.push_back(sum_loss());
  };
  for (const auto& s : schedules)
    for (int retain = 0; retain < 2; ++retain) {
      std::vector<std::vector<M>> got;
      std::vector<std::vector<M>> accumulated;
      for (int scheduled = 0; scheduled < 2; ++scheduled) {
        Tape tape;
        Net n;
        n.tape = &tape;
        b(n);
        V loss = run_chain_on(n, n.x0, scheduled ? How{1, &s, 0} : How{});
        std::vector<V> wrt = n.vars;
        for (const V& h : n.held) wrt.push_back(h);
        got.push_back(tape.gradient(loss, wrt, retain != 0));
        if (retain) {  // then a backward on the retained graph
          tape.backward(loss);
          accumulated.push_back(gradients(n));
          EXPECT_EQ(tape.memory().saved_bytes, 0u);
        } else {
          for (const M& g : gradients(n)) EXPECT_TRUE((g.array() == 0).all());
        }
      }
      ASSERT_EQ(got[0].size(), got[1].size());
      for (std::size_t i = 0; i < got[0].size(); ++i)
        EXPECT_TRUE(same(got[0][i], got[1][i])) << "target " << i << " retain " << retain << describe(s);
      if (retain) {
        for (std::size_t i = 0; i < accumulated[0].size(); ++i)
          EXPECT_TRUE(same(accumulated[0][i], accumulated[1][i])) << "after gradient, grad " << i << describe(s);
      }
    }
}
TEST(ChainRegionLayers, ConstantsAndSkipConnectionsInsideTheChain) {
  // A layer returning a constant recorded inside it (the gradient stops there).
  const Build constant = [](Net& n) {
    input(n);
    Net* p = &n;
    M c = n.rnd(rows, width, 1.0f);
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back([p, c](V h) { return h * p->tape->constant(c); });
    n.layers.push_back([p, c](V) { return p->tape->constant(c); });
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(sum_loss());
  };
  check_schedules("constant returned", constant);
  // A skip connection: layer 4 reads layer 1's output through a handle layer 2 stored and layer 4 drops
  // (the schedule frees x_1; F_4 / Fall_4 must regenerate it).
  const Build skip = [](Net& n) {
    input(n);
    auto stash = std::make_shared<V>();
    n.layers.push_back(tanh_linear(n));
    Layer f2 = tanh_linear(n), f4 = tanh_linear(n);
    n.layers.push_back([stash, f2](V h) {
      *stash = h;
      return f2(h);
    });
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back([stash, f4](V h) {
      V r = f4(h) + *stash;
      *stash = V();
      return r;
    });
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(sum_loss());
  };
  check_schedules("skip connection", skip);
}

TEST(ChainRegionLayers, NestedSchedulesInsideALayer) {
  // A layer running a persistent schedule or checkpoint_sequential_auto of its own (inside the chain's
  // region: persistent); a non-persistent one there is a domain_error, and the tape stays usable.
  const remat::Chain c3 = synthetic_chain(3);
  const remat::Schedule persistent3 = remat::plan_schedule(c3, 40, true);
  ASSERT_TRUE(persistent3.feasible);
  auto inner = [](Net& n) {
    std::vector<Layer> l;
    for (int i = 0; i < 3; ++i) l.push_back(tanh_linear(n));
    return l;
  };
  const Build b = [&](Net& n) {
    input(n);
    n.layers.push_back(tanh_linear(n));
    auto l1 = inner(n);
    n.layers.push_back([l1, &persistent3](V h) { return remat::run_schedule(l1, persistent3, h); });
    n.layers.push_back(tanh_linear(n));
    auto l2 = inner(n);
    n.layers.push_back([l2](V h) { return remat::checkpoint_sequential_auto(l2, h, 1u << 20); });
    n.layers.push_back(tanh_linear(n));
    n.layers.push_back(sum_loss());
  };
  check_schedules("nested schedules", b);
  const auto s6 = schedules_for(6);
  const auto s3 = schedules_for(3);
  ASSERT_FALSE(s3.empty());
  const Result plain = run(b, How{});
  Tape tape;
  Net n;
  n.tape = &tape;
  b(n);
  std::vector<Layer> bad = n.layers;
  auto l3 = inner(n);
  bad[1] = [l3, &s3](V h) { return remat::run_schedule(l3, s3[0], h); };
  EXPECT_THROW(remat::run_schedule(bad, s6[0], n.x0), remat::domain_error);
  V loss = remat::run_schedule(n.layers, s6[0], n.x0);
  Result r = backward_step(tape, n, loss);
  r.grads.resize(plain.grads.size());  // l3's weights were recorded after
  expect_same(plain, r, "after the domain_error");
}

TEST(ChainRegionLayers, ALayerThatClearsTheTapeOrReturnsAnotherTapesVar) {
  const auto s = schedules_for(5);
  ASSERT_FALSE(s.empty());
  const Build b = [](Net& n) {
    input(n);
    for (int i = 0; i < 4; ++i) n.layers.push_back(tanh_linear(n));
    n.layers.push_back(sum_loss());
  };
  const Result plain = run(b, How{});
  for (int mode = 0; mode < 2; ++mode) {
    SCOPED_TRACE(mode);
    Tape tape, other;
    Net n;
    n.tape = &tape;
    b(n);
    V foreign = other.variable(n.rnd(rows, width, 1.0f));
    std::vector<Layer> bad = n.layers;
    if (mode == 0)
      bad[2] = [&tape](V h) {
        V r = remat::tanh(h);
        tape.clear();
        return r;
      };
    else
      bad[2] = [foreign](V) { return foreign; };
    EXPECT_THROW(remat::run_schedule(bad, s[0], n.x0), remat::tape_error);
    // A fresh step: after clear() every Var is invalid, so build the net again on the same tape.
    Net fresh;
    fresh.tape = &tape;
    if (mode == 0) tape.clear();
    b(fresh);
    V loss = remat::run_schedule(fresh.layers, s.back(), fresh.x0);
    Result r = backward_step(tape, fresh, loss);
    expect_same(plain, r, "after the tape_error");
    EXPECT_EQ(tape.memory().saved_bytes, 0u);
  }
}

TEST(ChainRegionLayers, TheShapesOnlyEstimateIsTheRealRunWithEveryLayerKind) {
  const Build b = [](Net& n) {
    input(n);
    n.layers.push_back(region_layer(n, 0));
    n.layers.push_back(param_layer(n));
    n.layers.push_back(identity());
    n.layers.push_back(layer_norm_layer(n));
    n.layers.push_back(region_layer(n, 3));
    n.layers.push_back(region_layer(n, 4));
    n.layers.push_back(cross_entropy_loss(n));
  };
  for (const auto& s : schedules_for(7)) {
    const remat::MemoryEstimate e = remat::estimate_memory<float>([&](Tape& tape) {
      auto n = std::make_shared<Net>();
      n->tape = &tape;
      b(*n);
      V loss = remat::run_schedule(n->layers, s, n->x0);
      static std::shared_ptr<Net> keep;
      keep = n;  // the layers' Parameters outlive the call
      return loss;
    });
    const Result real = run(b, How{1, &s, 0});
    EXPECT_EQ(e.saved_bytes, real.before_backward.saved_bytes) << describe(s);
    EXPECT_EQ(e.forward_peak_bytes, real.before_backward.peak_bytes) << describe(s);
    EXPECT_EQ(e.peak_bytes, real.after.peak_bytes) << describe(s);
    EXPECT_EQ(e.replayed_ops, real.after.replayed_ops) << describe(s);
    EXPECT_EQ(e.replayed_bytes, real.after.replayed_bytes) << describe(s);
  }
}

// ---- exceptions ----

struct LayerFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A chain of 6 layers whose layer calls are counted; the call numbered `throw_at` (1-based, over all calls
/// of every layer) throws LayerFailure, from inside a nested region for odd layers.
struct Throwing {
  int calls = 0, throw_at = 0;
};

void throwing_build(Net& n, std::shared_ptr<Throwing> t) {
  input(n);
  for (int i = 0; i < 5; ++i) {
    V w = n.var(width, width, 0.5f);
    const bool nested = i % 2 == 1;
    n.layers.push_back([t, w, nested](V h) {
      const bool fail = ++t->calls == t->throw_at;
      if (!nested) {
        V z = remat::tanh(remat::matmul(h, w));
        if (fail) throw LayerFailure("layer failed");
        return z;
      }
      return remat::checkpoint([w, fail](V v) {
        V z = remat::sigmoid(remat::matmul(v, w));
        if (fail) throw LayerFailure("layer failed in its region");
        return z * v;
      })(h);
    });
  }
  n.layers.push_back([t](V h) {  // the loss layer counts (and may throw) too
    if (++t->calls == t->throw_at) throw LayerFailure("loss layer failed");
    return remat::sum(h);
  });
}

TEST(ChainRegionLayers, ALayerThrowingOnItsKthCallLeavesTheTapeUsable) {
  const auto schedules = schedules_for(6);
  ASSERT_FALSE(schedules.empty());
  const Result plain = run([](Net& n) { throwing_build(n, std::make_shared<Throwing>()); }, How{});
  // k ≤ 6: run_schedule throws; auto: k ≤ 6 in the probe, 7…12 in the real pass.
  for (int how = 1; how <= 2; ++how)
    for (int k = 1; k <= (how == 1 ? 6 : 12); ++k) {
      SCOPED_TRACE("how " + std::to_string(how) + " k " + std::to_string(k));
      const How h = how == 1 ? How{1, &schedules[0], 0} : How{2, nullptr, 1u << 20};
      // A fresh step on the same tape after the throw: 0 with the schedule (its layers no longer throw),
      // 1 plain. (One backward per recording: each on its own tape.)
      for (int then = 0; then < 2; ++then) {
        auto t = std::make_shared<Throwing>();
        t->throw_at = k;
        Tape tape;
        Net n;
        n.tape = &tape;
        throwing_build(n, t);
        EXPECT_THROW(run_chain_on(n, n.x0, h), LayerFailure);
        t->throw_at = 0;
        const How again = then == 1 ? How{} : how == 1 ? How{1, &schedules.back(), 0} : How{2, nullptr, 1u << 20};
        V loss = run_chain_on(n, n.x0, again);
        Result r = backward_step(tape, n, loss);
        expect_same(plain, r, then ? "plain after the throw" : "scheduled after the throw");
        EXPECT_EQ(tape.memory().saved_bytes, 0u);
      }
    }
}

}  // namespace chain_region_layers_test
