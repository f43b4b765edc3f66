// Floats the tape keeps for backward after the forward pass of gpt::Model (tape.memory().saved_bytes /
// sizeof(T)), per recompute mode and attention kind, derived by hand from what each op's backward and each
// region's replay read (docs/design.md §2). Shared by tests/gpt (which checks it on small models) and bench
// workload W3 (which checks it on the benchmarked step), so a change in what the tape saves fails both.
#pragma once

#include <algorithm>
#include <cmath>

#include "gpt.hpp"

namespace gpt {

/// The sizes the formula depends on, as doubles (the products overflow nothing and stay exact below 2⁵³).
struct Sizes {
  double N;  ///< tokens, B·S
  double H;  ///< width
  double a;  ///< heads
  double S;  ///< seq_len
  double V;  ///< vocabulary
  double L;  ///< blocks
};

inline Sizes sizes(const Config& c, Index batch) {
  return {static_cast<double>(batch * c.seq_len), static_cast<double>(c.width),      static_cast<double>(c.heads),
          static_cast<double>(c.seq_len),         static_cast<double>(c.vocabulary), static_cast<double>(c.blocks)};
}

/// One block recorded without a region around it (modes none, attention, and the last segment of sqrt).
/// What the backward reads: ln1's input x and its [N,2] statistics, ln1's output a (qkv linear), q and k
/// (scores), the probabilities [a·N, S] (softmax reads its output; attention_values reads it too) and v,
/// y (proj linear), x1 and ln2's statistics, ln2's output m (fc linear), fc's output u [N,4H] (gelu) and
/// gelu's output [N,4H] (fc_proj linear): 16NH + 4N + aNS. Fused attention keeps q, k, v, y and the
/// per-row log-sum-exp [a·N, 1] instead of the probabilities: 16NH + 4N + aN. Selective recomputation
/// drops the probabilities (unfused) or the log-sum-exp (fused: the region holds only the fused op, which it
/// drops with its statistics, so its replay re-runs it) and keeps the region's inputs q, k, v and its output
/// y, which proj's backward reads: 16NH + 4N.
inline double plain_block_floats(Recompute mode, Attention attention, const Sizes& z) {
  const double common = 16 * z.N * z.H + 4 * z.N;
  if (mode == Recompute::attention) return common;
  if (attention == Attention::fused) return common + z.a * z.N;
  return common + z.a * z.N * z.S;
}

/// After the blocks: lnf's input and statistics and output (head linear), and cross_entropy's softmax
/// [N,V]: 2NH + 2N + NV.
inline double tail_floats(const Sizes& z) {
  return 2 * z.N * z.H + 2 * z.N + z.N * z.V;
}

/// Floats saved after the forward pass.
///   none, attention:  L·plain_block + tail.
///   block:            L·NH + tail: each nothing_saveable region keeps only its input (the previous block's
///                     output; the last block's output is lnf's input, in the tail).
///   dots_no_batch:    L·9NH + tail: each region keeps its input x (ln1's backward), the qkv linear's
///                     output [N,3H] (the replay of the slices q, k, v reads it), the proj linear's output
///                     (the replay of x1 = x + proj reads it) and the fc linear's output [N,4H] (gelu's
///                     backward); the batched attention products, the normalisations and their statistics
///                     are recomputed, fused or not, and the fc_proj output is read by nobody.
///   sqrt:             checkpoint_sequential over s = round(√L) segments of ⌊L/s⌋ blocks, all but the
///                     last checkpointed: (s − 1)·NH (their inputs) + the last segment's blocks as plain
///                     blocks + tail.
inline double saved_floats(Recompute mode, Attention attention, const Sizes& z) {
  const double tail = tail_floats(z);
  switch (mode) {
    case Recompute::none:
    case Recompute::attention:
      return z.L * plain_block_floats(mode, attention, z) + tail;
    case Recompute::block:
      return z.L * z.N * z.H + tail;
    case Recompute::dots_no_batch:
      return z.L * 9 * z.N * z.H + tail;
    case Recompute::sqrt: {
      const double segments = std::max(1.0, std::round(std::sqrt(z.L)));
      const double checkpointed = segments - 1, size = std::floor(z.L / segments);
      const double last = z.L - checkpointed * size;
      return checkpointed * z.N * z.H + last * plain_block_floats(Recompute::none, attention, z) + tail;
    }
  }
  return -1;
}

}  // namespace gpt
