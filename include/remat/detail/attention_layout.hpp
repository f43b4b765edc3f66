// The attention layout (docs/design.md §1.1): a batch of B sequences of S tokens of width H is a
// [B·S, H] matrix (row b·S + s is position s of sequence b); head h of `heads` owns columns
// h·d … h·d + d − 1 with d = H / heads; per-(sequence, head) S×S matrices are stacked as [B·heads·S, S],
// block b·heads + h first. Shared by attention_scores, attention_values and scaled_dot_product_attention.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "remat/detail/parallel.hpp"
#include "remat/errors.hpp"
#include "remat/matrix.hpp"

namespace remat::detail {

/// What the attention ops record: the layout and the mask.
struct AttentionParams {
  Index heads = 1;
  Index seq_len = 1;
  bool causal = false;
};

/// The layout's sizes for token rows [B·S, H].
struct AttentionLayout {
  Index batch, seq_len, heads, head_width;
  Index blocks() const { return batch * heads; }
  /// Rows of (sequence b, head h)'s S×S block in a [B·heads·S, S] matrix.
  Index block_row(Index b, Index h) const { return (b * heads + h) * seq_len; }
  /// 1/√d, the scale of q·kᵀ.
  double scale() const { return 1.0 / std::sqrt(static_cast<double>(head_width)); }
};

/// Causal attention is computed in tiles of this many rows (or columns): a row tile [r0, r0 + rows) of an
/// S×S block sees only columns [0, r0 + rows), so the products skip the masked upper triangle except
/// within the diagonal tiles (56 % of the square's FLOPs at S = 512 instead of 100 %).
constexpr Index causal_tile = 64;

/// f(begin, count) for consecutive tiles of [0, S): one tile of S unless causal.
template <class F>
void for_each_tile(Index S, bool causal, F f) {
  const Index step = causal ? causal_tile : S;
  for (Index begin = 0; begin < S; begin += step) f(begin, std::min(step, S - begin));
}

/// How an attention kernel cuts its work for remat's team (detail/parallel.hpp): the rows of each (sequence,
/// head) block in tiles — of causal_tile rows when causal (the mask's tiles) or when the op's 2·blocks·S²·d
/// FLOPs reach parallel_grain, of S rows otherwise — and, above the grain, the tiles as the team's items
/// (`team`), with OpenBLAS on one thread for their products (BlasOnOneThread). Fixed by the shape alone.
struct AttentionTiles {
  Blocks rows;
  bool team;
  /// Item i of a kernel that hands out every tile of every block: block i / rows.count, tile i % rows.count.
  struct Item {
    Index b, h, r0, rows;
  };
  Index items(const AttentionLayout& l) const { return l.blocks() * rows.count; }
  Item item(const AttentionLayout& l, Index i) const {
    const Index bh = i / rows.count, t = i % rows.count;
    return Item{bh / l.heads, bh % l.heads, rows.begin(t), rows.length(t)};
  }
};
inline AttentionTiles attention_tiles(const AttentionLayout& l, bool causal) {
  const bool team = above_grain(l.blocks() * l.seq_len * l.seq_len, 2.0 * static_cast<double>(l.head_width));
  return AttentionTiles{make_blocks(l.seq_len, causal_tile, team || causal), team};
}

/// The layout of token rows of shape `x` named `what` in `op`; throws shape_error unless heads ≥ 1,
/// seq_len ≥ 1, heads divides H and seq_len divides the rows.
inline AttentionLayout attention_layout(const char* op, const char* what, const Shape& x, const AttentionParams& p) {
  if (p.heads < 1 || p.seq_len < 1)
    throw shape_error(std::string(op) + ": heads and seq_len must be at least 1, got heads = " +
                      std::to_string(p.heads) + ", seq_len = " + std::to_string(p.seq_len));
  if (x.cols() % p.heads != 0)
    throw shape_error(std::string(op) + ": " + what + " is " + to_string(x) + "; its width " +
                      std::to_string(x.cols()) + " is not divisible by heads = " + std::to_string(p.heads));
  if (x.rows() % p.seq_len != 0)
    throw shape_error(std::string(op) + ": " + what + " is " + to_string(x) + "; its " + std::to_string(x.rows()) +
                      " rows are not a whole number of sequences of seq_len = " + std::to_string(p.seq_len));
  return AttentionLayout{x.rows() / p.seq_len, p.seq_len, p.heads, x.cols() / p.heads};
}

/// Throws shape_error unless `b` has the shape of `a` (q and k, or q and v).
inline void check_same_shape(const char* op, const char* a_name, const Shape& a, const char* b_name, const Shape& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols())
    throw shape_error(std::string(op) + ": " + a_name + " is " + to_string(a) + " but " + b_name + " is " +
                      to_string(b) + "; they must have the same shape");
}

}  // namespace remat::detail
