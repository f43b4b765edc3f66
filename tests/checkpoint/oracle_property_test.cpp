// The tape's saved and replayed sets against an independent oracle (oracle.hpp), which implements the
// lifetime rule of docs/design.md §2 and the JAX semantics of docs/checkpointing.md from the structure of
// each graph alone.
//
// Property test: the random programs of random_program.hpp (mixed ops with broadcasting, matmul, linear,
// multi-layer stacks, layer_norm, cross_entropy, softmax, dropout, checkpoint_name; the transformer ops:
// transpose, reshape, slice_cols, concat_cols, embedding, sum_cols, mean_cols, max_rows, detach, attention
// unfused and fused, whose batch dimensions dots_with_no_batch_dims_saveable must not save; constants, tape
// variables and remat::Parameter leaves, constant (frozen) weights; regions nested up to three deep, several
// per graph, with every library policy and random custom ones, one or two arguments, one or two outputs; a third
// of them N-D: ranks 1 to 4, broadcasting across ranks and size-1 dims, batched matmul, reductions over dims,
// softmax over a middle dim, permute, reshape, whose bytes the oracle counts from the shapes it was told).
// Each graph is recorded on a tape while a Graph description is built next to it (op names, inputs, shapes,
// the policy decisions evaluated there from what the test knows of each op); every handle but the loss and the
// leaves is released; then saved_bytes after the forward pass and replayed_ops / replayed_bytes after
// backward must equal the oracle's, and the loss and gradients must be bitwise those of the same graph
// without checkpoint. Fixed seeds, float and double.
//
// Hand-counted cases at the end: expected numbers written by hand (arithmetic in the comments), checked
// against the tape AND against the oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint_support.hpp"
#include "oracle.hpp"
#include "random_program.hpp"
#include "remat/remat.hpp"

