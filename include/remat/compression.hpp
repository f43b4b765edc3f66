// How a saved residual is stored: as it is, or compressed — the third answer a checkpoint policy may give
// (remat::policies::Decision::save_as), beside save and recompute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"

namespace remat {

/// The stored formats of a compressed residual.
enum class StoredFormat : std::uint8_t {
  full,  ///< as it is: sizeof(T) bytes an element
  bf16,  ///< bfloat16, rounded to nearest even as PyTorch's c10::BFloat16: 2 bytes an element (lossy)
  int8,  ///< a signed byte an element and a float scale absmax/127 per group of elements (lossy, ActNN's role)
  sign,  ///< one bit an element, x > 0: all that relu's derivative reads (lossless for such readers only)
};

/// A stored format and its parameters. Make one with bf16(), int8_per_row(), int8_per_group(g) or sign().
///
/// Bytes (stored_bytes): bf16 2·n; int8 the n codes padded to a multiple of 4, then 4 bytes of scale per group;
/// sign ⌈n/64⌉·8; each rounded up to a whole number of elements of the tape's scalar type (exact for float but for
/// bf16 of an odd n). An int8 group is a run of consecutive elements of the row-major buffer: per group of g, the
/// elements [k·g, (k + 1)·g) whatever the shape (a group may cross last-dimension slices; the last group may be
/// shorter), ⌈n/g⌉ scales; per row, one last-dimension slice ([N,C,H,W]: one W), n / cols scales.
class Compression {
 public:
  /// Stored as it is.
  constexpr Compression() = default;
  /// bfloat16, round to nearest even: relative error at most 2⁻⁹ per element; infinities and NaN kept.
  static constexpr Compression bf16() { return Compression(StoredFormat::bf16, 0); }
  /// int8 with one absmax scale per last-dimension slice: error at most absmax/254 per element.
  static constexpr Compression int8_per_row() { return Compression(StoredFormat::int8, 0); }
  /// int8 with one absmax scale per `group` consecutive elements of the row-major buffer, across last-dimension
  /// slices (ActNN, unsloth: 64 or 128). Throws std::invalid_argument unless `group` is a power of two from 8 to 2^20.
  static Compression int8_per_group(std::int32_t group) {
    if (group < 8 || group > (1 << 20) || (group & (group - 1)) != 0)
      throw std::invalid_argument("Compression::int8_per_group: the group is " + std::to_string(group) +
                                  " elements; give a power of two from 8 to 1048576 (64 or 128 are usual), or "
                                  "int8_per_row() for one scale per last-dimension slice");
    return Compression(StoredFormat::int8, group);
  }
  /// One bit an element (x > 0): exact for a reader that needs only the sign (relu's backward reads its output
  /// so), so the tape stores it only for a value every pending reader of which reads only its sign; see
  /// docs/compression.md.
  static constexpr Compression sign() { return Compression(StoredFormat::sign, 0); }

  /// The stored format.
  constexpr StoredFormat format() const { return format_; }
  /// int8's elements per scale; 0 for one scale per last-dimension slice (and for the other formats).
  constexpr std::int32_t group() const { return group_; }
  /// Whether a value read back equals the value stored (full, and sign for the readers it serves).
  constexpr bool lossless() const { return format_ == StoredFormat::full || format_ == StoredFormat::sign; }

  /// Bytes a value of `shape` takes stored so, with elements of `element_bytes` bytes (see the class comment).
  std::size_t stored_bytes(const Shape& shape, std::size_t element_bytes) const {
    const auto n = static_cast<std::size_t>(shape.numel());
    std::size_t b = 0;
    switch (format_) {
      case StoredFormat::full:
        return n * element_bytes;
      case StoredFormat::bf16:
        b = 2 * n;
        break;
      case StoredFormat::int8:
        b = (n + 3) / 4 * 4 + 4 * groups(shape);
        break;
      case StoredFormat::sign:
        b = (n + 63) / 64 * 8;
        break;
    }
    return (b + element_bytes - 1) / element_bytes * element_bytes;
  }
  /// int8's groups (scales) for a value of `shape`: ⌈n / group_length⌉ (per row: the last-dimension slices).
  std::size_t groups(const Shape& shape) const {
    const auto n = static_cast<std::size_t>(shape.numel()), group = static_cast<std::size_t>(group_length(shape));
    return (n + group - 1) / group;
  }
  /// int8's elements per scale for a value of `shape`: group k holds the elements [k·length, (k + 1)·length) of the
  /// row-major buffer (the last one fewer if length does not divide n). The group, or per row the last dimension (at
  /// least 1).
  Index group_length(const Shape& shape) const {
    if (group_ > 0) return group_;
    const Index row = shape.cols();
    return row > 0 ? row : 1;
  }

  /// "full", "bf16", "int8/row", "int8/64", "sign": how print_saved_residuals names it.
  std::string name() const {
    switch (format_) {
      case StoredFormat::full:
        return "full";
      case StoredFormat::bf16:
        return "bf16";
      case StoredFormat::int8:
        return group_ == 0 ? "int8/row" : "int8/" + std::to_string(group_);
      case StoredFormat::sign:
        return "sign";
    }
    return "unknown";
  }

  /// The same format and group.
  friend constexpr bool operator==(const Compression& a, const Compression& b) {
    return a.format_ == b.format_ && a.group_ == b.group_;
  }
  /// Another format or group.
  friend constexpr bool operator!=(const Compression& a, const Compression& b) { return !(a == b); }

 private:
  constexpr Compression(StoredFormat format, std::int32_t group) : format_(format), group_(group) {}

  StoredFormat format_ = StoredFormat::full;
  std::int32_t group_ = 0;
};

}  // namespace remat
