// Helpers of the API edge-case tests (ops, checkpoint regions, training mode, optimizers, gradcheck, the GPT's
// smallest shapes): inputs drawn in a range, bitwise and memory comparisons, and every library policy
// type-erased (gradcheck.hpp's passes() and memory.hpp's describe() come with it).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gradcheck.hpp"  // passes()
#include "memory.hpp"     // describe()
#include "random.hpp"
#include "remat/remat.hpp"

namespace remat_test {

/// A [rows, cols] float matrix uniform in [low, high) from `seed`.
inline remat::Matrix<float> rnd(remat::Index rows, remat::Index cols, std::uint64_t seed, double low = -1,
                                double high = 1) {
  return random_matrix<float>(rows, cols, seed, Domain{low, high, 0});
}
/// The same in double.
inline remat::Matrix<double> rndd(remat::Index rows, remat::Index cols, std::uint64_t seed, double low = -1,
                                  double high = 1) {
  return random_matrix<double>(rows, cols, seed, Domain{low, high, 0});
}

/// Same shape and the same float bits.
template <class A, class B>
bool same_bits(const A& a, const B& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  const remat::Matrix<float> x = a, y = b;
  return std::memcmp(x.data(), y.data(), sizeof(float) * static_cast<std::size_t>(x.size())) == 0;
}

/// Equal live, peak, saved, replayed and cached bytes and replayed ops.
inline bool same_memory(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops && a.cached_bytes == b.cached_bytes;
}

/// A type-erased policy, so that every policy goes through one instantiation of remat::checkpoint.
using AnyPolicy = std::function<bool(const remat::OpInfo&)>;

/// Every library policy, the name policies on the names "gathered" and "attn", with its name.
inline std::vector<std::pair<std::string, AnyPolicy>> every_policy() {
  namespace p = remat::policies;
  return {{"nothing_saveable", p::nothing_saveable},
          {"everything_saveable", p::everything_saveable},
          {"dots_saveable", p::dots_saveable},
          {"dots_with_no_batch_dims_saveable", p::dots_with_no_batch_dims_saveable},
          {"save_only_these_names(gathered, attn)", p::save_only_these_names({"gathered", "attn"})},
          {"save_any_names_but_these(attn)", p::save_any_names_but_these({"attn"})},
          {"save_anything_except_these_names(gathered)", p::save_anything_except_these_names({"gathered"})}};
}

}  // namespace remat_test
