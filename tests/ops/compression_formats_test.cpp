// The stored formats of compressed residuals (remat/detail/compression_formats.hpp): bf16 against PyTorch's own
// conversion, int8's error bound and bytes, the sign bit against ReLU's derivative, each format's bytes by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "int8_reference.hpp"
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

/// int8 with a scale per group of consecutive elements: each element within half a step (absmax / 254) of its value,
/// a zero read back as zero; bytes = the codes padded to 4, then 4 per group. On [3, 100]: per row, 3 groups of 100;
/// per group of 64, the groups [0, 64), [64, 128) … [256, 300) run across the rows: ⌈300/64⌉ = 5 scales (one
/// per row would take 6); per group of 128, ⌈300/128⌉ = 3.
TEST(CompressionFormats, Int8KeepsEachGroupWithinHalfAStep) {
  const Shape s{3, 100};
  std::vector<double> x(300);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * static_cast<double>(i)) * (1.0 + i / 100);
  for (std::size_t i = 200; i < 264; ++i) x[i] = 0;
  for (const std::int32_t group : {0, 64, 128}) {
    const Compression c = group == 0 ? Compression::int8_per_row() : Compression::int8_per_group(group);
    const std::vector<double> y = round_trip(c, s, x);
    const std::size_t g = group == 0 ? 100 : static_cast<std::size_t>(group);
    for (std::size_t b = 0; b < 300; b += g) {
      double absmax = 0;
      for (std::size_t i = b; i < std::min<std::size_t>(300, b + g); ++i) absmax = std::max(absmax, std::fabs(x[i]));
      const double step = static_cast<double>(static_cast<float>(absmax) / 127.0f);
      for (std::size_t i = b; i < std::min<std::size_t>(300, b + g); ++i)
        EXPECT_LE(std::fabs(y[i] - x[i]), step / 2 + 1e-6 * absmax) << "group " << group << ", element " << i;
    }
    for (std::size_t i = 200; i < 264; ++i) EXPECT_EQ(y[i], 0.0) << "group " << group;
    const std::size_t groups = group == 0 ? 3 : group == 64 ? 5 : 3;
    // The codes and the scales, rounded up to whole doubles (Compression::stored_bytes).
    EXPECT_EQ(remat::detail::stored_bytes(c, s, sizeof(double)), (300 + 4 * groups + 7) / 8 * 8) << "group " << group;
  }
}

