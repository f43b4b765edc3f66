// Matrix types and shapes shared by every part of remat.
#pragma once

#include <Eigen/Core>
#include <string>

namespace remat {

using Index = Eigen::Index;

/// Dense row-major matrix; rows are the batch dimension.
template <class T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// Read-only view of a tape-owned buffer. Valid until the tape frees the value (see Var::value()).
template <class T>
using MatrixView = Eigen::Map<const Matrix<T>>;

/// The shape of a 2-D tensor: [rows, cols].
struct Shape {
  Index rows = 0;                             ///< the first dimension
  Index cols = 0;                             ///< the second dimension
  Index size() const { return rows * cols; }  ///< the number of elements
  /// Equal dimensions.
  friend bool operator==(const Shape& a, const Shape& b) { return a.rows == b.rows && a.cols == b.cols; }
  /// Some dimension differs.
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
};

/// "[rows,cols]", the form every error message uses.
inline std::string to_string(const Shape& s) {
  return "[" + std::to_string(s.rows) + "," + std::to_string(s.cols) + "]";
}

}  // namespace remat
