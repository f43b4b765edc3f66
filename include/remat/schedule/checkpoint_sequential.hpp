// checkpoint_sequential: a chain of layers split into segments, each but the last checkpointed.
#pragma once

#include <cstddef>
#include <iterator>
#include <string>

#include "remat/checkpoint.hpp"
#include "remat/errors.hpp"

namespace remat {

/// Runs `layers` (a sequence of callables Var<T> → Var<T>) on x, split into `segments` contiguous groups
/// of ⌊L/segments⌋ layers (the last group takes the rest); every group but the last runs inside
/// checkpoint(…, policy), so only the segment boundaries are kept and each segment is replayed once
/// during backward. The same semantics as PyTorch's torch.utils.checkpoint.checkpoint_sequential.
///
/// With segments ≈ √L this is the √n schedule of Chen, Xu, Zhang & Guestrin, "Training Deep Nets with
/// Sublinear Memory Cost" (2016): memory O(√L) layer inputs plus one segment's residuals, for one extra
/// forward pass. Throws remat::domain_error unless 1 ≤ segments ≤ L.
template <class Layers, class T, class Policy = policies::NothingSaveable>
Var<T> checkpoint_sequential(const Layers& layers, int segments, Var<T> x, Policy policy = policies::nothing_saveable) {
  const auto count = static_cast<int>(std::size(layers));
  if (segments < 1 || segments > count)
    throw domain_error("checkpoint_sequential: segments must be in [1, " + std::to_string(count) + "] for " +
                       std::to_string(count) + " layers, got " + std::to_string(segments));
  const int size = count / segments;
  auto run = [&](int begin, int end, Var<T> v) {
    for (int i = begin; i < end; ++i) v = layers[static_cast<std::size_t>(i)](v);
    return v;
  };
  int begin = 0;
  for (int s = 0; s + 1 < segments; ++s, begin += size) {
    const int end = begin + size;
    x = checkpoint([&](Var<T> v) { return run(begin, end, std::move(v)); }, policy)(x);
  }
  return run(begin, count, std::move(x));
}

}  // namespace remat
