// What the op list's gradchecks cannot say about the transformer ops: typed errors that name the op and
// the values and leave the tape as it was, the fused attention equal to the unfused one, exact memory
// (the fused op's temporary in peak_bytes, its statistics in saved_bytes), detach, argmax_rows, the
// policies on attention blocks, and dropout on attention probabilities under replay.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "expect_error.hpp"
#include "gradcheck.hpp"
#include "op_list.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace transformer_ops_test {

using remat::Matrix;
using remat::Shape;
using remat::Tape;
using remat::Var;

using remat_test::expect_error_naming;

Matrix<float> random(Shape s, std::uint64_t seed) {
  return remat_test::random_matrix<float>(s, seed, remat_test::Domain{-1, 1, 0});
}

TEST(Embedding, AnIdOutsideTheTableThrowsDomainErrorNamingTheIdAndVAndRecordsNothing) {
  Tape<float> tape;
  const Var<float> table = tape.variable(random({5, 3}, 1));
  const std::size_t nodes = tape.size();
  expect_error_naming<remat::index_error>([&] { remat::embedding(table, {0, 5, 1}); }, {"embedding", "id 5", "5"});
  expect_error_naming<remat::index_error>([&] { remat::embedding(table, {-1}); }, {"embedding", "id -1"});
  expect_error_naming<remat::shape_error>([&] { remat::embedding(table, {}); }, {"embedding", "no ids"});
  EXPECT_EQ(tape.size(), nodes);
  EXPECT_NO_THROW(tape.backward(remat::sum(remat::embedding(table, {4, 4}))));
  EXPECT_EQ(table.grad()(4, 0), 2.0f);  // a repeated id accumulates
  EXPECT_EQ(table.grad()(0, 0), 0.0f);
}

TEST(Attention, BadLayoutsThrowShapeErrorNamingTheOpAndTheNumbers) {
  Tape<float> tape;
  const Var<float> q = tape.variable(random({6, 4}, 1)), k = tape.variable(random({6, 4}, 2));
  const Var<float> v5 = tape.variable(random({6, 5}, 3));
  const std::size_t nodes = tape.size();
  expect_error_naming<remat::shape_error>([&] { remat::scaled_dot_product_attention(q, k, q, 3, 3, true); },
                                          {"scaled_dot_product_attention", "not divisible by heads = 3"});
  expect_error_naming<remat::shape_error>([&] { remat::scaled_dot_product_attention(q, k, q, 2, 4, true); },
                                          {"scaled_dot_product_attention", "seq_len = 4"});
  expect_error_naming<remat::shape_error>([&] { remat::scaled_dot_product_attention(q, k, v5, 2, 3, true); },
                                          {"scaled_dot_product_attention", "[6,5]"});
  expect_error_naming<remat::shape_error>([&] { remat::attention_scores(q, v5, 2, 3, false); },
                                          {"attention_scores", "[6,5]"});
  expect_error_naming<remat::shape_error>([&] { remat::attention_values(q, k, 2, 3); }, {"attention_values", "[12,3]"});
  expect_error_naming<remat::shape_error>([&] { remat::attention_scores(q, k, 0, 3, false); },
                                          {"attention_scores", "heads = 0"});
  expect_error_naming<remat::shape_error>([&] { remat::slice_cols(q, 3, 2); }, {"slice_cols", "[3, 5)", "[6,4]"});
  expect_error_naming<remat::shape_error>([&] { remat::reshape(q, 5, 5); }, {"reshape", "[6,4]", "[5,5]"});
  expect_error_naming<remat::shape_error>(
      [&] {
        remat::concat_cols({q, tape.variable(random({2, 2}, 4))});
      },
      {"concat_cols", "[6,4]", "[2,2]"});
  EXPECT_EQ(tape.size(), nodes + 1);  // only the [2,2] variable of the last call was added
}

template <class T>
struct AttentionGrads {
  Matrix<T> y, dq, dk, dv;
};

