// Matrix and tensor types shared by every part of remat.
#pragma once

#include <Eigen/Core>
#include <string>
#include <unsupported/Eigen/CXX11/Tensor>

#include "remat/shape.hpp"

namespace remat {

/// Dense row-major matrix; rows are the batch dimension.
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Read-only view of a tape-owned buffer. Valid until the tape frees the value (see Var::value()).
template <class T>
using MatrixView = Eigen::Map<const Matrix<T>>;

/// Eigen's N-D array, row-major as remat's values are: what N-D leaves and Parameters are made from, e.g.
/// `remat::Tensor<float, 4> images(n, c, h, w)` (Eigen::Tensor, unsupported/Eigen/CXX11/Tensor).
template <class T, int Rank>
using Tensor = Eigen::Tensor<T, Rank, Eigen::RowMajor>;

/// Read-only N-D view of a tape-owned buffer (Var::value<Rank>()), valid as long as the matching MatrixView.
template <class T, int Rank>
using TensorView = Eigen::TensorMap<const Tensor<T, Rank>, Eigen::Aligned>;

/// The Shape of an Eigen tensor (its dimensions; rank 0: Shape::scalar()).
template <class T, int Rank>
Shape shape_of(const Tensor<T, Rank>& t) {
  static_assert(Rank <= Shape::max_rank, "remat holds at most Shape::max_rank dimensions");
  if constexpr (Rank == 0) {
    return Shape::scalar();
  } else {
    const auto& d = t.dimensions();
    return Shape(std::vector<Index>(d.begin(), d.end()));
  }
}

namespace detail {
/// The dimensions of `s` as an Eigen array for a rank-`Rank` TensorMap; throws shape_error naming `op` (a
/// function template called as op<Rank>()) if `s` has another rank.
template <int Rank>
Eigen::array<Index, static_cast<std::size_t>(Rank)> tensor_dims(const Shape& s, const char* op) {
  if (s.rank() != Rank)
    throw shape_error(std::string(op) + "<" + std::to_string(Rank) + ">: the value is " + to_string(s) + ", of rank " +
                      std::to_string(s.rank()) + "; use " + op + "<" + std::to_string(s.rank()) + ">()");
  Eigen::array<Index, static_cast<std::size_t>(Rank)> dims{};
  for (int d = 0; d < Rank; ++d) dims[static_cast<std::size_t>(d)] = s[d];
  return dims;
}
}  // namespace detail

}  // namespace remat
