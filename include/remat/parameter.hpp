// A trainable matrix that a tape references without copying, with a version counter.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "remat/matrix.hpp"

namespace remat {

/// A trainable weight matrix owned by the user (or a layer) across training steps.
///
/// Tape::variable(Parameter&) records a reference, not a copy, together with the current version.
/// Every call of mutable_value() increments the version; if a backward pass (or a checkpoint replay)
/// would read a parameter whose version changed since it was recorded, the tape throws
/// remat::stale_value_error instead of computing a gradient from the modified value. This is the
/// mechanism PyTorch calls a version counter. Write through mutable_value() only.
template <class T>
class Parameter {
 public:
  Parameter() = default;
  explicit Parameter(Matrix<T> value) : value_(std::move(value)) {}
  Parameter(const Parameter&) = default;
  Parameter(Parameter&&) noexcept = default;
  /// Assigning replaces the value, so it counts as a modification: the version moves past both
  /// operands' versions (a tape that recorded this parameter becomes stale).
  Parameter& operator=(const Parameter& other) {
    const std::uint64_t next = std::max(version_, other.version_) + 1;
    value_ = other.value_;
    version_ = next;
    return *this;
  }
  Parameter& operator=(Parameter&& other) noexcept {
    const std::uint64_t next = std::max(version_, other.version_) + 1;
    value_ = std::move(other.value_);
    version_ = next;
    return *this;
  }

  const Matrix<T>& value() const { return value_; }
  /// Write access; marks the parameter modified (any tape that recorded it becomes stale).
  Matrix<T>& mutable_value() {
    ++version_;
    return value_;
  }
  std::uint64_t version() const { return version_; }
  Index rows() const { return value_.rows(); }
  Index cols() const { return value_.cols(); }

 private:
  Matrix<T> value_;
  std::uint64_t version_ = 0;
};

}  // namespace remat