namespace oracle_property_test {

using namespace random_program;

// ---------------------------------------------------------------------------------------------------
// One graph: the tape's figures, the oracle's, and the bitwise comparison with the run without checkpoint.

struct Numbers {
  std::size_t saved = 0, ops = 0, bytes = 0;
  friend bool operator==(const Numbers& a, const Numbers& b) {
    return a.saved == b.saved && a.ops == b.ops && a.bytes == b.bytes;
  }
};
std::string to_string(const Numbers& n) {
  return "saved " + std::to_string(n.saved) + " B, replayed " + std::to_string(n.ops) + " ops / " +
         std::to_string(n.bytes) + " B";
}
void PrintTo(const Numbers& n, std::ostream* os) {
  *os << to_string(n);
}

template <class T>
struct Recording {
  Numbers tape;
  int batch_dot_decisions = 0;  // Recorder::batch_dot_decisions
  Matrix<T> loss;
  std::vector<Matrix<T>> grads;
  remat_oracle::Graph graph;
  std::string residuals;  // the tape's print_saved_residuals after the forward pass
};

template <class T>
Recording<T> run_program(const Program& program, std::uint64_t tape_seed, bool checkpoint) {
  Run<T> run(program, tape_seed, checkpoint);  // only leaves and loss remain
  Recording<T> out;
  out.tape.saved = run.tape.memory().saved_bytes;
  if (checkpoint) {
    std::ostringstream os;
    run.tape.print_saved_residuals(os);
    out.residuals = os.str();
  }
  run.tape.backward(run.loss.var);
  out.tape.ops = run.tape.memory().replayed_ops;
  out.tape.bytes = run.tape.memory().replayed_bytes;
  out.loss = run.loss.var.value();
  out.grads = checkpoint_test::gradients_of(run.differentiable());
  out.graph = std::move(run.rec.graph);
  out.batch_dot_decisions = run.rec.batch_dot_decisions;
  return out;
}

Numbers oracle_numbers(const remat_oracle::Result& r) {
  return {r.saved_bytes, r.replayed_ops, r.replayed_bytes};
}

constexpr int graph_count = 1200;

/// The ops added with the transformer (the generator must cover each).
const char* const transformer_ops[] = {
    "transpose", "reshape",  "slice_cols", "concat_cols",      "embedding",        "sum_cols",
    "mean_cols", "max_rows", "detach",     "attention_scores", "attention_values", "scaled_dot_product_attention"};
constexpr int transformer_op_count = sizeof(transformer_ops) / sizeof(transformer_ops[0]);

/// How many detailed reports a failing run prints (REMAT_ORACLE_REPORTS overrides; the rest get one line).
int report_limit() {
  const char* s = std::getenv("REMAT_ORACLE_REPORTS");
  return s ? std::atoi(s) : 3;
}
/// REMAT_ORACLE_GRAPH=i runs graph i alone (to debug one graph; its report is printed in full).
int only_graph() {
  const char* s = std::getenv("REMAT_ORACLE_GRAPH");
  return s ? std::atoi(s) : -1;
}

template <class T>
class OracleGraphs : public ::testing::Test {};
TYPED_TEST_SUITE(OracleGraphs, checkpoint_test::Scalars);

/// Graphs on which the old and the new lifetime rules agree (Generator's `control`): passes on the tape
/// before the lifetime rewrite too, so it checks the test's model of each op (names, shapes, reads that do
/// not depend on requires-grad, region outputs) independently of what the rewrite changes.
TYPED_TEST(OracleGraphs, ControlGraphsWhereOldAndNewRulesAgree) {
  using T = TypeParam;
  int differ = 0;
  for (int i = 0; i < 300; ++i) {
    const Program program = Generator(90000 + static_cast<std::uint64_t>(i), /*control=*/true).generate();
    const Recording<T> ckpt = run_program<T>(program, 0xC0FFEE + static_cast<std::uint64_t>(i), true);
    const remat_oracle::Result expected = remat_oracle::compute(ckpt.graph);
    const Numbers oracle = oracle_numbers(expected);
    if (!(ckpt.tape == oracle) && differ++ < 3)
      ADD_FAILURE() << "control graph " << i << ": tape " << to_string(ckpt.tape) << "; oracle " << to_string(oracle)
                    << "\nprogram:\n"
                    << describe(program) << "oracle's view of the recorded graph:\n"
                    << remat_oracle::describe(ckpt.graph, expected) << "tape's residual report:\n"
                    << ckpt.residuals;
  }
  EXPECT_EQ(differ, 0);
}

TYPED_TEST(OracleGraphs, SavedAndReplayedEqualTheOracleAndGradientsAreBitwiseEqual) {
  using T = TypeParam;
  int differ = 0, reports = 0, threw = 0, gradient_failures = 0;
  const int limit = report_limit();
  Program coverage;
  int replaying_graphs = 0, batch_dot_decisions = 0, nd_programs = 0, nd_replaying = 0;
  std::vector<int> programs_with(transformer_op_count, 0);  // programs recording each transformer op
  const int only = only_graph();
  for (int i = 0; i < graph_count; ++i) {
    if (only >= 0 && i != only) continue;
    const Program program = Generator(7000 + static_cast<std::uint64_t>(i)).generate();
    coverage.regions += program.regions;
    coverage.deepest = std::max(coverage.deepest, program.deepest);
    coverage.stacks += program.stacks;
    coverage.tuple_regions += program.tuple_regions;
    for (int k = 0; k < policy_kinds; ++k)
      coverage.policies[static_cast<std::size_t>(k)] += program.policies[static_cast<std::size_t>(k)];
    nd_programs += program.nd;
    for (int k = 0; k < nd_feature_count; ++k)
      coverage.nd_features[static_cast<std::size_t>(k)] += program.nd_features[static_cast<std::size_t>(k)];
    const std::uint64_t tape_seed = 0xC0FFEE + static_cast<std::uint64_t>(i);
    try {
      const Recording<T> plain = run_program<T>(program, tape_seed, false);
      const Recording<T> ckpt = run_program<T>(program, tape_seed, true);
      const remat_oracle::Result expected = remat_oracle::compute(ckpt.graph);
      const Numbers oracle = oracle_numbers(expected);
      if (oracle.ops > 0) ++replaying_graphs;
      if (oracle.ops > 0 && program.nd) ++nd_replaying;
      batch_dot_decisions += ckpt.batch_dot_decisions;
      for (int k = 0; k < transformer_op_count; ++k)
        programs_with[static_cast<std::size_t>(k)] +=
            std::any_of(ckpt.graph.nodes.begin(), ckpt.graph.nodes.end(),
                        [&](const remat_oracle::Node& n) { return n.op == transformer_ops[k]; });

      bool same_values =
          checkpoint_test::bitwise_equal(plain.loss, ckpt.loss) && plain.grads.size() == ckpt.grads.size();
      for (std::size_t k = 0; same_values && k < plain.grads.size(); ++k)
        same_values = checkpoint_test::bitwise_equal(plain.grads[k], ckpt.grads[k]);
      if (!same_values) {
        ++gradient_failures;
        ADD_FAILURE() << "graph " << i << ": loss or gradients differ from the run without checkpoint\n"
                      << describe(program);
      }
      if (!(ckpt.tape == oracle)) {
        ++differ;
        if (reports++ < limit)
          ADD_FAILURE() << "graph " << i << " (" << sizeof(T) * 8 << "-bit): tape " << to_string(ckpt.tape)
                        << "; oracle " << to_string(oracle) << "\nprogram:\n"
                        << describe(program) << "oracle's view of the recorded graph:\n"
                        << remat_oracle::describe(ckpt.graph, expected) << "tape's residual report:\n"
                        << ckpt.residuals;
        else if (reports <= limit + 40)
          std::cout << "[ differs  ] graph " << i << ": tape " << to_string(ckpt.tape) << "; oracle "
                    << to_string(oracle) << "\n";
      }
    } catch (const std::exception& e) {
      ++threw;
      ADD_FAILURE() << "graph " << i << " threw: " << e.what() << "\n" << describe(program);
    }
  }
  if (only >= 0) return;
  EXPECT_EQ(differ, 0) << differ << " of " << graph_count << " graphs differ from the oracle (" << threw << " threw, "
                       << gradient_failures << " with different gradients)";
  // The generator must cover what the test claims.
  EXPECT_GT(coverage.regions, 2 * graph_count);
  EXPECT_EQ(coverage.deepest, max_depth);
  EXPECT_GT(coverage.stacks, graph_count / 4);
  EXPECT_GT(coverage.tuple_regions, graph_count / 4);
  for (int k = 0; k < policy_kinds; ++k)
    EXPECT_GT(coverage.policies[static_cast<std::size_t>(k)], graph_count / 20) << k;
  EXPECT_GT(replaying_graphs, graph_count / 3);
  for (int k = 0; k < transformer_op_count; ++k)
    EXPECT_GT(programs_with[static_cast<std::size_t>(k)], graph_count / 20) << transformer_ops[k];
  // Where dots_with_no_batch_dims_saveable and dots_saveable part: a batched product in a region of the former.
  EXPECT_GT(batch_dot_decisions, graph_count / 10);
  // A third of the programs are N-D (Generator::nd_program), replay, and draw each N-D feature.
  EXPECT_EQ(nd_programs, graph_count / 3);
  EXPECT_GT(nd_replaying, graph_count / 10);
  for (int k = 0; k < nd_feature_count; ++k)
    EXPECT_GT(coverage.nd_features[static_cast<std::size_t>(k)], graph_count / 20) << nd_feature_names[k];
  std::cout << "[ coverage ] " << coverage.regions << " regions (" << coverage.stacks << " layer stacks, "
            << coverage.tuple_regions << " with two outputs), " << replaying_graphs << " of " << graph_count
            << " graphs replay; " << differ << " differ from the oracle\n";
  std::cout << "[ coverage ] programs recording each transformer op:";
  for (int k = 0; k < transformer_op_count; ++k)
    std::cout << " " << transformer_ops[k] << " " << programs_with[static_cast<std::size_t>(k)];
  std::cout << "; " << batch_dot_decisions << " batched dots asked by dots_with_no_batch_dims_saveable\n";
  std::cout << "[ coverage ] " << nd_programs << " N-D programs (" << nd_replaying << " replay), steps drawn:";
  for (int k = 0; k < nd_feature_count; ++k)
    std::cout << (k ? ", " : " ") << nd_feature_names[k] << " " << coverage.nd_features[static_cast<std::size_t>(k)];
  std::cout << "\n";
}

// ---------------------------------------------------------------------------------------------------
// Hand-counted cases. Expected numbers are written by hand (arithmetic in the comments, from the spec's
// sections); each case checks the tape and the oracle against them.

using F = float;
using Value = Recorder<F>::Value;
const PolicySpec nothing{PolicyKind::nothing, {}, 0};
const PolicySpec dots{PolicyKind::dots, {}, 0};
const PolicySpec everything{PolicyKind::everything, {}, 0};

/// Records `build` (which returns the loss; every other handle it makes dies with it), then measures the
/// tape and asks the oracle.
std::pair<Numbers, Numbers> measure(const std::function<Value(Recorder<F>&)>& build, std::string* report = nullptr) {
  Tape<F> tape;
  Recorder<F> rec(tape, true);
  Value loss = build(rec);
  rec.graph.loss = loss.id;
  Numbers t;
  t.saved = tape.memory().saved_bytes;
  std::ostringstream os;
  tape.print_saved_residuals(os);
  tape.backward(loss.var);
  t.ops = tape.memory().replayed_ops;
  t.bytes = tape.memory().replayed_bytes;
  const auto r = remat_oracle::compute(rec.graph);
  if (report) *report = remat_oracle::describe(rec.graph, r) + "tape's residual report:\n" + os.str();
  return {t, oracle_numbers(r)};
}

void expect_numbers(const std::function<Value(Recorder<F>&)>& build, Numbers hand) {
  std::string report;
  const auto [tape, oracle] = measure(build, &report);
  EXPECT_EQ(oracle, hand) << "ORACLE: " << to_string(oracle) << ", by hand: " << to_string(hand) << "\n" << report;
  EXPECT_EQ(tape, hand) << "TAPE: " << to_string(tape) << ", by hand: " << to_string(hand) << "\n" << report;
}

/// The spec's worked example: x constant [8,16] float (512 B), W1, W2 [16,16] and b1, b2 [1,16] Parameters
/// (0 B). One region: l1 = linear(x,W1,b1), t1 = tanh(l1), l2 = linear(t1,W2,b2), t2 = tanh(l2), returned.
/// loss = sum(t2) outside (sum reads nothing). Every value [8,16] = 512 B.
/// Backward reads (§2.1): linear1 reads x (r1: W1 requires grad), not W1 (x does not); tanh1 reads t1;
/// linear2 reads t1 (r1) and W2 (r0); tanh2 reads t2.
struct WorkedExample {
  Parameter<F> w1{checkpoint_test::random_matrix<F>(16, 16, 1, 0.3)}, b1{checkpoint_test::random_matrix<F>(1, 16, 2)};
  Parameter<F> w2{checkpoint_test::random_matrix<F>(16, 16, 3, 0.3)}, b2{checkpoint_test::random_matrix<F>(1, 16, 4)};
  Matrix<F> x = checkpoint_test::random_matrix<F>(8, 16, 5);
  std::function<Value(Recorder<F>&)> build(const PolicySpec& policy) {
    return [this, policy](Recorder<F>& r) {
      Value W1 = r.parameter(w1), B1 = r.parameter(b1), W2 = r.parameter(w2), B2 = r.parameter(b2);
      const auto out = r.region(policy, {r.constant(x)}, 1, [&](const std::vector<Value>& a) {
        return std::vector<Value>{r.tanh(r.linear(r.tanh(r.linear(a[0], W1, B1)), W2, B2))};
      });
      return r.sum(out[0]);
    };
  }
};

TEST(OracleHandCounted, WorkedExampleNothingSaveable) {
  // L: l1 = t1 = l2 = t2 = 1: all dropped, the returned t2 too (JAX: an output is a value of the function
  // like any other; only tanh2's own backward reads it, sum reads nothing). Level-1 targets: t1 (read by
  // tanh1, linear2) and t2 (tanh2). Replay: t2 <- l2 (transient) <- t1 (a target); t1 <- l1 (transient) <- x,
  // W1, b1 (L = 0: sources). 4 ops, 2048 B. Saved: x (512, read by linear1, source) + W1, b1 (Parameters, 0)
  // = 512 B: as jax.checkpoint saves only the input.
  WorkedExample e;
  expect_numbers(e.build(nothing), {512, 4, 2048});
}

TEST(OracleHandCounted, WorkedExampleDotsSaveable) {
  // L: l1 = l2 = 0 (dots saved), t1 = t2 = 1. Level-1 targets: t1, t2. Replay: t1 <- l1, t2 <- l2 (L = 0:
  // sources). 2 ops, 1024 B. Saved: x (512) + l1 (512) + l2 (512) = 1536 B.
  WorkedExample e;
  expect_numbers(e.build(dots), {1536, 2, 1024});
}

TEST(OracleHandCounted, WorkedExampleEverythingSaveable) {
  // Every L = 0. Saved: x (512) + t1 (512, tanh1 and linear2) + t2 (512) = 1536 B; l1, l2 read by nothing.
  // No region member: 0 ops.
  WorkedExample e;
  expect_numbers(e.build(everything), {1536, 0, 0});
}

/// Two levels: the worked example's two layers in an inner region S, inside an outer region R that returns
/// S's output. Same shapes and leaves as the worked example.
std::function<Value(Recorder<F>&)> nested(WorkedExample& e, const PolicySpec& outer, const PolicySpec& inner) {
  return [&e, outer, inner](Recorder<F>& r) {
    Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), W2 = r.parameter(e.w2), B2 = r.parameter(e.b2);
    const auto out = r.region(outer, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
      return r.region(inner, {a[0]}, 1, [&](const std::vector<Value>& b) {
        return std::vector<Value>{r.tanh(r.linear(r.tanh(r.linear(b[0], W1, B1)), W2, B2))};
      });
    });
    return r.sum(out[0]);
  };
}

