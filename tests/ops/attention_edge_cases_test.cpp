// The attention ops at their edges: fused scaled_dot_product_attention and the unfused attention_scores /
// softmax / attention_values with shared inputs (q = k = v) against the gradcheck, degenerate layouts, large
// scores, causal rows whose only finite score is the diagonal, a NaN kept in its own sequence; and their memory:
// the fused op's temporary and statistics in a replay, what attention keeps for the gradients asked for, and
// attention's backward inside regions allocating only in its reservation (fault injection).
//
// Each test states the behaviour asked for (a typed exception naming the op and the values, with the tape and
// its memory() figures unchanged; no UB; no silent wrong gradient; checkpointed gradients bitwise equal to plain
// ones under every policy; exact memory figures) and checks that the library does it; a "Regression:" comment
// says what the library did before.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "api_checks.hpp"
#include "expect_error.hpp"
#include "pool_faults.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace attention_edge_cases_test {

using remat::Index;
using remat::Matrix;
using remat::Shape;
using remat::Tape;
using remat::Var;
using MF = Matrix<float>;
using MD = Matrix<double>;
using VF = Var<float>;
using VD = Var<double>;

using remat_test::describe;
using remat_test::expect_error_naming;
using remat_test::passes;
using remat_test::rnd;
using remat_test::rndd;
using remat_test::same_bits;
using remat_test::same_memory;

namespace fault = remat_test::pool_faults;  // pool misses counted and failed in turn
// ================================================================ attention

VD unfused_attention(const VD& q, const VD& k, const VD& v, Index heads, Index S, bool causal) {
  return remat::attention_values(remat::softmax(remat::attention_scores(q, k, heads, S, causal)), v, heads, S);
}

// Regression: scaled_dot_product_attention took its three gradient targets (dq, dk, dv) before writing
// any of them, then wrote each (sequence, head) block in the order dv, dq, dk. When two of q, k, v are the
// same Var (self-attention written as sdpa(x, x, x), or k = v) and the op is that Var's first gradient
// contribution, the later target is told to accumulate: dv's block was added to the uninitialised buffer and
// then overwritten by dq's assignment, so the gradient silently lacked dv (k = v: dk overwrote dv). Fixed in
// include/remat/ops/scaled_dot_product_attention.hpp: the targets are taken in the order they are written.
TEST(AttentionEdgeCases, FusedSelfAttentionWithSharedInputsPassesTheGradcheck) {
  const Index S = 3, H = 4, heads = 2;
  const MD w = rndd(2 * S, H, 31);
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    auto loss = [&](int which) {
      return [&, which](Tape<double>& t, const std::vector<VD>& v) {
        const VD& a = v[0];
        const VD& b = v.size() > 1 ? v[1] : v[0];
        VD y;
        switch (which) {
          case 0:  // q = k = v
            y = remat::scaled_dot_product_attention(a, a, a, heads, S, causal);
            break;
          case 1:  // k = v
            y = remat::scaled_dot_product_attention(b, a, a, heads, S, causal);
            break;
          case 2:  // q = v
            y = remat::scaled_dot_product_attention(a, b, a, heads, S, causal);
            break;
          case 3:  // q = k
            y = remat::scaled_dot_product_attention(a, a, b, heads, S, causal);
            break;
          default:  // the unfused ops, q = k = v
            y = unfused_attention(a, a, a, heads, S, causal);
        }
        return remat::sum(y * t.constant(w));
      };
    };
    const MD x = rndd(2 * S, H, 32, -2, 2), other = rndd(2 * S, H, 33, -2, 2);
    EXPECT_TRUE(passes(remat::gradcheck(loss(0), {x}))) << "q = k = v";
    EXPECT_TRUE(passes(remat::gradcheck(loss(1), {x, other}))) << "k = v";
    EXPECT_TRUE(passes(remat::gradcheck(loss(2), {x, other}))) << "q = v";
    EXPECT_TRUE(passes(remat::gradcheck(loss(3), {x, other}))) << "q = k";
    EXPECT_TRUE(passes(remat::gradcheck(loss(4), {x}))) << "unfused q = k = v";
  }
}