template <class T>
AttentionGrads<T> attention_at(bool fused, bool causal, remat::Index heads, remat::Index S, const Matrix<T>& qv,
                               const Matrix<T>& kv, const Matrix<T>& vv) {
  const Shape s{qv.rows(), qv.cols()};
  Tape<T> tape;
  Var<T> q = tape.variable(qv), k = tape.variable(kv), v = tape.variable(vv);
  Var<T> y =
      fused ? remat::scaled_dot_product_attention(q, k, v, heads, S, causal)
            : remat::attention_values(remat::softmax(remat::attention_scores(q, k, heads, S, causal)), v, heads, S);
  const Matrix<T> w = remat_test::random_matrix<T>(s, 4, remat_test::Domain{-1, 1, 0});
  tape.backward(remat::sum(y * tape.constant(w)));
  return {y.value(), q.grad(), k.grad(), v.grad()};
}

template <class T>
AttentionGrads<T> attention(bool fused, bool causal, remat::Index heads, remat::Index S) {
  const Shape s{12, 6};
  return attention_at<T>(fused, causal, heads, S, remat_test::random_matrix<T>(s, 1, remat_test::Domain{-2, 2, 0}),
                         remat_test::random_matrix<T>(s, 2, remat_test::Domain{-2, 2, 0}),
                         remat_test::random_matrix<T>(s, 3, remat_test::Domain{-2, 2, 0}));
}

TEST(ScaledDotProductAttention, EqualsTheUnfusedOpsToRounding) {
  for (const bool causal : {false, true})
    for (const auto& [heads, S] : std::vector<std::pair<remat::Index, remat::Index>>{{1, 12}, {2, 4}, {3, 3}, {6, 1}}) {
      SCOPED_TRACE(std::to_string(heads) + " heads, S = " + std::to_string(S) + (causal ? ", causal" : ""));
      const auto a = attention<double>(true, causal, heads, S), b = attention<double>(false, causal, heads, S);
      EXPECT_LE((a.y - b.y).cwiseAbs().maxCoeff(), 1e-13);
      EXPECT_LE((a.dq - b.dq).cwiseAbs().maxCoeff(), 1e-13);
      EXPECT_LE((a.dk - b.dk).cwiseAbs().maxCoeff(), 1e-13);
      EXPECT_LE((a.dv - b.dv).cwiseAbs().maxCoeff(), 1e-13);
    }
}

