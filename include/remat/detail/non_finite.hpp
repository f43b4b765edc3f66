// Anomaly detection's scan and wording: the first NaN or ±inf of a buffer and how an error names it. Apart
// from the records (node.hpp) because only the recorder, the sweep and the tape's leaf checks use them.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "remat/matrix.hpp"

namespace remat::detail {

/// The first element of the [rows, cols] buffer `data` that is NaN or ±inf (row-major index), or -1.
template <class T>
std::int64_t first_non_finite(const T* data, Index rows, Index cols) {
  const Index n = rows * cols;
  for (Index i = 0; i < n; ++i)
    if (!std::isfinite(data[i])) return i;
  return -1;
}

/// "NaN at (r, c)" / "inf at (r, c)" for element `index` of a [rows, cols] buffer.
template <class T>
std::string non_finite_text(const T* data, Index cols, std::int64_t index) {
  const T v = data[index];
  return std::string(std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf")) + " at (" + std::to_string(index / cols) + "," +
         std::to_string(index % cols) + ")";
}

}  // namespace remat::detail
