// attention_values: per (sequence, head), p_bh·v_bh: attention probabilities applied to the values.
#pragma once

#include "remat/detail/attention_layout.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct AttentionValuesOp : OpBase {
  static constexpr const char* name = "attention_values";
  static constexpr OpKind kind = OpKind::dot;
  static constexpr bool batch_dims = true;
  struct Params {
    Index heads = 1, seq_len = 1;
  };
  /// dp reads v, dv reads p.
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static AttentionLayout layout(const Shape& v, const Params& p) {
    return attention_layout(name, "v", v, AttentionParams{p.heads, p.seq_len, false});
  }
  static Shape output_shape(const Shape* in, const Params& p) {
    check_rank(name, "p", in[0], 2);
    check_rank(name, "v", in[1], 2);
    const AttentionLayout l = layout(in[1], p);
    if (in[0].rows() != l.blocks() * l.seq_len || in[0].cols() != l.seq_len)
      throw shape_error(std::string(name) + ": p is " + to_string(in[0]) + " but v " + to_string(in[1]) +
                        " with heads = " + std::to_string(p.heads) + ", seq_len = " + std::to_string(p.seq_len) +
                        " needs p of " + to_string(Shape{l.blocks() * l.seq_len, l.seq_len}));
    return in[1];
  }
  /// Item (block b·heads + h, row tile [r0, r0 + rows)): those rows of y_bh.
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const AttentionLayout l = layout(c.in_shape(1), params_of<Params>(c));
    const AttentionTiles tiles = attention_tiles(l, false);
    const auto p = c.in(0);
    const auto v = c.in(1);
    auto y = c.out();
    const Index S = l.seq_len, d = l.head_width;
    const BlasOnOneThread blas(tiles.team);
    for_items(tiles.team, tiles.items(l), [&](Index i) {
      const auto [b, h, r0, rows] = tiles.item(l, i);
      y.block(b * S + r0, h * d, rows, d).noalias() =
          p.middleRows(l.block_row(b, h) + r0, rows) * v.block(b * S, h * d, S, d);
    });
  }
  /// Item (block, row tile [r0, r0 + rows)): those rows of dp_bh, then (after every dp item) of dv_bh.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const AttentionLayout l = layout(c.in_shape(1), params_of<Params>(c));
    const AttentionTiles tiles = attention_tiles(l, false);
    const auto g = c.grad_out();
    const Index S = l.seq_len, d = l.head_width;
    const BlasOnOneThread blas(tiles.team);
    if (c.wants_grad(0)) {  // dp_bh = dy_bh · v_bhᵀ
      const auto v = c.in(1);
      GradTarget<T> t = c.grad_target(0);
      for_items(tiles.team, tiles.items(l), [&](Index i) {
        const auto [b, h, r0, rows] = tiles.item(l, i);
        assign_or_add_product(t.map.middleRows(l.block_row(b, h) + r0, rows),
                              g.block(b * S + r0, h * d, rows, d) * v.block(b * S, h * d, S, d).transpose(),
                              t.accumulate);
      });
    }
    if (c.wants_grad(1)) {  // dv_bh = p_bhᵀ · dy_bh
      const auto p = c.in(0);
      GradTarget<T> t = c.grad_target(1);
      for_items(tiles.team, tiles.items(l), [&](Index i) {
        const auto [b, h, r0, rows] = tiles.item(l, i);
        assign_or_add_product(
            t.map.block(b * S + r0, h * d, rows, d),
            p.middleRows(l.block_row(b, h), S).middleCols(r0, rows).transpose() * g.block(b * S, h * d, S, d),
            t.accumulate);
      });
    }
  }
  /// 2·(B·S)·S·H: per block 2·S·S·d over B·heads blocks.
  static double flops(const Shape* in, int, const Shape& out) {
    return 2.0 * static_cast<double>(out.rows()) * static_cast<double>(in[0].cols()) * static_cast<double>(out.cols());
  }
};

}  // namespace detail

/// Attention output per (sequence b, head h): y_bh = p_bh·v_bh, with p_bh block b·heads + h of p and v_bh
/// the [S,d] block of rows b·S … and columns h·d … of v (layout: docs/design.md §1.1).
/// p: [B·heads·S, S], v: [B·S, H] → [B·S, H]; dp_bh = dy_bh·v_bhᵀ, dv_bh = p_bhᵀ·dy_bh. A dot with batch
/// dimensions (OpInfo::batch_dims). 2·B·S²·H FLOPs. Throws shape_error if heads does not divide H, seq_len
/// the rows of v, or p is not [B·heads·S, S].
template <class T>
Var<T> attention_values(const Var<T>& p, const Var<T>& v, Index heads, Index seq_len) {
  return apply_op<detail::AttentionValuesOp>(detail::AttentionValuesOp::Params{heads, seq_len}, p, v);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::AttentionValuesOp)