TEST(AttentionEdgeCases, SharedInputsOfTheUnfusedOpsPassTheGradcheck) {
  const Index S = 4, H = 4;
  for (const bool causal : {false, true}) {
    // attention_scores(x, x): dq and dk into one buffer.
    const MD ws = rndd(2 * 2 * S, S, 34);
    EXPECT_TRUE(passes(remat::gradcheck(
        [&](Tape<double>& t, const std::vector<VD>& v) {
          const VD s = remat::attention_scores(v[0], v[0], 2, S, causal);
          return remat::sum(remat::softmax(s) * t.constant(ws));
        },
        {rndd(2 * S, H, 35, -2, 2)})))
        << causal;
  }
  // attention_values(p, v) with p any matrix (not probabilities; negative entries) and with p = v (one head,
  // S = H, so p [B·S, S] and v [B·S, H] have one shape).
  const MD wv = rndd(2 * S, H, 36);
  EXPECT_TRUE(passes(remat::gradcheck(
      [&](Tape<double>& t, const std::vector<VD>& v) {
        return remat::sum(remat::attention_values(v[0], v[1], 2, S) * t.constant(wv));
      },
      {rndd(2 * 2 * S, S, 37, -3, 3), rndd(2 * S, H, 38, -2, 2)})));
  EXPECT_TRUE(passes(remat::gradcheck(
      [&](Tape<double>& t, const std::vector<VD>& v) {
        return remat::sum(remat::attention_values(v[0], v[0], 1, S) * t.constant(wv));
      },
      {rndd(2 * S, S, 39, -2, 2)})));
}

/// Runs fused or unfused attention in float on its own tape; returns y, dq, dk, dv for loss sum(y ⊙ w).
struct AttentionRun {
  MF y, dq, dk, dv;
};
AttentionRun run_attention(const MF& q, const MF& k, const MF& v, const MF& w, Index heads, Index S, bool causal,
                           bool fused) {
  Tape<float> tape;
  const VF vq = tape.variable(q), vk = tape.variable(k), vv = tape.variable(v);
  const VF y =
      fused ? remat::scaled_dot_product_attention(vq, vk, vv, heads, S, causal)
            : remat::attention_values(remat::softmax(remat::attention_scores(vq, vk, heads, S, causal)), vv, heads, S);
  tape.backward(remat::sum(y * tape.constant(w)));
  return {MF(y.value()), MF(vq.grad()), MF(vk.grad()), MF(vv.grad())};
}

double max_abs_diff(const MF& a, const MF& b) {
  return (a - b).cwiseAbs().maxCoeff();
}

TEST(AttentionEdgeCases, DegenerateLayoutsAgreeFusedAndUnfused) {
  struct Layout {
    Index B, S, H, heads;
  };
  for (const Layout l : {Layout{1, 1, 4, 4}, Layout{3, 1, 4, 2}, Layout{1, 1, 1, 1}, Layout{1, 5, 3, 3},
                         Layout{2, 4, 6, 6}, Layout{1, 6, 2, 1}})
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "B " << l.B << " S " << l.S << " H " << l.H << " heads " << l.heads
                                        << (causal ? " causal" : ""));
      const MF q = rnd(l.B * l.S, l.H, 41), k = rnd(l.B * l.S, l.H, 42), v = rnd(l.B * l.S, l.H, 43),
               w = rnd(l.B * l.S, l.H, 44);
      const AttentionRun f = run_attention(q, k, v, w, l.heads, l.S, causal, true);
      const AttentionRun u = run_attention(q, k, v, w, l.heads, l.S, causal, false);
      EXPECT_LT(max_abs_diff(f.y, u.y), 1e-6);
      EXPECT_LT(max_abs_diff(f.dq, u.dq), 1e-5);
      EXPECT_LT(max_abs_diff(f.dk, u.dk), 1e-5);
      EXPECT_LT(max_abs_diff(f.dv, u.dv), 1e-5);
      if (l.S == 1) {  // one position: softmax of one score is 1, so y = v and no gradient reaches q or k
        EXPECT_TRUE(same_bits(f.y, v));
        EXPECT_TRUE(same_bits(u.y, v));
        EXPECT_TRUE(same_bits(f.dv, w));
        EXPECT_LT(f.dq.cwiseAbs().maxCoeff(), 1e-7);
        EXPECT_LT(f.dk.cwiseAbs().maxCoeff(), 1e-7);
      }
      if (causal) {  // the first position attends to itself alone
        for (Index b = 0; b < l.B; ++b) EXPECT_TRUE(same_bits(f.y.row(b * l.S), v.row(b * l.S)));
      }
    }
}

