// Helpers shared by the checkpoint tests: deterministic random matrices, bitwise comparison, the two
// scalar types every test runs in.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "remat/remat.hpp"

namespace checkpoint_test {

using Scalars = ::testing::Types<float, double>;

/// A [rows, cols] matrix of N(0, scale²) draws from a generator seeded with `seed`, computed in double
/// and rounded to T, so float and double runs see the same numbers up to rounding.
template <class T>
remat::Matrix<T> random_matrix(remat::Index rows, remat::Index cols, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 generator(seed);
  std::normal_distribution<double> normal(0.0, scale);
  remat::Matrix<T> m(rows, cols);
  for (remat::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(normal(generator));
  return m;
}

/// True when a and b have the same shape and the same bytes (bitwise equality, stricter than ==
/// for signed zeros and NaNs).
template <class A, class B>
bool bitwise_equal(const A& a, const B& b) {
  using T = typename A::Scalar;
  static_assert(std::is_same_v<T, typename B::Scalar>, "compare matrices of one scalar type");
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  const remat::Matrix<T> da = a, db = b;  // contiguous row-major copies
  return std::memcmp(da.data(), db.data(), static_cast<std::size_t>(da.size()) * sizeof(T)) == 0;
}

/// gtest assertion form of bitwise_equal: prints both matrices when they differ.
template <class A, class B>
::testing::AssertionResult BitwiseEqual(const A& a, const B& b) {
  if (bitwise_equal(a, b)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "matrices differ bitwise:\n" << a << "\n-- versus --\n" << b;
}

/// Copies the gradients of `variables` out of the tape (after backward()).
template <class T>
std::vector<remat::Matrix<T>> gradients_of(const std::vector<remat::Var<T>>& variables) {
  std::vector<remat::Matrix<T>> out;
  for (const auto& v : variables) out.emplace_back(v.grad());
  return out;
}

/// Bytes of an [rows, cols] buffer of T, the unit of every memory figure in MemoryStats.
template <class T>
constexpr std::size_t bytes_of(remat::Index rows, remat::Index cols) {
  return static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols) * sizeof(T);
}

}  // namespace checkpoint_test
