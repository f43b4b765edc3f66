// scaled_dot_product_attention: softmax(q·kᵀ/√d)·v per (sequence, head) in one op whose backward
// recomputes the probabilities from a saved per-row log-sum-exp (FlashAttention's trick), so no S×S
// matrix outlives the op.
#pragma once

#include <cmath>
#include <limits>

#include "remat/detail/attention_layout.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct ScaledDotProductAttentionOp : OpBase {
  static constexpr const char* name = "scaled_dot_product_attention";
  static constexpr OpKind kind = OpKind::dot;
  static constexpr bool batch_dims = true;
  using Params = AttentionParams;
  /// dv needs the probabilities (q, k, log-sum-exp); dq and dk also need v and the output (for the
  /// row sums D = rowsum(dy ⊙ y)).
  static unsigned reads(GradInputs g) {
    if (wants(g, 0) || wants(g, 1)) return reads_input0 | reads_input1 | reads_input2 | reads_output | reads_extra;
    return wants(g, 2) ? reads_input0 | reads_input1 | reads_extra : reads_nothing;
  }
  static Shape output_shape(const Shape* in, const Params& p) {
    check_rank(name, "q", in[0], 2);
    check_rank(name, "k", in[1], 2);
    check_rank(name, "v", in[2], 2);
    check_same_shape(name, "q", in[0], "k", in[1]);
    check_same_shape(name, "q", in[0], "v", in[2]);
    attention_layout(name, "q", in[0], p);
    return in[0];
  }
  /// The per-row log-sum-exp of the scores: [B·heads·S, 1].
  static Shape extra_shape(const Shape* in, const Params& p) {
    const AttentionLayout l = attention_layout(name, "q", in[0], p);
    return {l.blocks() * l.seq_len, 1};
  }
  /// One block's probabilities and their gradient, [2S, S], from the pool for the duration of a kernel.
  static Shape scratch_shape(const Shape* in, const Params& p) {
    const AttentionLayout l = attention_layout(name, "q", in[0], p);
    return {2 * l.seq_len, l.seq_len};
  }

  /// Rows [r0, r0 + rows) of block (b, h)'s probabilities into `prob` ([S,S]; zero above the diagonal when
  /// causal), from the scores and their per-row log-sum-exp: computed here (forward, `lse` written) or read
  /// (backward).
  template <bool compute_lse, class Q, class K, class L, class P>
  static void probabilities(const Q& q_bh, const K& k_bh, const AttentionLayout& l, bool causal, Index r0, Index rows,
                            L&& lse, P&& prob) {
    using T = typename std::decay_t<P>::Scalar;
    const Index S = l.seq_len;
    const T scale = T(l.scale());
    prob.block(r0, 0, rows, causal ? r0 + rows : S).noalias() =
        scale * (q_bh.middleRows(r0, rows) * k_bh.topRows(causal ? r0 + rows : S).transpose());
    for (Index i = r0; i < r0 + rows; ++i) {
      const Index visible = causal ? i + 1 : S;  // row i sees columns [0, i] when causal
      auto row = prob.row(i).head(visible);
      if constexpr (compute_lse) {
        const T m = row.maxCoeff();
        const T z = (row.array() - m).exp().sum();
        lse(i, 0) = m + std::log(z);
      }
      row.array() = (row.array() - lse(i, 0)).exp();
      prob.row(i).tail(S - visible).setZero();
    }
  }

  /// Block by block; in a block, row tile [r0, r0 + rows) makes those rows of P and of y_bh.
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const AttentionLayout l = attention_layout(name, "q", c.in_shape(0), p);
    const AttentionTiles tiles = attention_tiles(l, p.causal);
    const auto q = c.in(0), k = c.in(1), v = c.in(2);
    auto y = c.out();
    auto lse = c.extra();
    auto prob = c.scratch().topRows(l.seq_len);
    const Index S = l.seq_len, d = l.head_width;
    const BlasOnOneThread blas(tiles.team);
    for (Index b = 0; b < l.batch; ++b)
      for (Index h = 0; h < l.heads; ++h) {
        const auto q_bh = q.block(b * S, h * d, S, d), k_bh = k.block(b * S, h * d, S, d);
        const auto v_bh = v.block(b * S, h * d, S, d);
        auto lse_bh = lse.middleRows(l.block_row(b, h), S);
        for_items(tiles.team, tiles.rows.count, [&](Index t) {
          const Index r0 = tiles.rows.begin(t), rows = tiles.rows.length(t);
          const Index visible = p.causal ? r0 + rows : S;
          probabilities<true>(q_bh, k_bh, l, p.causal, r0, rows, lse_bh, prob);
          y.block(b * S + r0, h * d, rows, d).noalias() = prob.block(r0, 0, rows, visible) * v_bh.topRows(visible);
        });
      }
  }

  /// Block by block. In a block, row tile [r0, r0 + rows) first makes those rows of P, dS and dq_bh; then,
  /// once every row of dS is there, column tile [r0, r0 + rows) makes those rows of dk_bh and dv_bh.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const AttentionLayout l = attention_layout(name, "q", c.in_shape(0), p);
    const AttentionTiles tiles = attention_tiles(l, p.causal);
    const auto q = c.in(0), k = c.in(1);
    const auto lse = c.extra();
    const auto g = c.grad_out();
    auto scratch = c.scratch();
    auto prob = scratch.topRows(l.seq_len);
    auto dscore = scratch.bottomRows(l.seq_len);
    const Index S = l.seq_len, d = l.head_width;
    const bool qk = c.wants_grad(0) || c.wants_grad(1);
    // The targets are taken in the order each element is written (dq, dk, dv): when inputs are one Var
    // (self-attention sdpa(x, x, x), or k = v), the first target taken assigns and the later ones add, so
    // the assigning write must come first for every element.
    GradTarget<T> dq = c.wants_grad(0) ? c.grad_target(0) : GradTarget<T>{c.grad(0), false};
    GradTarget<T> dk = c.wants_grad(1) ? c.grad_target(1) : GradTarget<T>{c.grad(1), false};
    GradTarget<T> dv = c.wants_grad(2) ? c.grad_target(2) : GradTarget<T>{c.grad(2), false};
    const T scale = T(l.scale());
    const BlasOnOneThread blas(tiles.team);
    for (Index b = 0; b < l.batch; ++b)
      for (Index h = 0; h < l.heads; ++h) {
        const auto q_bh = q.block(b * S, h * d, S, d), k_bh = k.block(b * S, h * d, S, d);
        const auto g_bh = g.block(b * S, h * d, S, d);
        const auto lse_bh = lse.middleRows(l.block_row(b, h), S);
        for_items(tiles.team, tiles.rows.count, [&](Index t) {
          const Index r0 = tiles.rows.begin(t), rows = tiles.rows.length(t);
          const Index visible = p.causal ? r0 + rows : S;
          // P = exp(scores − lse): the forward's probabilities, recomputed.
          probabilities<false>(q_bh, k_bh, l, p.causal, r0, rows, lse_bh, prob);
          if (!qk) return;
          // dS = P ⊙ (dP − D) with dP = dy·vᵀ and D = rowsum(dy ⊙ y) = rowsum(P ⊙ dP); zero where P is.
          const auto v_bh = c.in(2).block(b * S, h * d, S, d);
          dscore.block(r0, 0, rows, visible).noalias() = g_bh.middleRows(r0, rows) * v_bh.topRows(visible).transpose();
          const auto y_bh = c.out().block(b * S, h * d, S, d);
          for (Index i = r0; i < r0 + rows; ++i) {
            const Index row_visible = p.causal ? i + 1 : S;
            const T D = g_bh.row(i).dot(y_bh.row(i));
            dscore.row(i).head(row_visible).array() =
                scale * prob.row(i).head(row_visible).array() * (dscore.row(i).head(row_visible).array() - D);
            dscore.row(i).tail(S - row_visible).setZero();
          }
          // dq = dS·k/√d (scale folded into dS above).
          if (c.wants_grad(0))
            assign_or_add_product(dq.map.block(b * S + r0, h * d, rows, d),
                                  dscore.block(r0, 0, rows, visible) * k_bh.topRows(visible), dq.accumulate);
        });
        // dk = dSᵀ·q/√d and dv = Pᵀ·dy: rows [c0, c0 + cols) of dk and dv are read by rows [c0, S) of dS and P
        // only (causal).
        for_items(tiles.team, tiles.rows.count, [&](Index t) {
          const Index c0 = tiles.rows.begin(t), cols = tiles.rows.length(t);
          const Index from = p.causal ? c0 : 0;
          if (c.wants_grad(1))
            assign_or_add_product(dk.map.block(b * S + c0, h * d, cols, d),
                                  dscore.block(from, c0, S - from, cols).transpose() * q_bh.bottomRows(S - from),
                                  dk.accumulate);
          if (c.wants_grad(2))
            assign_or_add_product(dv.map.block(b * S + c0, h * d, cols, d),
                                  prob.block(from, c0, S - from, cols).transpose() * g_bh.bottomRows(S - from),
                                  dv.accumulate);
        });
      }
  }
  /// 4·(B·S)·S·H for the two products (scores and values) + 5 per score (mask, exp, normalisation).
  static double flops(const Shape* in, int, const Shape&, const Params& p) {
    const double rows = static_cast<double>(in[0].rows()), S = static_cast<double>(p.seq_len);
    return 4.0 * rows * S * static_cast<double>(in[0].cols()) + 5.0 * rows * static_cast<double>(p.heads) * S;
  }
};

}  // namespace detail