/// Groups whose absmax/127 is subnormal in float (absmax below about 1.5e-36, still normal itself): 1/scale overflowed
/// to infinity, so every element read back as ±absmax and a zero as −absmax. Each element must read back within half
/// a step of the stored scale (plus the scale's own rounding, at most 2^-150 a step), zeros as 0, signs kept; in
/// float and in double, per group and per row; down to a subnormal absmax.
TEST(CompressionFormats, Int8GroupsOfTinyMagnitudesKeepZerosAndSigns) {
  for (const double unit : {1e-37, 3.5e-37, 1e-40}) {
    const std::vector<double> pattern{2, 0, -1, 1.5, 0.3, 0, 1, -2};
    std::vector<double> xd(16);
    std::vector<float> xf(16);
    for (std::size_t i = 0; i < 16; ++i) {
      xf[i] = static_cast<float>(pattern[i % 8] * unit);
      xd[i] = static_cast<double>(xf[i]);  // the same values, so float's rounding of them is not an error
    }
    for (const Compression& c : {Compression::int8_per_group(8), Compression::int8_per_row()}) {
      const Shape s{2, 8};
      const std::vector<double> yd = round_trip(c, s, xd);
      const std::vector<float> yf = round_trip(c, s, xf);
      const float absmax =
          *std::max_element(xf.begin(), xf.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
      const double step = static_cast<double>(std::fabs(absmax) / 127.0f);
      for (std::size_t i = 0; i < 16; ++i) {
        SCOPED_TRACE(::testing::Message() << "unit " << unit << ", element " << i);
        EXPECT_LE(std::fabs(yd[i] - xd[i]), step / 2 + 0x1p-149);
        EXPECT_LE(std::fabs(static_cast<double>(yf[i]) - xd[i]), step / 2 + 0x1p-149);
        if (xd[i] == 0) {
          EXPECT_EQ(yd[i], 0.0);
          EXPECT_EQ(yf[i], 0.0f);
        } else {
          EXPECT_EQ(std::signbit(yd[i]), std::signbit(xd[i]));
          EXPECT_EQ(std::signbit(yf[i]), std::signbit(xf[i]));
        }
      }
    }
  }
}

/// int8_per_group(64) on a [2,3,7,7] value (a convolution's activations, 7 wide): groups of 64 consecutive elements
/// run across the 7-element slices. Group 0, [0, 64), holds slice 8 ([56, 63), magnitudes about 100) and the first
/// element of slice 9 ([63, 70), magnitudes about 0.01): that element shares slice 8's scale and reads back as 0,
/// where one scale per slice (the rule before groups crossed slices) kept it to 1 %. Bytes: 294 codes → 296, and
/// ⌈294/64⌉ = 5 scales: 296 + 20 = 316 (one scale per slice of 7: 296 + 42·4 = 464). The bytes and the values read
/// back are remat_test::ReferenceInt8's (tests/support/int8_reference.hpp) with groups of 64, bit for bit.
TEST(CompressionFormats, Int8GroupsRunAcrossLastDimensionSlices) {
  const Shape s{2, 3, 7, 7};
  std::vector<float> x(294);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = (i >= 56 && i < 63 ? 100.0f : 0.01f) * std::cos(0.9f * static_cast<float>(i) + 0.3f);
  const Compression c = Compression::int8_per_group(64);
  const std::size_t stored = 296 + 4 * 5;
  ASSERT_EQ(c.stored_bytes(s, sizeof(float)), stored);
  ASSERT_EQ(c.groups(s), 5u);
  std::vector<unsigned char> bytes(stored, 0);  // the padding after the codes stays 0, as the reference's
  remat::detail::encode(c, s, x.data(), bytes.data());
  const remat_test::ReferenceInt8 want(x, 64);
  ASSERT_EQ(want.bytes.size(), stored);
  for (std::size_t i = 0; i < stored; ++i) EXPECT_EQ(bytes[i], want.bytes[i]) << "byte " << i;
  std::vector<float> y(294);
  remat::detail::decode(c, s, bytes.data(), y.data());
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], want.decoded[i]) << "element " << i;
  // Element 63 shares group 0's scale (about 100/127): 0.01 reads back as 0. Per slice it would have kept 1 %.
  EXPECT_EQ(y[63], 0.0f) << x[63];
  const remat_test::ReferenceInt8 per_slice(std::vector<float>(x.begin() + 63, x.begin() + 70), 7);
  EXPECT_LE(std::fabs(per_slice.decoded[0] - x[63]), 0.01f * std::fabs(x[63]));
  EXPECT_NE(y[63], per_slice.decoded[0]);
  // Per row stays one scale per slice of 7: 42 scales.
  EXPECT_EQ(Compression::int8_per_row().stored_bytes(s, sizeof(float)), 296u + 4 * 42);
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

/// Blocks of groups (the threads' share of an encode or a decode, detail/packing.hpp) write exactly what one pass
/// writes: encoding the elements [0, a), [a, b) and [b, n) separately, a and b multiples of range_unit (an int8
/// group), gives the same bytes as all at once, with groups that cross last-dimension slices (45 wide) and a last
/// group shorter than the others (630 = 9·64 + 54); decoding by other such blocks gives the same values.
TEST(CompressionFormats, BlocksOfGroupsEncodeAndDecodeAsOnePass) {
  const Shape s{7, 2, 45};  // matrix view [14, 45]
  const remat::Index n = 630;
  std::vector<float> x(630);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.7f * static_cast<float>(i)) * (1 + i % 11);
  for (const Compression c : {Compression::bf16(), Compression::int8_per_row(), Compression::int8_per_group(16),
                              Compression::int8_per_group(64)}) {
    SCOPED_TRACE(c.name());
    const remat::Index unit = remat::detail::range_unit(c, s);
    EXPECT_EQ(unit, c == Compression::bf16() ? 1 : c == Compression::int8_per_row() ? 45 : c.group());
    const std::size_t b = c.stored_bytes(s, 4);
    std::vector<unsigned char> whole(b, 0xAB), blocks(b, 0xAB);
    remat::detail::encode(c, s, x.data(), whole.data());
    remat::detail::encode(c, s, x.data(), blocks.data(), 0, 3 * unit);
    remat::detail::encode(c, s, x.data(), blocks.data(), 3 * unit, n / unit * unit);
    remat::detail::encode(c, s, x.data(), blocks.data(), n / unit * unit, n);
    EXPECT_TRUE(whole == blocks);
    std::vector<float> y(630), z(630);
    remat::detail::decode(c, s, whole.data(), y.data());
    remat::detail::decode(c, s, whole.data(), z.data(), 0, 5 * unit);
    remat::detail::decode(c, s, whole.data(), z.data(), 5 * unit, n);
    EXPECT_TRUE(y == z);
  }
}

}  // namespace compression_formats_test
