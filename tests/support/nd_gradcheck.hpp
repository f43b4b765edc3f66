// gradcheck of N-D ops (tests/ops/nd_*_test.cpp): random inputs of given shapes, and a loss that weighs every
// output element differently, so that a gradient routed to the wrong element cannot cancel out.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace remat_test {

/// shape.numel() random values in [low, high], as the one-row matrix gradcheck perturbs.
inline remat::Matrix<double> nd_values(const remat::Shape& s, std::uint64_t seed, double low = -1, double high = 1) {
  return random_matrix<double>(1, s.numel(), seed, Domain{low, high, 0});
}

/// gradcheck of `f` on inputs of `shapes`, values in [low, high] (seeds first_seed, first_seed + 1, ...).
inline ::testing::AssertionResult nd_check(const remat::LossFunction& f, const std::vector<remat::Shape>& shapes,
                                           double low = -1, double high = 1, std::uint64_t first_seed = 17) {
  std::vector<remat::Matrix<double>> inputs;
  for (std::size_t k = 0; k < shapes.size(); ++k) inputs.push_back(nd_values(shapes[k], first_seed + k, low, high));
  return passes(remat::gradcheck(f, inputs, shapes));
}

/// sum(y ⊙ w) for a fixed w of y's shape (seed 99).
inline remat::Var<double> weighted_sum(remat::Tape<double>& tape, const remat::Var<double>& y) {
  const remat::Shape s = y.shape();
  const remat::Matrix<double> w = nd_values(s, 99);
  return remat::sum(y * tape.constant(s, w.data()));
}

/// The ranks every N-D op is gradchecked on: 1, 3 and 4, with a size-1 dim.
inline const std::vector<remat::Shape> nd_ranks{remat::Shape{5}, remat::Shape{2, 3, 4}, remat::Shape{2, 1, 3, 2}};

}  // namespace remat_test
