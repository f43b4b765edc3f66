// checkpoint_sequential: a chain of layers split into segments, each but the last checkpointed.
#pragma once

#include <cstddef>
#include <iterator>
#include <string>

#include "remat/checkpoint.hpp"
#include "remat/errors.hpp"
#include "remat/schedule/chain_state.hpp"

namespace remat {

/// Runs `layers` (a sequence of callables S → S) on x, split into `segments` contiguous groups
/// of ⌊L/segments⌋ layers (the last group takes the rest); every group but the last runs inside
/// checkpoint(…, policy), so only the segment boundaries are kept and each segment is replayed once
/// during backward. The same semantics as PyTorch's torch.utils.checkpoint.checkpoint_sequential.
///
/// The state S is a Var<T>, or a std::tuple of Var<T> for a multi-value state (an LSTM's (h, c)): a layer
/// takes the tuple (or its Vars unpacked) and returns the same tuple type, and a segment boundary keeps every
/// Var of it.
///
/// With segments ≈ √L this is the √n schedule of Chen, Xu, Zhang & Guestrin, "Training Deep Nets with
/// Sublinear Memory Cost" (2016): memory O(√L) layer inputs plus one segment's residuals, for one extra
/// forward pass. Throws remat::domain_error unless 1 ≤ segments ≤ L; tape_error for an empty or stale Var in x,
/// or Vars of different tapes.
template <class Layers, class S, class Policy = policies::NothingSaveable>
S checkpoint_sequential(const Layers& layers, int segments, S x, Policy policy = policies::nothing_saveable) {
  detail::check_chain_state<S>();
  const auto count = static_cast<int>(std::size(layers));
  if (segments < 1 || segments > count)
    throw domain_error("checkpoint_sequential: segments must be in [1, " + std::to_string(count) + "] for " +
                       std::to_string(count) + " layers, got " + std::to_string(segments));
  detail::chain_tape(x, "checkpoint_sequential");
  const int size = count / segments;
  auto run = [&](int begin, int end, S v) {
    for (int i = begin; i < end; ++i) v = detail::call_layer(layers[static_cast<std::size_t>(i)], std::move(v));
    return v;
  };
  int begin = 0;
  for (int s = 0; s + 1 < segments; ++s, begin += size) {
    const int end = begin + size;
    x = detail::checkpoint_state([&](S v) { return run(begin, end, std::move(v)); }, policy, std::move(x));
  }
  return run(begin, count, std::move(x));
}

}  // namespace remat