TEST(AttentionEdgeCases, LargeScoresStayFiniteAndFusedMatchesUnfusedInFloat) {
  // Scores of magnitude ~1e4: the softmax must subtract the row maximum (fused: the log-sum-exp). The
  // reference is the unfused graph in double on the same float inputs.
  const Index B = 2, S = 5, H = 4, heads = 2;
  const MF q = rnd(B * S, H, 51, -100, 100), k = rnd(B * S, H, 52, -100, 100), v = rnd(B * S, H, 53),
           w = rnd(B * S, H, 54);
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    Tape<double> tape;
    const VD dq = tape.variable(q.cast<double>()), dk = tape.variable(k.cast<double>()),
             dv = tape.variable(v.cast<double>());
    const VD y = unfused_attention(dq, dk, dv, heads, S, causal);
    tape.backward(remat::sum(y * tape.constant(w.cast<double>())));
    const MF ry = y.value().cast<float>(), rdq = dq.grad().cast<float>(), rdk = dk.grad().cast<float>(),
             rdv = dv.grad().cast<float>();
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(fused ? "fused" : "unfused");
      const AttentionRun r = run_attention(q, k, v, w, heads, S, causal, fused);
      ASSERT_TRUE(r.y.allFinite() && r.dq.allFinite() && r.dk.allFinite() && r.dv.allFinite());
      // float scores of 1e4 carry rounding errors of ~1e-3: the probabilities, and so y, to about 1e-2
      EXPECT_LT(max_abs_diff(r.y, ry), 2e-2);
      EXPECT_LT(max_abs_diff(r.dv, rdv), 2e-2);
      const double scale = std::max(1.0, static_cast<double>(rdq.cwiseAbs().maxCoeff()));
      EXPECT_LT(max_abs_diff(r.dq, rdq) / scale, 5e-2);
      EXPECT_LT(max_abs_diff(r.dk, rdk) / std::max(1.0, static_cast<double>(rdk.cwiseAbs().maxCoeff())), 5e-2);
    }
  }
}

TEST(AttentionEdgeCases, CausalRowsWhoseOnlyFiniteScoreIsTheDiagonal) {
  // One head of width S: q_i = 1e20·e_i, k_j = e_j − 1e20·Σ_{i>j} e_i, so score (i, i) = 1e20/√S is finite
  // and every unmasked score left of the diagonal overflows to −∞ in float: each row's probabilities are
  // exactly one-hot on the diagonal (y = v) and the gradients must stay finite (no ∞ − ∞, no 0·∞).
  const Index S = 4;
  MF q = MF::Zero(S, S), k = MF::Zero(S, S);
  for (Index i = 0; i < S; ++i) q(i, i) = 1e20f;
  for (Index j = 0; j < S; ++j) {
    k(j, j) = 1;
    for (Index i = j + 1; i < S; ++i) k(j, i) = -1e20f;
  }
  const MF v = rnd(S, S, 55), w = rnd(S, S, 56);
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    const AttentionRun r = run_attention(q, k, v, w, 1, S, true, fused);
    EXPECT_TRUE(same_bits(r.y, v)) << r.y;
    EXPECT_TRUE(same_bits(r.dv, w)) << r.dv;
    EXPECT_TRUE(r.dq.allFinite()) << r.dq;
    EXPECT_TRUE(r.dk.allFinite()) << r.dk;
  }
}

