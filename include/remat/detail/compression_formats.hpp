// The stored formats of compressed residuals (remat/compression.hpp): how a value is encoded into fewer bytes and
// decoded again. bf16 rounds to nearest even as
// PyTorch's c10::BFloat16 does; int8 keeps one absmax scale per group of elements (ActNN's and unsloth's per-row
// int8); sign keeps x > 0 as one bit, which is all ReLU's derivative reads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "remat/compression.hpp"
#include "remat/shape.hpp"

namespace remat::detail {

/// A Compression in one byte, as a node keeps it: the format in bits 0–1, log2 of int8's group in bits 2–7 (0: per
/// row). 0 is full.
inline std::uint8_t compression_code(const Compression& c) {
  unsigned log2 = 0;
  while (c.group() > 0 && (std::int32_t{1} << log2) < c.group()) ++log2;
  return static_cast<std::uint8_t>(static_cast<unsigned>(c.format()) | log2 << 2);
}
/// The Compression of a compression_code().
inline Compression compression_of(std::uint8_t code) {
  switch (static_cast<StoredFormat>(code & 3u)) {
    case StoredFormat::full:
      return Compression();
    case StoredFormat::bf16:
      return Compression::bf16();
    case StoredFormat::int8:
      return (code >> 2) == 0 ? Compression::int8_per_row()
                              : Compression::int8_per_group(std::int32_t{1} << (code >> 2));
    case StoredFormat::sign:
      return Compression::sign();
  }
  return Compression();
}

/// Bytes of `shape`'s value stored in `c` (elements of `element_bytes` each): Compression::stored_bytes.
inline std::size_t stored_bytes(const Compression& c, const Shape& shape, std::size_t element_bytes) {
  return c.stored_bytes(shape, element_bytes);
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
  switch (c.format()) {
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
      const Index group = c.group_in_row(shape), row = shape.cols(), per_row = (row + group - 1) / group;
      auto* codes = reinterpret_cast<std::int8_t*>(bytes);
      unsigned char* scales = bytes + (n + 3) / 4 * 4;
      for (Index r = 0; r < shape.rows(); ++r)
        for (Index g = 0; g < per_row; ++g) {
          const Index begin = r * row + g * group, end = r * row + std::min(row, (g + 1) * group);
          // A NaN in the group makes its scale NaN, so that the whole group decodes to NaN (std::max would skip it, and
          // the NaN would come back as 0): a NaN reaches the gradients as it would uncompressed.
          float absmax = 0;
          for (Index i = begin; i < end; ++i) {
            const float v = std::fabs(static_cast<float>(x[i]));
            absmax = std::isnan(v) || std::isnan(absmax) ? std::numeric_limits<float>::quiet_NaN() : std::max(absmax, v);
          }
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
  switch (c.format()) {
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
      const Index group = c.group_in_row(shape), row = shape.cols(), per_row = (row + group - 1) / group;
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