// Causal attention runs in tiles of 64 rows (detail::causal_tile); S = 150 has two full tiles and a
// partial one, so every tile boundary case is exercised.
TEST(Attention, CausalTilesMatchTheReferenceLoopsAcrossTileBoundaries) {
  const remat::Index S = 150, H = 4, heads = 2;
  const Matrix<double> qv = remat_test::random_matrix<double>({2 * S, H}, 1, remat_test::Domain{-2, 2, 0});
  const Matrix<double> kv = remat_test::random_matrix<double>({2 * S, H}, 2, remat_test::Domain{-2, 2, 0});
  const Matrix<double> vv = remat_test::random_matrix<double>({2 * S, H}, 3, remat_test::Domain{-2, 2, 0});
  const Matrix<double> scores = remat_test::reference::attention_scores(qv, kv, heads, S, true);
  const Matrix<double> expected =
      remat_test::reference::attention_values(remat_test::reference::softmax(scores), vv, heads, S);
  Tape<double> tape;
  const Var<double> q = tape.variable(qv), k = tape.variable(kv), v = tape.variable(vv);
  const Matrix<double> got_scores = remat::attention_scores(q, k, heads, S, true).value();
  for (remat::Index i = 0; i < scores.rows(); ++i)
    for (remat::Index j = 0; j < S; ++j)
      if (std::isinf(scores(i, j)))
        EXPECT_EQ(got_scores(i, j), scores(i, j)) << i << "," << j;
      else
        EXPECT_NEAR(got_scores(i, j), scores(i, j), 1e-13) << i << "," << j;
  EXPECT_LE((remat::scaled_dot_product_attention(q, k, v, heads, S, true).value() - expected).cwiseAbs().maxCoeff(),
            1e-13);
  const auto fused = attention_at<double>(true, true, heads, S, qv, kv, vv);
  const auto unfused = attention_at<double>(false, true, heads, S, qv, kv, vv);
  EXPECT_LE((fused.dq - unfused.dq).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_LE((fused.dk - unfused.dk).cwiseAbs().maxCoeff(), 1e-12);
  EXPECT_LE((fused.dv - unfused.dv).cwiseAbs().maxCoeff(), 1e-12);
}

TEST(Attention, CausalTiledGradientsPassTheFiniteDifferenceGradcheck) {
  // One sequence of 70 tokens (a full tile and part of a second), two heads of width 1.
  for (const bool fused : {false, true}) {
    const auto result = remat::gradcheck(
        [fused](Tape<double>& tape, const std::vector<Var<double>>& in) {
          const Var<double> y =
              fused ? remat::scaled_dot_product_attention(in[0], in[1], in[2], 2, 70, true)
                    : remat::attention_values(remat::softmax(remat::attention_scores(in[0], in[1], 2, 70, true)), in[2],
                                              2, 70);
          return remat::sum(y *
                            tape.constant(remat_test::random_matrix<double>({70, 2}, 9, remat_test::Domain{-1, 1, 0})));
        },
        {remat_test::random_matrix<double>({70, 2}, 1, remat_test::Domain{-2, 2, 0}),
         remat_test::random_matrix<double>({70, 2}, 2, remat_test::Domain{-2, 2, 0}),
         remat_test::random_matrix<double>({70, 2}, 3, remat_test::Domain{-2, 2, 0})});
    EXPECT_TRUE(remat_test::passes(result)) << (fused ? "fused" : "unfused");
  }
}

TEST(ScaledDotProductAttention, GradientWhenQKAndVAreOneValue) {
  // Self-attention on x itself: two or three inputs are one value, whose gradient buffer each of dq, dk, dv
  // adds into; the first target taken assigns it, so each block must be written in that order (found by
  // tests/checkpoint/random_graph_test.cpp, whose attention steps draw k and v among values of q's shape).
  const Matrix<double> x = remat_test::random_matrix<double>(6, 4, 1), y = remat_test::random_matrix<double>(6, 4, 2);
  for (int c = 0; c < 4; ++c) {
    const char* const cases[] = {"q = k = v", "q = v", "k = v", "q = k"};
    SCOPED_TRACE(cases[c]);
    const auto result = remat_test::gradcheck(
        [c](Tape<double>&, const std::vector<Var<double>>& in) {
          const Var<double>&a = in[0], &b = in[1];
          const Var<double> out = c == 0   ? remat::scaled_dot_product_attention(a, a, a, 2, 3, true)
                                  : c == 1 ? remat::scaled_dot_product_attention(a, b, a, 2, 3, false)
                                  : c == 2 ? remat::scaled_dot_product_attention(b, a, a, 2, 3, true)
                                           : remat::scaled_dot_product_attention(a, a, b, 2, 3, false);
          return remat::sum(remat::square(out));
        },
        {x, y});
    EXPECT_TRUE(remat_test::passes(result));
  }
}

TEST(ScaledDotProductAttention, SavesItsStatisticsNotTheProbabilitiesAndCountsItsTemporaryInThePeak) {
  // B = 2, S = 8, H = 6, 3 heads: q, k, v, y [16,6], statistics [B·heads·S, 1] = [48,1], temporary [16,8].
  Tape<float> tape;
  Var<float> q = tape.variable(random({16, 6}, 1)), k = tape.variable(random({16, 6}, 2));
  Var<float> v = tape.variable(random({16, 6}, 3));
  const std::size_t leaves = 3 * 16 * 6 * sizeof(float);
  EXPECT_EQ(tape.memory().peak_bytes, leaves);
  Var<float> y = remat::scaled_dot_product_attention(q, k, v, 3, 8, true);
  const std::size_t out = 16 * 6 * sizeof(float), stats = 48 * sizeof(float), temporary = 16 * 8 * sizeof(float);
  EXPECT_EQ(tape.memory().peak_bytes, leaves + out + stats + temporary);
  EXPECT_EQ(tape.memory().live_bytes, leaves + out + stats);  // the temporary went back to the pool
  Var<float> loss = remat::sum(y);
  y = Var<float>();
  // A backward reads q, k, v (variables: leaves, held by their handles), y and the statistics.
  EXPECT_EQ(tape.memory().saved_bytes, leaves + out + stats);
}

TEST(Detach, PassesTheValueAndNoGradientAndKeepsNoResiduals) {
  Tape<float> tape;
  Var<float> x = tape.variable(random({3, 4}, 1));
  Var<float> d = remat::detach(x);
  EXPECT_TRUE(d.value() == x.value());
  // tanh of a detached value needs no gradient: its backward keeps nothing.
  Var<float> t = remat::tanh(d);
  Var<float> loss = remat::sum(remat::square(x)) + remat::sum(t);
  d = Var<float>();
  t = Var<float>();
  EXPECT_EQ(tape.memory().saved_bytes, 3u * 4 * sizeof(float));  // x itself, read by square's backward
  tape.backward(loss);
  EXPECT_TRUE(x.grad().isApprox(2 * x.value()));  // only the square contributes
}

TEST(ArgmaxRows, GivesTheFirstMaximumOfEachRow) {
  Tape<float> tape;
  Matrix<float> m(3, 4);
  m << 1, 5, 5, 2, -1, -3, -2, -1, 0, 0, 0, 7;
  EXPECT_EQ(remat::argmax_rows(tape.constant(m)), (std::vector<int>{1, 0, 3}));
}

TEST(Dropout, IsTheIdentityInEvaluationModeAndRecordsNothing) {
  Tape<float> tape;
  tape.set_training(false);
  EXPECT_FALSE(tape.training());
  Var<float> x = tape.variable(random({3, 4}, 1));
  const std::size_t nodes = tape.size();
  Var<float> y = remat::dropout(x, 0.5);
  EXPECT_EQ(tape.size(), nodes);
  EXPECT_TRUE(y.is_same(x));
  tape.clear();
  EXPECT_FALSE(tape.training());  // a mode, kept across clear()
}

// A pre-norm attention block: dots_with_no_batch_dims_saveable saves the projections (no batch dims) and
// recomputes the attention products (batch dims) — JAX's intent; dots_saveable saves both.
template <class Policy>
remat::MemoryStats attention_block(const Policy& policy, Matrix<float>* dx = nullptr) {
  const remat::Index N = 8, H = 4, heads = 2, S = 4;  // B = 2
  Tape<float> tape;
  Var<float> x = tape.variable(random({N, H}, 1));
  Var<float> w = tape.variable(random({H, 3 * H}, 2)), b = tape.variable(random({1, 3 * H}, 3));
  Var<float> y = remat::checkpoint(
      [&](const Var<float>& in) {
        Var<float> qkv = remat::linear(in, w, b);
        Var<float> p = remat::softmax(
            remat::attention_scores(remat::slice_cols(qkv, 0, H), remat::slice_cols(qkv, H, H), heads, S, true));
        return remat::attention_values(p, remat::slice_cols(qkv, 2 * H, H), heads, S);
      },
      policy)(x);
  Var<float> loss = remat::sum(remat::tanh(y));
  const remat::MemoryStats after_forward = tape.memory();
  tape.backward(loss);
  if (dx) *dx = x.grad();
  remat::MemoryStats m = tape.memory();
  m.saved_bytes = after_forward.saved_bytes;
  return m;
}

TEST(Policies, DotsWithNoBatchDimsSaveableSavesTheProjectionAndRecomputesTheAttentionProducts) {
  using namespace remat::policies;
  // Counted by hand, in floats. Outside the region: x [8,4] (linear's dW reads it), W [4,12] (its dx
  // reads it), tanh's output [8,4] (its backward reads it); b [1,12] only when the replay reruns linear.
  // Inside, the backwards read q, k (scores), v and p (values, softmax); nobody reads qkv [8,12] or the
  // scores [16,4] except a replay recomputing from them; y is read by no backward (tanh reads its output).
  const std::size_t f = sizeof(float), x = 32, w = 48, b = 12, tanh_out = 32, qkv = 96, scores = 64, slice = 32;
  // nothing: everything inside replayed from x, W, b: linear, 3 slices, scores, softmax.
  const auto nothing = attention_block(nothing_saveable);
  EXPECT_EQ(nothing.saved_bytes, (x + w + b + tanh_out) * f);
  EXPECT_EQ(nothing.replayed_ops, 6u);
  EXPECT_EQ(nothing.replayed_bytes, (qkv + 3 * slice + 2 * scores) * f);
  // no batch dims: qkv saved (the replay's source); the slices, the scores (a dot with batch dimensions)
  // and the softmax recomputed.
  const auto no_batch = attention_block(dots_with_no_batch_dims_saveable);
  EXPECT_EQ(no_batch.saved_bytes, (x + w + qkv + tanh_out) * f);
  EXPECT_EQ(no_batch.replayed_ops, 5u);
  EXPECT_EQ(no_batch.replayed_bytes, (3 * slice + 2 * scores) * f);
  // dots: the scores are saved too; the replay reruns the slices and the softmax only.
  const auto dots = attention_block(dots_saveable);
  EXPECT_EQ(dots.saved_bytes, (x + w + qkv + scores + tanh_out) * f);
  EXPECT_EQ(dots.replayed_ops, 4u);
  EXPECT_EQ(dots.replayed_bytes, (3 * slice + scores) * f);
  // everything: q, k, v and p saved, no replay; qkv and the scores are freed (nobody reads them).
  const auto everything = attention_block(everything_saveable);
  EXPECT_EQ(everything.saved_bytes, (x + w + 3 * slice + scores + tanh_out) * f);
  EXPECT_EQ(everything.replayed_ops, 0u);
  Matrix<float> reference, checkpointed;
  attention_block(everything_saveable, &reference);
  attention_block(nothing_saveable, &checkpointed);
  EXPECT_TRUE(checkpointed == reference);
  attention_block(dots_saveable, &checkpointed);
  EXPECT_TRUE(checkpointed == reference);
  attention_block(dots_with_no_batch_dims_saveable, &checkpointed);
  EXPECT_TRUE(checkpointed == reference);
}

TEST(Dropout, OnAttentionProbabilitiesReplaysTheSameMask) {
  const Matrix<float> qv = random({8, 4}, 1), kv = random({8, 4}, 2), vv = random({8, 4}, 3);
  auto run = [&](bool checkpointed) {
    Tape<float> tape(42);
    Var<float> q = tape.variable(qv), k = tape.variable(kv), v = tape.variable(vv);
    auto core = [](const Var<float>& a, const Var<float>& b, const Var<float>& c) {
      return remat::attention_values(remat::dropout(remat::softmax(remat::attention_scores(a, b, 2, 4, true)), 0.3), c,
                                     2, 4);
    };
    Var<float> y = checkpointed ? remat::checkpoint(core, remat::policies::nothing_saveable)(q, k, v) : core(q, k, v);
    tape.backward(remat::sum(remat::tanh(y)));
    EXPECT_EQ(tape.memory().replayed_ops > 0, checkpointed);
    return std::vector<Matrix<float>>{q.grad(), k.grad(), v.grad()};
  };
  EXPECT_EQ(run(true), run(false));
}

}  // namespace transformer_ops_test