TEST(OracleHandCounted, NestedSourceAtIntermediateLevel) {
  // R (depth 1) nothing_saveable around S (depth 2) dots_saveable. L: l1 = l2 = 1 (S saves them, R drops
  // them), t1 = t2 = 2 (both drop them; t2 is returned by both, and only tanh2's backward reads it).
  // S: level-2 targets t1 (tanh1, linear2) and t2 (tanh2); t1 <- l1 and t2 <- l2 with L = 1 < 2: sources,
  //    needed at level 1. S replays 2 ops (tanh1, tanh2), 1024 B.
  // R: level-1 targets: l1 and l2 (§2.3, sources of S). l1 <- x, W1, b1 (L = 0); l2 <- t1 (read by linear2,
  //    inside S, at level 2: a transient) <- l1. R replays 3 ops (linear1, tanh1, linear2), 1536 B.
  // Saved: x (512). Replayed 5 ops / 2560 B.
  WorkedExample e;
  expect_numbers(nested(e, nothing, dots), {512, 5, 2560});
}

TEST(OracleHandCounted, NestedDotsInsideEverything) {
  // R (depth 1) everything_saveable around S (depth 2) dots_saveable. L: l1 = l2 = 0, t1 = t2 = 2.
  // S: targets t1, t2; t1 <- l1, t2 <- l2 (L = 0: sources, saved). 2 ops, 1024 B. R: no level-1 value, no
  // replay. Saved: x (512) + l1 (512) + l2 (512) = 1536 B. Replayed 2 ops / 1024 B.
  WorkedExample e;
  expect_numbers(nested(e, everything, dots), {1536, 2, 1024});
}

