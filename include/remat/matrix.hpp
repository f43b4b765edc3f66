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
  Index rows = 0;
  Index cols = 0;
  Index size() const { return rows * cols; }
  friend bool operator==(const Shape& a, const Shape& b) { return a.rows == b.rows && a.cols == b.cols; }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }
};

/// "[rows,cols]", the form every error message uses.
inline std::string to_string(const Shape& s) {
  return "[" + std::to_string(s.rows) + "," + std::to_string(s.cols) + "]";
}

}  // namespace remat
