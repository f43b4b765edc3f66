// The stored formats of compressed residuals (issue 46's groundwork; no policy answers with them yet): how a
// value is encoded into fewer bytes and decoded again, and how many bytes it takes. bf16 rounds to nearest even as
// PyTorch's c10::BFloat16 does; int8 keeps one absmax scale per group of elements (ActNN's and unsloth's per-row
// int8); sign keeps x > 0 as one bit, which is all ReLU's derivative reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "remat/shape.hpp"

namespace remat::detail {

/// How a residual is stored.
enum class StoredFormat : std::uint8_t {
  full,  ///< as it is
  bf16,  ///< bfloat16, round to nearest even: 2 bytes an element
  int8,  ///< one signed byte an element and a float scale (absmax / 127) per group
  sign,  ///< one bit an element: x > 0 (a NaN is not)
};

/// A stored format and, for int8, the elements per scale (a group runs along the row-major order and never across
/// a row of the matrix view: 0 means one group per row, i.e. per last-dimension slice).
struct Compression {
  StoredFormat format = StoredFormat::full;
  std::int32_t group = 0;
};

/// The int8 group size actually used for a value of `shape`: `c.group` capped at the row length, or the row.
inline Index int8_group(const Compression& c, const Shape& shape) {
  const Index row = shape.cols();
  return c.group > 0 ? std::min<Index>(c.group, row) : row;
}

/// Bytes of `shape`'s value stored in `c` (elements of `element_bytes` each when full).
inline std::size_t stored_bytes(const Compression& c, const Shape& shape, std::size_t element_bytes) {
  const auto n = static_cast<std::size_t>(shape.numel());
  switch (c.format) {
    case StoredFormat::full:
      return n * element_bytes;
    case StoredFormat::bf16:
      return 2 * n;
    case StoredFormat::int8: {
      const auto group = static_cast<std::size_t>(int8_group(c, shape));
      const auto rows = static_cast<std::size_t>(shape.rows()),
                 per_row = (static_cast<std::size_t>(shape.cols()) + group - 1) / group;
      return (n + 3) / 4 * 4 + 4 * rows * per_row;  // the codes, padded to a float, then the scales
    }
    case StoredFormat::sign:
      return (n + 63) / 64 * 8;
  }
  return 0;
}

/// float → bfloat16 bits, round to nearest even; a NaN becomes the quiet NaN 0x7fc0 (as c10::BFloat16).
inline std::uint16_t to_bf16(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (std::isnan(x)) return 0x7fc0;
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}
/// bfloat16 bits → float (exact).
inline float from_bf16(std::uint16_t h) {
  const std::uint32_t bits = std::uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

/// Encodes `x` (shape's elements, row-major) into `out` (stored_bytes(c, shape, sizeof(T)) bytes). Full is a copy.
template <class T>
void encode(const Compression& c, const Shape& shape, const T* x, void* out) {
  const Index n = shape.numel();
  auto* bytes = static_cast<unsigned char*>(out);
  switch (c.format) {
    case StoredFormat::full:
      std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(T));
      return;
    case StoredFormat::bf16:
      for (Index i = 0; i < n; ++i) {
        const std::uint16_t h = to_bf16(static_cast<float>(x[i]));
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    case StoredFormat::int8: {
      const Index group = int8_group(c, shape), row = shape.cols(), per_row = (row + group - 1) / group;
      auto* codes = reinterpret_cast<std::int8_t*>(bytes);
      unsigned char* scales = bytes + (n + 3) / 4 * 4;
      for (Index r = 0; r < shape.rows(); ++r)
        for (Index g = 0; g < per_row; ++g) {
          const Index begin = r * row + g * group, end = r * row + std::min(row, (g + 1) * group);
          float absmax = 0;
          for (Index i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(static_cast<float>(x[i])));
          const float scale = absmax / 127.0f;
          std::memcpy(scales + 4 * (r * per_row + g), &scale, 4);
          for (Index i = begin; i < end; ++i) {
            const float q = scale > 0 ? std::nearbyint(static_cast<float>(x[i]) / scale) : 0.0f;
            // A NaN quotient (a non-finite value in the group) is stored as 0: converting it would be undefined.
            codes[i] = std::isnan(q) ? std::int8_t{0} : static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
          }
        }
      return;
    }
    case StoredFormat::sign: {
      const Index words = (n + 63) / 64;
      for (Index w = 0; w < words; ++w) {
        std::uint64_t bits = 0;
        for (Index i = w * 64; i < std::min(n, (w + 1) * 64); ++i)
          if (x[i] > T(0)) bits |= std::uint64_t{1} << (i - w * 64);
        std::memcpy(bytes + 8 * w, &bits, 8);
      }
      return;
    }
  }
}

/// Decodes what encode() wrote into `x` (shape's elements): bf16 and int8 approximately (an int8 group that held an
/// infinity or a NaN decodes to non-finite values), sign as 1 (x > 0) or 0.
template <class T>
void decode(const Compression& c, const Shape& shape, const void* in, T* x) {
  const Index n = shape.numel();
  const auto* bytes = static_cast<const unsigned char*>(in);
  switch (c.format) {
    case StoredFormat::full:
      std::memcpy(x, in, static_cast<std::size_t>(n) * sizeof(T));
      return;
    case StoredFormat::bf16:
      for (Index i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        x[i] = static_cast<T>(from_bf16(h));
      }
      return;
    case StoredFormat::int8: {
      const Index group = int8_group(c, shape), row = shape.cols(), per_row = (row + group - 1) / group;
      const auto* codes = reinterpret_cast<const std::int8_t*>(bytes);
      const unsigned char* scales = bytes + (n + 3) / 4 * 4;
      for (Index r = 0; r < shape.rows(); ++r)
        for (Index g = 0; g < per_row; ++g) {
          float scale;
          std::memcpy(&scale, scales + 4 * (r * per_row + g), 4);
          const Index begin = r * row + g * group, end = r * row + std::min(row, (g + 1) * group);
          for (Index i = begin; i < end; ++i) x[i] = static_cast<T>(static_cast<float>(codes[i]) * scale);
        }
      return;
    }
    case StoredFormat::sign:
      for (Index i = 0; i < n; ++i) {
        std::uint64_t bits;
        std::memcpy(&bits, bytes + 8 * (i / 64), 8);
        x[i] = ((bits >> (i % 64)) & 1u) ? T(1) : T(0);
      }
      return;
  }
}

}  // namespace remat::detail
