// An int8 quantiser written apart from remat's (detail/compression_formats.hpp), element by element as
// docs/compression.md states the format, for tests to check the bytes and the values read back against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace remat_test {

/// Groups of `length` consecutive elements of x (the last one shorter), each with the float scale absmax/127 and
/// codes round-half-even(x · (1/scale)) (std::nearbyint) clamped to ±127, 0 for a group of zeros. `bytes` is what
/// encode() writes (the codes, zero padding to a multiple of 4, the scales) and `decoded` what decode() reads back
/// (code · scale). Finite input only.
struct ReferenceInt8 {
  std::vector<unsigned char> bytes;
  std::vector<float> decoded;
  ReferenceInt8(const std::vector<float>& x, std::size_t length) : decoded(x.size()) {
    const std::size_t n = x.size(), padded = (n + 3) / 4 * 4, groups = (n + length - 1) / length;
    bytes.assign(padded + 4 * groups, 0);
    for (std::size_t k = 0; k < groups; ++k) {
      const std::size_t begin = k * length, end = std::min(n, begin + length);
      float absmax = 0;
      for (std::size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(x[i]));
      const float scale = absmax / 127.0f;
      std::memcpy(&bytes[padded + 4 * k], &scale, 4);
      for (std::size_t i = begin; i < end; ++i) {
        const float code = scale > 0 ? std::min(127.0f, std::max(-127.0f, std::nearbyint(x[i] * (1.0f / scale)))) : 0;
        bytes[i] = static_cast<unsigned char>(static_cast<std::int8_t>(code));
        decoded[i] = code * scale;
      }
    }
  }
};

}  // namespace remat_test