TEST(OracleHandCounted, SaveOnlyTheseNames) {
  // One region, save_only_these_names({"h"}): l1 = linear(x,W1,b1) named "h" (checkpoint_name names the value
  // itself), t1 = tanh(l1), l2 = linear(t1,W2,b2), t2 = tanh(l2) returned. L: l1 = 0 (named, listed),
  // t1 = l2 = t2 = 1. Targets: t1 (tanh1, linear2), t2 (tanh2); t1 <- l1 (L = 0: source); t2 <- l2
  // (transient) <- t1. 3 ops (tanh1, linear2, tanh2), 1536 B. Saved: x (512) + l1 (512, source) = 1024 B.
  WorkedExample e;
  const PolicySpec only{PolicyKind::only_names, {"h"}, 0};
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), W2 = r.parameter(e.w2), B2 = r.parameter(e.b2);
        const auto out = r.region(only, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.tanh(r.linear(r.tanh(r.name(r.linear(a[0], W1, B1), "h")), W2, B2))};
        });
        return r.sum(out[0]);
      },
      {1024, 3, 1536});
}

TEST(OracleHandCounted, SaveAnyNamesButThese) {
  // One region, save_any_names_but_these({"b"}) with JAX semantics (only named values not listed are saved):
  // l1 = linear(x,W1,b1) named "a", t1 = tanh(l1) named "b", l2 = linear(t1,W2,b2), t2 = tanh(l2) returned;
  // checkpoint_name names each value itself (no copy). L: l1 = 0 (named, not listed), t1 = 1 (listed),
  // l2 = t2 = 1 (unnamed). Reads: tanh1 reads t1; linear2 reads t1 (r1) and W2 (r0); tanh2 reads t2.
  // Targets: t1, t2. t2 <- l2 (transient) <- t1 (a target); t1 <- l1 (L = 0: source). 3 ops (tanh1, linear2,
  // tanh2), 1536 B. Saved: x (512) + l1 (512, source) = 1024 B.
  WorkedExample e;
  const PolicySpec but{PolicyKind::any_names_but, {"b"}, 0};
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), W2 = r.parameter(e.w2), B2 = r.parameter(e.b2);
        const auto out = r.region(but, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          const Value t1 = r.tanh(r.name(r.linear(a[0], W1, B1), "a"));
          return std::vector<Value>{r.tanh(r.linear(r.name(t1, "b"), W2, B2))};
        });
        return r.sum(out[0]);
      },
      {1024, 3, 1536});
}

