// argmax_rows: the column of each row's largest element (accuracy, greedy sampling). Not an op: it
// records nothing and has no gradient.
#pragma once

#include <vector>

#include "remat/var.hpp"

namespace remat {

/// For each row i of x ([m,n]), the first j with xᵢⱼ = maxⱼ xᵢⱼ (m entries in [0, n)). NaN compares
/// false, so a row of NaNs gives 0. Throws what Var::value() throws (tape_error for an invalid Var,
/// freed_value_error for a value dropped by a checkpoint).
template <class T>
std::vector<int> argmax_rows(const Var<T>& x) {
  const auto v = x.value();
  std::vector<int> result(static_cast<std::size_t>(v.rows()));
  for (Index i = 0; i < v.rows(); ++i) {
    Index best = 0;
    for (Index j = 1; j < v.cols(); ++j)
      if (v(i, j) > v(i, best)) best = j;
    result[static_cast<std::size_t>(i)] = static_cast<int>(best);
  }
  return result;
}

}  // namespace remat