/// Multi-head scaled dot-product attention, fused: y_bh = softmax(q_bh·k_bhᵀ/√d [+ causal mask])·v_bh per
/// (sequence b, head h) (layout: docs/design.md §1.1); equal to
/// attention_values(softmax(attention_scores(q, k, heads, seq_len, causal)), v, heads, seq_len) up to
/// rounding. q, k, v: [B·S, H] → [B·S, H]. Keeps the per-row log-sum-exp of the scores ([B·heads·S, 1]) and
/// recomputes the probabilities in its backward (Dao et al., "FlashAttention", NeurIPS 2022, Algorithm 4,
/// without tiling: one [S,S] block at a time in a [2S,S] pool buffer that lives only while the op runs):
/// with P = exp(scores − lse), dv = Pᵀ·dy, dP = dy·vᵀ, dS = P ⊙ (dP − rowsum(dy ⊙ y)), dq = dS·k/√d,
/// dk = dSᵀ·q/√d. Its residuals are q, k, v, y and the statistics, never an S×S matrix. A dot with batch
/// dimensions. Throws shape_error if q, k, v differ in shape, heads does not divide H or seq_len the rows.
template <class T>
Var<T> scaled_dot_product_attention(const Var<T>& q, const Var<T>& k, const Var<T>& v, Index heads, Index seq_len,
                                    bool causal) {
  return apply_op<detail::ScaledDotProductAttentionOp>(detail::AttentionParams{heads, seq_len, causal}, q, k, v);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ScaledDotProductAttentionOp)