TEST(OracleHandCounted, FrozenLayerWithoutCheckpoint) {
  // No region. l = linear(x, W1, b1) (x constant [8,16], W1, b1 Parameters), y = matmul(l, Wf) with Wf a
  // CONSTANT [16,16] (1024 B), loss = sum(y). matmul reads A = l only if B requires grad (it does not) and
  // B = Wf since A requires grad; linear reads x. Saved: x (512) + Wf (1024) = 1536 B; l is not kept.
  WorkedExample e;
  const Matrix<F> wf = checkpoint_test::random_matrix<F>(16, 16, 6, 0.3);
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1);
        return r.sum(r.matmul(r.linear(r.constant(e.x), W1, B1), r.constant(wf)));
      },
      {1536, 0, 0});
}

TEST(OracleHandCounted, FrozenLayerInNothingSaveableRegion) {
  // The same in one nothing_saveable region returning y: L(l) = 1, L(y) = 0. l is read by no backward, so the
  // region has no target and replays nothing. Saved: x (512, read by linear) + Wf (1024, read by matmul)
  // = 1536 B; y is read by nothing (sum reads nothing).
  WorkedExample e;
  const Matrix<F> wf = checkpoint_test::random_matrix<F>(16, 16, 6, 0.3);
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), Wf = r.constant(wf);
        const auto out = r.region(nothing, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.matmul(r.linear(a[0], W1, B1), Wf)};
        });
        return r.sum(out[0]);
      },
      {1536, 0, 0});
}

