// The stored formats of compressed residuals (remat/compression.hpp): how a value is encoded into fewer bytes and
// decoded again. bf16 rounds to nearest even as
// PyTorch's c10::BFloat16 does; int8 keeps one absmax scale per group of consecutive elements (ActNN's and
// unsloth's group quantisation; per row, a last-dimension slice); sign keeps x > 0 as one bit, which is all ReLU's
// derivative reads.
#pragma once

#include <algorithm>
#include <cassert>
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

/// An int8 group's scale, absmax/127 of its elements in float: NaN if one of them is NaN, so that the whole group reads
/// back NaN (a NaN reaches the gradients as it would uncompressed); infinite if one is infinite (the group reads back
/// NaN: 0 · ∞).
template <class T>
float int8_scale(const T* x, Index count) {
  // The largest |x| as the largest bit pattern with the sign bit cleared: an integer maximum, which vectorises (a
  // float one does not, for its NaN rule), and a NaN's pattern is above every other one's.
  std::uint32_t largest = 0;
  for (Index i = 0; i < count; ++i) {
    const float v = static_cast<float>(x[i]);
    std::uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits &= 0x7fffffffu;
    largest = bits > largest ? bits : largest;
  }
  if (largest > 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();
  float absmax;
  std::memcpy(&absmax, &largest, sizeof absmax);
  return absmax / 127.0f;
}

/// int8's code of v = x / scale: v rounded to nearest even (as nearbyint in the default rounding mode), then
/// clamped to ±127 (|x| ≤ absmax keeps v within ±127 but for the last bit of the division; a NaN gives −127, as
/// std::max(-127, NaN) did). Rounded by adding and subtracting 1.5·2²³, which is exact for |v| < 2²²; above, the
/// clamp decides, and rounding is monotone, so every float gets nearbyint's code. Branch-free, unlike a clamp
/// first (which GCC turns into branches on the clamped cases), so that the loops over a group vectorise; a call
/// to nearbyint would not, without SSE4.1. -ffast-math would fold the addition away: nearbyint then.
inline float int8_code(float v) {
#ifdef __FAST_MATH__
  float r = std::nearbyint(v);
#else
  float r = (v + 12582912.0f) - 12582912.0f;
#endif
  r = r > -127.0f ? r : -127.0f;
  return r < 127.0f ? r : 127.0f;
}

/// The elements a range of encode() and decode() starts at a multiple of (and ends at one, or at n): int8's
/// group_length, so that no group is split between ranges; 1 for full and bf16. sign encodes all at once.
inline Index range_unit(const Compression& c, const Shape& shape) {
  return c.format() == StoredFormat::int8 ? c.group_length(shape) : 1;
}

/// Encodes `x` (shape's elements, row-major) into `out` (stored_bytes(c, shape, sizeof(T)) bytes). Full is a copy.
/// Only the elements [first, last) (all of them when last < 0) for full, bf16 and int8, so that blocks may be
/// encoded on several threads; both ends multiples of range_unit() (last may be n), so an int8 group, its codes
/// and its scale, belong to one range, and any split writes the bytes one pass writes. sign encodes all. An int8
/// group is a contiguous span of the buffer: its absmax and its codes are two vectorised loops over it, as is a
/// decode, which runs for every read of a packed value.
template <class T>
void encode(const Compression& c, const Shape& shape, const T* x, void* out, Index first = 0, Index last = -1) {
  const Index n = shape.numel();
  if (last < 0) last = n;
  assert(first % range_unit(c, shape) == 0 && (last % range_unit(c, shape) == 0 || last == n));
  auto* bytes = static_cast<unsigned char*>(out);
  switch (c.format()) {
    case StoredFormat::full:
      std::memcpy(static_cast<T*>(out) + first, x + first, static_cast<std::size_t>(last - first) * sizeof(T));
      return;
    case StoredFormat::bf16:
      for (Index i = first; i < last; ++i) {
        const std::uint16_t h = to_bf16(static_cast<float>(x[i]));
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
    case StoredFormat::int8: {
      const Index group = c.group_length(shape);
      auto* codes = reinterpret_cast<std::int8_t*>(bytes);
      unsigned char* scales = bytes + (n + 3) / 4 * 4;
      for (Index begin = first; begin < last; begin += group) {
        const Index count = std::min(group, n - begin);
        const float scale = int8_scale(x + begin, count);
        std::memcpy(scales + 4 * (begin / group), &scale, 4);
        std::int8_t* q = codes + begin;
        if (!(scale > 0) || !std::isfinite(scale)) {  // zeros, or a NaN or an infinity: the scale decides alone
          std::memset(q, 0, static_cast<std::size_t>(count));
          continue;
        }
        const T* v = x + begin;
        if (scale < std::numeric_limits<float>::min()) {
          // A subnormal scale (absmax below about 1.5e-36): 1/scale overflows float, and x · ∞ would give every
          // element ±127 and a zero NaN (−127). Divided in double instead, which holds the scale exactly: codes
          // within half a step of the stored scale, zeros 0, signs kept. Rare, so not vectorised.
          for (Index i = 0; i < count; ++i)
            q[i] = static_cast<std::int8_t>(int8_code(static_cast<float>(static_cast<double>(v[i]) / scale)));
          continue;
        }
        const float inverse = 1.0f / scale;
        for (Index i = 0; i < count; ++i)
          q[i] = static_cast<std::int8_t>(int8_code(static_cast<float>(v[i]) * inverse));
      }
      return;
    }
    case StoredFormat::sign: {
      const Index words = (n + 63) / 64;
      for (Index w = 0; w < words; ++w) {
        std::uint64_t bits = 0;
        const Index begin = w * 64, count = std::min<Index>(64, n - begin);
        for (Index j = 0; j < count; ++j) bits |= std::uint64_t{x[begin + j] > T(0)} << j;
        std::memcpy(bytes + 8 * w, &bits, 8);
      }
      return;
    }
  }
}

/// Decodes what encode() wrote into `x` (shape's elements): bf16 and int8 approximately (an int8 group that held an
/// infinity or a NaN decodes to NaN), sign as 1 (x > 0) or 0. The elements [first, last) as encode().
template <class T>
void decode(const Compression& c, const Shape& shape, const void* in, T* x, Index first = 0, Index last = -1) {
  const Index n = shape.numel();
  if (last < 0) last = n;
  assert(first % range_unit(c, shape) == 0 && (last % range_unit(c, shape) == 0 || last == n));
  const auto* bytes = static_cast<const unsigned char*>(in);
  switch (c.format()) {
    case StoredFormat::full:
      std::memcpy(x + first, static_cast<const T*>(in) + first, static_cast<std::size_t>(last - first) * sizeof(T));
      return;
    case StoredFormat::bf16:
      for (Index i = first; i < last; ++i) {
        std::uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        x[i] = static_cast<T>(from_bf16(h));
      }
      return;
    case StoredFormat::int8: {
      const Index group = c.group_length(shape);
      const auto* codes = reinterpret_cast<const std::int8_t*>(bytes);
      const unsigned char* scales = bytes + (n + 3) / 4 * 4;
      for (Index begin = first; begin < last; begin += group) {
        float scale;
        std::memcpy(&scale, scales + 4 * (begin / group), 4);
        const Index count = std::min(group, n - begin);
        const std::int8_t* q = codes + begin;
        T* v = x + begin;
        for (Index i = 0; i < count; ++i) v[i] = static_cast<T>(static_cast<float>(q[i]) * scale);
      }
      return;
    }
    case StoredFormat::sign:
      for (Index w = 0; w < (n + 63) / 64; ++w) {
        std::uint64_t bits;
        std::memcpy(&bits, bytes + 8 * w, 8);
        const Index begin = w * 64, count = std::min<Index>(64, n - begin);
        for (Index j = 0; j < count; ++j) x[begin + j] = static_cast<T>((bits >> j) & 1u);
      }
      return;
  }
}

}  // namespace remat::detail
