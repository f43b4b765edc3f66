// The stored formats of compressed residuals (remat/detail/compression_formats.hpp): bf16 against PyTorch's own
// conversion, int8's error bound and bytes, the sign bit against ReLU's derivative, each format's bytes by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "remat/detail/compression_formats.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace compression_formats_test {

using remat::Compression;
using remat::Shape;

template <class T>
std::vector<T> round_trip(const Compression& c, const Shape& s, const std::vector<T>& x) {
  std::vector<unsigned char> stored(remat::detail::stored_bytes(c, s, sizeof(T)));
  remat::detail::encode(c, s, x.data(), stored.data());
  std::vector<T> y(x.size());
  remat::detail::decode(c, s, stored.data(), y.data());
  return y;
}

/// PyTorch 1.13's float32 → bfloat16 → float32 of these values (`/usr/bin/python3 -c "import torch; print(
/// torch.tensor([...], dtype=torch.float32).bfloat16().float().tolist())"`): ties to even (1 + 2⁻⁸ goes down to 1,
/// 1 + 3·2⁻⁹ up), overflow to infinity, a subnormal below half the least bf16 one to −0, NaN kept.
TEST(CompressionFormats, Bf16RoundsAsPyTorch) {
  const std::vector<float> x{1.0f, 1.00390625f, 1.005859375f, 1.0078125f, -2.5e-41f, 3.4e38f, 1.99609375f, 0.1f};
  const std::vector<float> torch{
      1.0f, 1.0f, 1.0078125f, 1.0078125f, -0.0f, std::numeric_limits<float>::infinity(), 2.0f, 0.10009765625f};
  const Shape s{2, 4};
  const std::vector<float> y = round_trip(Compression::bf16(), s, x);
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(y[i], torch[i]) << i;
    EXPECT_EQ(std::signbit(y[i]), std::signbit(torch[i])) << i;
  }
  EXPECT_TRUE(std::isnan(
      round_trip(Compression::bf16(), Shape{1, 1}, std::vector<float>{std::numeric_limits<float>::quiet_NaN()})[0]));
  EXPECT_EQ(remat::detail::stored_bytes(Compression::bf16(), s, 4), 16u);
  // Every bfloat16 value but NaN survives a round trip: encoding is exact on what it can represent.
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float v = remat::detail::from_bf16(static_cast<std::uint16_t>(h));
    if (!std::isnan(v)) {
      ASSERT_EQ(remat::detail::to_bf16(v), h) << std::hex << h;
    }
  }
}

/// int8 with a scale per group: each element within half a step (absmax / 254) of its value, the group's
/// extremes exact in magnitude, a group of zeros zero; bytes = the codes padded to 4, then 4 per group.
TEST(CompressionFormats, Int8KeepsEachGroupWithinHalfAStep) {
  const Shape s{3, 100};
  std::vector<double> x(300);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * static_cast<double>(i)) * (1.0 + i / 100);
  for (std::size_t i = 200; i < 264; ++i) x[i] = 0;  // row 2's first group of 64: all zeros
  for (const std::int32_t group : {0, 64, 128}) {
    const Compression c = group == 0 ? Compression::int8_per_row() : Compression::int8_per_group(group);
    const std::vector<double> y = round_trip(c, s, x);
    const std::size_t g = group == 0 || group > 100 ? 100 : static_cast<std::size_t>(group);
    for (std::size_t r = 0; r < 3; ++r)
      for (std::size_t b = 0; b < 100; b += g) {
        double absmax = 0;
        for (std::size_t i = b; i < std::min<std::size_t>(100, b + g); ++i)
          absmax = std::max(absmax, std::fabs(x[r * 100 + i]));
        const double step = static_cast<double>(static_cast<float>(absmax) / 127.0f);
        for (std::size_t i = b; i < std::min<std::size_t>(100, b + g); ++i)
          EXPECT_LE(std::fabs(y[r * 100 + i] - x[r * 100 + i]), step / 2 + 1e-6 * absmax)
              << "group " << group << ", row " << r << ", element " << i;
      }
    for (std::size_t i = 200; i < 264; ++i) EXPECT_EQ(y[i], 0.0) << "group " << group;
    const std::size_t groups = 3 * ((100 + g - 1) / g);
    // The codes and the scales, rounded up to whole doubles (Compression::stored_bytes).
    EXPECT_EQ(remat::detail::stored_bytes(c, s, sizeof(double)), (300 + 4 * groups + 7) / 8 * 8) << "group " << group;
  }
}

/// The sign bit is x > 0: 1 for a positive value however small, 0 for −0, 0, negatives and NaN; so ReLU's
/// derivative g·(y > 0) read from it equals the one read from y, bitwise. Bytes: 8 per 64 elements.
TEST(CompressionFormats, SignIsWhatReluReads) {
  std::vector<float> y{0.5f,    0.0f,
                       -0.0f,   std::numeric_limits<float>::denorm_min(),
                       -1e-30f, std::numeric_limits<float>::quiet_NaN(),
                       3.0f,    std::numeric_limits<float>::infinity()};
  for (int i = 0; i < 70; ++i) y.push_back(i % 3 == 0 ? 0.0f : static_cast<float>(i) - 35.0f);
  const Shape s{1, static_cast<remat::Index>(y.size())};
  const std::vector<float> mask = round_trip(Compression::sign(), s, y);
  for (std::size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(mask[i], y[i] > 0.0f ? 1.0f : 0.0f) << i;
    const float g = 0.25f * static_cast<float>(i);
    EXPECT_EQ(g * static_cast<float>(mask[i] > 0.0f), g * static_cast<float>(y[i] > 0.0f)) << i;
  }
  EXPECT_EQ(remat::detail::stored_bytes(Compression::sign(), s, 4), 16u);  // 78 elements: 2 words
}

/// Row blocks (the threads' share of an encode or a decode, detail/packing.hpp) write exactly what one pass writes:
/// encoding rows [0, 3) and [3, 7) separately gives the same bytes as all 7 at once, with groups that end inside and
/// at the end of a row, and decoding by the same blocks gives the same values.
TEST(CompressionFormats, RowBlocksEncodeAndDecodeAsOnePass) {
  const Shape s{7, 2, 45};  // matrix view [14, 45]
  std::vector<float> x(630);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.7f * static_cast<float>(i)) * (1 + i % 11);
  for (const Compression c : {Compression::bf16(), Compression::int8_per_row(), Compression::int8_per_group(16)}) {
    const std::size_t b = c.stored_bytes(s, 4);
    std::vector<unsigned char> whole(b, 0xAB), blocks(b, 0xAB);
    remat::detail::encode(c, s, x.data(), whole.data());
    remat::detail::encode(c, s, x.data(), blocks.data(), 0, 6);
    remat::detail::encode(c, s, x.data(), blocks.data(), 6, 14);
    EXPECT_TRUE(whole == blocks) << c.name();
    std::vector<float> y(630), z(630);
    remat::detail::decode(c, s, whole.data(), y.data());
    remat::detail::decode(c, s, whole.data(), z.data(), 0, 9);
    remat::detail::decode(c, s, whole.data(), z.data(), 9, 14);
    EXPECT_TRUE(y == z) << c.name();
  }
}

}  // namespace compression_formats_test