TEST(OracleHandCounted, SingleLayerDotsSaveable) {
  // One layer in a dots_saveable region: l1 = linear(x,W1,b1) (L = 0), t1 = tanh(l1) returned (L = 1: only
  // tanh1's backward reads it). Target t1 <- l1 (a source). 1 op, 512 B. Saved: x (512, read by linear1) + l1
  // (512, source) = 1024 B.
  WorkedExample e;
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1);
        const auto out = r.region(dots, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.tanh(r.linear(a[0], W1, B1))};
        });
        return r.sum(out[0]);
      },
      {1024, 1, 512});
}

TEST(OracleHandCounted, SingleLayerNothingSaveable) {
  // One layer in a nothing_saveable region: l1 and the returned t1 (L = 1). Target t1 (tanh reads its
  // output) <- l1 (transient) <- x. 2 ops, 1024 B. Saved: x (512) = 512 B.
  WorkedExample e;
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1);
        const auto out = r.region(nothing, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.tanh(r.linear(a[0], W1, B1))};
        });
        return r.sum(out[0]);
      },
      {512, 2, 1024});
}

/// An attention block in one region: x a constant [4,4] (64 B), W a Parameter [4,4]; h = matmul(x, W),
/// s = attention_scores(h, h, 2 heads, S = 2) [B·heads·S, S] = [8,2] (64 B), p = softmax(s) [8,2],
/// y = attention_values(p, h) [4,4] returned; loss = sum(y) outside. Reads (§2.1 and the attention rows):
/// matmul reads x (W requires grad), not W (x does not); scores read h (twice, both inputs require grad);
/// softmax reads p; attention_values reads p and h.
std::function<Value(Recorder<F>&)> attention_block(const Matrix<F>& x, Parameter<F>& w, const PolicySpec& policy) {
  return [&x, &w, policy](Recorder<F>& r) {
    Value W = r.parameter(w);
    const auto out = r.region(policy, {r.constant(x)}, 1, [&](const std::vector<Value>& a) {
      const Value h = r.matmul(a[0], W);
      return std::vector<Value>{r.attention_values(r.softmax(r.attention_scores(h, h, 2, 2, false)), h, 2, 2)};
    });
    return r.sum(out[0]);
  };
}