TEST(AttentionEdgeCases, ANaNInOneSequenceStaysInThatSequence) {
  const Index B = 2, S = 3, H = 4, heads = 2;
  MF q = rnd(B * S, H, 57), k = rnd(B * S, H, 58), v = rnd(B * S, H, 59);
  const MF w = rnd(B * S, H, 60);
  q(1, 0) = std::numeric_limits<float>::quiet_NaN();  // sequence 0, head 0
  for (const bool causal : {false, true})
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (fused ? "fused" : "unfused") << (causal ? " causal" : ""));
      const AttentionRun r = run_attention(q, k, v, w, heads, S, causal, fused);
      const AttentionRun u = run_attention(q, k, v, w, heads, S, causal, false);
      EXPECT_TRUE(r.y.bottomRows(S).allFinite());
      EXPECT_TRUE(r.dq.bottomRows(S).allFinite() && r.dk.bottomRows(S).allFinite() && r.dv.bottomRows(S).allFinite());
      EXPECT_LT(max_abs_diff(r.y.bottomRows(S), u.y.bottomRows(S)), 1e-6);
      EXPECT_LT(max_abs_diff(r.dk.bottomRows(S), u.dk.bottomRows(S)), 1e-5);
      EXPECT_TRUE(std::isnan(r.y(1, 0)));  // row 1 of head 0 reads the NaN score
    }
}

// ================================================================ memory: the fused op's temporary in replays

TEST(AttentionMemory, FusedAttentionInAReplayCountsItsTemporaryAndStatisticsExactly) {
  // q, k, v [2,2] float (16 B each), one head, S = 2: y 16 B, log-sum-exp [2,1] 8 B, temporary [4,2] 32 B.
  // Region (nothing_saveable): square(sdpa(q, k, v)); square reads sdpa's output, so the replay re-runs sdpa.
  Tape<float> tape;
  const VF q = tape.variable(rnd(2, 2, 91)), k = tape.variable(rnd(2, 2, 92)), v = tape.variable(rnd(2, 2, 93));
  const VF y = remat::checkpoint([](const VF& a, const VF& b, const VF& c) {
    return remat::square(remat::scaled_dot_product_attention(a, b, c, 1, 2, true));
  })(q, k, v);
  const VF loss = remat::sum(y);
  // Forward: 48 + y 16 + lse 8 + temporary 32 = 104 at the peak; the region dropped sdpa's output and lse.
  EXPECT_EQ(tape.memory().peak_bytes, 104u) << describe(tape.memory());
  EXPECT_EQ(tape.memory().live_bytes, 68u) << describe(tape.memory());   // q, k, v, y, loss
  EXPECT_EQ(tape.memory().saved_bytes, 48u) << describe(tape.memory());  // the replay's sources q, k, v
  tape.backward(loss);
  // Backward: seed 4 → 72; sum: dy 16 → 88, seed freed → 84; replay: sdpa 16 + lse 8 + temporary 32 → 140,
  // temporary freed → 108; square: d sdpa 16 → 124, dy freed → 108; sdpa: dq, dk, dv 48 → 156, temporary 32
  // → 188 (the peak); then its temporary, its gradient, its output and lse go → 116.
  EXPECT_EQ(tape.memory().peak_bytes, 188u) << describe(tape.memory());
  EXPECT_EQ(tape.memory().live_bytes, 116u) << describe(tape.memory());
  EXPECT_EQ(tape.memory().replayed_bytes, 24u);
  EXPECT_EQ(tape.memory().replayed_ops, 1u);
}

TEST(AttentionMemory, AttentionKeepsOnlyWhatItsBackwardReadsForTheGradientsAskedFor) {
  // B = 1, S = 3, H = 2, one head, float: q, k, v, y 24 B each; the fused op's log-sum-exp [3,1] 12 B.
  const std::size_t t = 3 * 2 * sizeof(float), lse = 3 * sizeof(float);
  struct Case {
    bool q, k, v;
    std::size_t fused, scores;  // saved bytes of sdpa(q, k, v); of attention_scores(q, k)
  };
  for (const Case c : {Case{false, false, false, 0, 0}, Case{false, false, true, 2 * t + lse, 0},
                       Case{true, false, false, 4 * t + lse, t}, Case{false, true, false, 4 * t + lse, t},
                       Case{true, true, true, 4 * t + lse, 2 * t}}) {
    SCOPED_TRACE(::testing::Message() << "requires grad: q " << c.q << " k " << c.k << " v " << c.v);
    for (const bool fused : {true, false}) {
      Tape<float> tape;
      auto leaf = [&](bool variable, std::uint64_t seed) {
        return variable ? tape.variable(rnd(3, 2, seed)) : tape.constant(rnd(3, 2, seed));
      };
      const VF q = leaf(c.q, 1), k = leaf(c.k, 2), v = leaf(c.v, 3);
      const VF loss = remat::sum(fused ? remat::scaled_dot_product_attention(q, k, v, 1, 3, true)
                                       : remat::attention_scores(q, k, 1, 3, false));
      EXPECT_EQ(tape.memory().saved_bytes, fused ? c.fused : c.scores)
          << (fused ? "fused " : "scores ") << describe(tape.memory());
      tape.backward(loss);
      EXPECT_EQ(tape.memory().saved_bytes, 0u);
    }
  }
}

