// attention_scores: per (sequence, head), q_h·k_hᵀ/√d, optionally causally masked.
#pragma once

#include <limits>

#include "remat/detail/attention_layout.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct AttentionScoresOp : OpBase {
  static constexpr const char* name = "attention_scores";
  static constexpr OpKind kind = OpKind::dot;
  static constexpr bool batch_dims = true;  // one product per (sequence, head)
  using Params = AttentionParams;
  /// dq reads k, dk reads q.
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static Shape output_shape(const Shape* in, const Params& p) {
    check_rank(name, "q", in[0], 2);
    check_rank(name, "k", in[1], 2);
    check_same_shape(name, "q", in[0], "k", in[1]);
    const AttentionLayout l = attention_layout(name, "q", in[0], p);
    return {l.blocks() * l.seq_len, l.seq_len};
  }
  /// Item (block b·heads + h, row tile [r0, r0 + rows)): those rows of S_bh, then their mask.
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const AttentionLayout l = attention_layout(name, "q", c.in_shape(0), p);
    const AttentionTiles tiles = attention_tiles(l, p.causal);
    const auto q = c.in(0);
    const auto k = c.in(1);
    auto s = c.out();
    const T scale = T(l.scale());
    const Index S = l.seq_len, d = l.head_width;
    const BlasOnOneThread blas(tiles.team);
    for_items(tiles.team, tiles.items(l), [&](Index i) {
      const auto [b, h, r0, rows] = tiles.item(l, i);
      auto block = s.middleRows(l.block_row(b, h), S);
      const Index visible = p.causal ? r0 + rows : S;
      block.block(r0, 0, rows, visible).noalias() =
          scale * (q.block(b * S + r0, h * d, rows, d) * k.block(b * S, h * d, visible, d).transpose());
      if (p.causal)
        for (Index r = r0; r < r0 + rows && r + 1 < S; ++r)
          block.row(r).tail(S - 1 - r).setConstant(-std::numeric_limits<T>::infinity());
    });
  }
  /// Causal backward: one block's gradient, scaled and with the masked entries zeroed, [S,S].
  static Shape scratch_shape(const Shape*, const Params& p) {
    if (!p.causal) return {};
    return {p.seq_len, p.seq_len};
  }
  /// Row tile [r0, r0 + rows) of a block writes rows [r0, r0 + rows) of dq_bh and of dk_bh (dk's from columns
  /// [r0, r0 + rows) of dS_bh): without a mask one item per tile of every block; with one, block by block,
  /// first the masked gradient's rows by tiles, then dq's and dk's tiles.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const AttentionLayout l = attention_layout(name, "q", c.in_shape(0), p);
    const AttentionTiles tiles = attention_tiles(l, p.causal);
    const auto g = c.grad_out();
    const T scale = T(l.scale());
    const Index S = l.seq_len, d = l.head_width;
    const bool want_q = c.wants_grad(0), want_k = c.wants_grad(1);
    // Taken in the order each tile writes them (dq, then dk): for attention_scores(x, x) the first
    // assigns and the second adds, tile by tile.
    GradTarget<T> dq = want_q ? c.grad_target(0) : GradTarget<T>{c.grad(0), false};
    GradTarget<T> dk = want_k ? c.grad_target(1) : GradTarget<T>{c.grad(1), false};
    const BlasOnOneThread blas(tiles.team);
    if (!p.causal) {
      for_items(tiles.team, tiles.items(l), [&](Index i) {
        const auto [b, h, r0, rows] = tiles.item(l, i);
        const auto g_bh = g.middleRows(l.block_row(b, h), S);
        if (want_q)
          assign_or_add_product(dq.map.block(b * S + r0, h * d, rows, d),
                                scale * (g_bh.middleRows(r0, rows) * c.in(1).block(b * S, h * d, S, d)), dq.accumulate);
        if (want_k)
          assign_or_add_product(dk.map.block(b * S + r0, h * d, rows, d),
                                scale * (g_bh.middleCols(r0, rows).transpose() * c.in(0).block(b * S, h * d, S, d)),
                                dk.accumulate);
      });
      return;
    }
    // The masked entries are constants: their gradient reaches neither q nor k.
    auto masked = c.scratch();
    for (Index b = 0; b < l.batch; ++b)
      for (Index h = 0; h < l.heads; ++h) {
        const auto q_bh = c.in(0).block(b * S, h * d, S, d);
        const auto k_bh = c.in(1).block(b * S, h * d, S, d);
        const auto g_bh = g.middleRows(l.block_row(b, h), S);
        for_items(tiles.team, tiles.rows.count, [&](Index t) {
          for (Index r = tiles.rows.begin(t); r < tiles.rows.begin(t) + tiles.rows.length(t); ++r) {
            masked.row(r).head(r + 1) = scale * g_bh.row(r).head(r + 1);  // row by row: contiguous, vectorised
            masked.row(r).tail(S - 1 - r).setZero();
          }
        });
        // dq rows [r0, r0 + rows) read columns [0, r0 + rows); dk rows [r0, r0 + rows) are read by rows
        // [r0, S) only.
        for_items(tiles.team, tiles.rows.count, [&](Index t) {
          const Index r0 = tiles.rows.begin(t), rows = tiles.rows.length(t);
          if (want_q)
            assign_or_add_product(dq.map.block(b * S + r0, h * d, rows, d),
                                  masked.block(r0, 0, rows, r0 + rows) * k_bh.topRows(r0 + rows), dq.accumulate);
          if (want_k)
            assign_or_add_product(dk.map.block(b * S + r0, h * d, rows, d),
                                  masked.block(r0, r0, S - r0, rows).transpose() * q_bh.bottomRows(S - r0),
                                  dk.accumulate);
        });
      }
  }
  /// 2·(B·S)·H·S: per block 2·S·S·d, over B·heads blocks (the dense count; causal tiles skip about
  /// 44 % of it at S = 512).
  static double flops(const Shape* in, int, const Shape& out) {
    return 2.0 * static_cast<double>(in[0].rows()) * static_cast<double>(in[0].cols()) *
           static_cast<double>(out.cols());
  }
};

}  // namespace detail

/// Attention scores per (sequence b, head h): S_bh = q_bh·k_bhᵀ/√d, with q_bh, k_bh the [S,d] blocks of
/// rows b·S … and columns h·d … (layout: docs/design.md §1.1). q, k: [B·S, H] → [B·heads·S, S], block
/// b·heads + h holding S_bh. With `causal`, entry (i, j) with j > i is −∞ (softmax then gives it 0) and
/// passes no gradient. dq_bh = dS_bh·k_bh/√d, dk_bh = dS_bhᵀ·q_bh/√d. A dot with batch dimensions
/// (OpInfo::batch_dims): dots_with_no_batch_dims_saveable does not save it. 2·B·heads·S²·d FLOPs.
/// Throws shape_error if q and k differ in shape, heads does not divide H or seq_len the rows.
template <class T>
Var<T> attention_scores(const Var<T>& q, const Var<T>& k, Index heads, Index seq_len, bool causal) {
  return apply_op<detail::AttentionScoresOp>(detail::AttentionParams{heads, seq_len, causal}, q, k);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::AttentionScoresOp)