TEST(OracleHandCounted, AttentionDotsSaveableKeepsTheScores) {
  // L: h = s = 0 (dots), p = 1, y = 0 (returned). Target p; p <- s (L = 0: source). 1 op (softmax), 64 B.
  // Saved: x (64) + h (64) + s (64, source) = 192 B.
  const Matrix<F> x = checkpoint_test::random_matrix<F>(4, 4, 7);
  Parameter<F> w{checkpoint_test::random_matrix<F>(4, 4, 8, 0.5)};
  expect_numbers(attention_block(x, w, dots), {192, 1, 64});
}

TEST(OracleHandCounted, AttentionDotsWithNoBatchDimsRecomputesTheScores) {
  // The scores have batch dimensions: L: h = 0 (a dot without), s = p = 1, y = 0. Target p; p <- s (L = 1,
  // not a target: transient) <- h (L = 0: source). 2 ops (scores, softmax), 128 B. Saved: x + h = 128 B.
  const Matrix<F> x = checkpoint_test::random_matrix<F>(4, 4, 7);
  Parameter<F> w{checkpoint_test::random_matrix<F>(4, 4, 8, 0.5)};
  expect_numbers(attention_block(x, w, PolicySpec{PolicyKind::dots_no_batch_dims, {}, 0}), {128, 2, 128});
}

TEST(OracleHandCounted, AttentionNothingSaveable) {
  // L: h = s = p = 1, y = 0. Targets h (scores, attention_values) and p; h <- x, W (sources); p <- s
  // (transient) <- h. 3 ops, 192 B. Saved: x (64) = 64 B.
  const Matrix<F> x = checkpoint_test::random_matrix<F>(4, 4, 7);
  Parameter<F> w{checkpoint_test::random_matrix<F>(4, 4, 8, 0.5)};
  expect_numbers(attention_block(x, w, nothing), {64, 3, 192});
}

/// Fused: h = matmul(x, W) as above, a = scaled_dot_product_attention(h, h, h, 2 heads, S = 2) [4,4] with
/// its extra [B·heads·S, 1] = [8,1] (32 B), t = tanh(a) returned. Its backward reads q, k, v (h), its
/// output and its extra (dq, dk wanted).
std::function<Value(Recorder<F>&)> fused_block(const Matrix<F>& x, Parameter<F>& w, const PolicySpec& policy) {
  return [&x, &w, policy](Recorder<F>& r) {
    Value W = r.parameter(w);
    const auto out = r.region(policy, {r.constant(x)}, 1, [&](const std::vector<Value>& a) {
      const Value h = r.matmul(a[0], W);
      return std::vector<Value>{r.tanh(r.attention(h, h, h, 2, 2, true))};
    });
    return r.sum(out[0]);
  };
}