/// x [10,4] → matmul(x, w) → (attention in a dots_saveable region) → tanh, all in a nothing_saveable region;
/// loss sum(square(·)). B = 2 sequences of S = 5, 2 heads.
struct FaultNet {
  VF x, w, loss;
  void record(Tape<float>& tape, const MF& xv, const MF& wv, bool fused) {
    x = tape.variable(xv);
    w = tape.variable(wv);
    auto attention = [fused](const VF& h) {
      const VF q = remat::slice_cols(h, 0, 4), k = remat::slice_cols(h, 4, 4), v = remat::slice_cols(h, 8, 4);
      return fused ? remat::scaled_dot_product_attention(q, k, v, 2, 5, true)
                   : remat::attention_values(remat::softmax(remat::attention_scores(q, k, 2, 5, true)), v, 2, 5);
    };
    const VF y = remat::checkpoint(
        [&](const VF& a) {
          const VF h = remat::matmul(a, w);
          return remat::tanh(remat::checkpoint(attention, remat::policies::dots_saveable)(h));
        },
        remat::policies::nothing_saveable)(x);
    loss = remat::sum(remat::square(y));
  }
};

// Every system allocation of a tensor buffer during a backward must happen in the reservation before the
// sweep changes anything. If the real pass (noexcept) needed a buffer its dry run did not foresee — a
// temporary of a replayed op, say — the injected std::bad_alloc would terminate the program.
TEST(AttentionMemory, AttentionBackwardInsideRegionsAllocatesOnlyInItsReservation) {
  const MF xv = rnd(10, 4, 94), wv = rnd(4, 12, 95);
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    MF dx, dw;
    long misses = 0;
    {
      Tape<float> tape;
      FaultNet net;
      net.record(tape, xv, wv, fused);
      fault::Scope count(-1);
      tape.backward(net.loss);
      misses = fault::misses;
      dx = net.x.grad();
      dw = net.w.grad();
    }
    ASSERT_GT(misses, 0);
    for (long k = 1; k <= misses; ++k) {
      SCOPED_TRACE(::testing::Message() << "pool miss " << k << " of " << misses << " fails");
      Tape<float> tape;
      FaultNet net;
      net.record(tape, xv, wv, fused);
      const remat::MemoryStats before = tape.memory();
      {
        fault::Scope inject(k);
        EXPECT_THROW(tape.backward(net.loss), std::bad_alloc);
      }
      EXPECT_TRUE(same_memory(tape.memory(), before)) << describe(tape.memory()) << " vs " << describe(before);
      tape.backward(net.loss);
      EXPECT_TRUE(same_bits(net.x.grad(), dx));
      EXPECT_TRUE(same_bits(net.w.grad(), dw));
    }
    // The second step of the same shapes on the same tape (recording and backward) reaches the system
    // allocator not once: the fused op's temporary in the replay came from the pool.
    Tape<float> tape;
    FaultNet net;
    net.record(tape, xv, wv, fused);
    tape.backward(net.loss);
    tape.clear();
    {
      fault::Scope count(-1);
      net.record(tape, xv, wv, fused);
      tape.backward(net.loss);
      EXPECT_EQ(fault::misses, 0);
    }
    EXPECT_TRUE(same_bits(net.x.grad(), dx));
    EXPECT_TRUE(same_bits(net.w.grad(), dw));
  }
}

}  // namespace attention_edge_cases_test