TEST(OracleHandCounted, FusedAttentionDotsSaveable) {
  // h, a (and its extra) L = 0; the returned t = 1 (elementwise; only tanh's backward reads it). Target t <- a
  // (a source). 1 op, 64 B. Saved: x (64) + h (64) + a (64) + its extra (32) = 224 B.
  const Matrix<F> x = checkpoint_test::random_matrix<F>(4, 4, 7);
  Parameter<F> w{checkpoint_test::random_matrix<F>(4, 4, 8, 0.5)};
  expect_numbers(fused_block(x, w, dots), {224, 1, 64});
}

TEST(OracleHandCounted, FusedAttentionDotsWithNoBatchDims) {
  // L(a) = 1 (batch dimensions), its extra too; t = 1. Targets: a and its extra (its own backward reads
  // both), t; t <- a (a target); a <- h (L = 0: source). 2 ops, 64 + 32 + 64 = 160 B. Saved: x (64) + h (64)
  // = 128 B.
  const Matrix<F> x = checkpoint_test::random_matrix<F>(4, 4, 7);
  Parameter<F> w{checkpoint_test::random_matrix<F>(4, 4, 8, 0.5)};
  expect_numbers(fused_block(x, w, PolicySpec{PolicyKind::dots_no_batch_dims, {}, 0}), {128, 2, 160});
}

TEST(OracleHandCounted, DetachInNothingSaveableRegion) {
  // x a variable [4,4] (64 B). One nothing_saveable region: t = tanh(x), d = detach(t), e = exp(d),
  // y = multiply(x, e) returned; loss = sum(y). d and e require no grad, so exp reads nothing and multiply
  // reads e (x requires grad) but not x (e does not). tanh's node requires grad (x does), so the spec's
  // static reads keep its output for its backward although no gradient can reach it through detach.
  // L: t = d = e = 1, y = 0. Targets t and e; t <- x (source); e <- d (transient) <- t. The region
  // receives a gradient (y): 3 ops, 192 B. Saved: x (64, source).
  const Matrix<F> x = checkpoint_test::random_matrix<F>(4, 4, 9);
  expect_numbers(
      [&](Recorder<F>& r) {
        const auto out = r.region(nothing, {r.variable(x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.multiply(a[0], r.exp(r.detach(r.tanh(a[0]))))};
        });
        return r.sum(out[0]);
      },
      {64, 3, 192});
}

TEST(OracleHandCounted, ValueAnInnerRegionReturnsAndDropsIsRecomputedForItsOwnOps) {
  // x a variable [1,4] (16 B). R = save_only_these_names({"t"}) around S = save_anything_except_these_names
  // ({"t"}): in S, t = checkpoint_name(x, "t") (S drops it, R saves it), u = tanh(t) (S saves it, R drops
  // it), z = neg(u); S returns t and z, R returns z. q = multiply(x, x) before R; loss = sum(z) + sum(q).
  // L: t = 2 (S drops it, returned or not), u = 1, z = 1. R's target u (tanh reads its output); u <- t, read
  // by tanh, an op of S, at S's level 2: not there for R, a transient <- x (a source). 2 ops (name, tanh),
  // 32 B. Saved: x (16: multiply, the source). (Under the earlier rule, returning t from S made it a source
  // of R saved at level 0: 32 B, 1 op.)
  const PolicySpec only_t{PolicyKind::only_names, {"t"}, 0};
  const PolicySpec all_but_t{PolicyKind::anything_except, {"t"}, 0};
  const Matrix<F> x = checkpoint_test::random_matrix<F>(1, 4, 10);
  expect_numbers(
      [&](Recorder<F>& r) {
        const Value X = r.variable(x);
        const Value q = r.multiply(X, X);
        const auto out = r.region(only_t, {X}, 1, [&](const std::vector<Value>& a) {
          const auto s = r.region(all_but_t, {a[0]}, 2, [&](const std::vector<Value>& b) {
            const Value t = r.name(b[0], "t");
            return std::vector<Value>{t, r.neg(r.tanh(t))};
          });
          return std::vector<Value>{s[1]};
        });
        return r.add(r.sum(out[0]), r.sum(q));
      },
      {16, 2, 32});
}

}  // namespace oracle_property_test
