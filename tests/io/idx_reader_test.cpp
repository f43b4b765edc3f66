// The IDX reader of the MLP example (examples/mlp/idx.hpp): plain and gzip images with byte values over 255's
// edge, malformed files refused with data_error naming the file and the problem, declared sizes checked against
// what the file can hold, FIFOs and devices refused without waiting, gzip members followed by other bytes, cut
// inside the trailer or split in two, image and label counts that differ, a huge declared count on a tiny file.
//
// Oracles are closed forms, hand computations and the formats as their doc comments describe them (e.g. a CRC-32
// computed bit by bit here), never values computed by the code under test. A "Regression:" comment states what
// the reader did before and the behaviour expected (its doc comment).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "common/state_file.hpp"
#include "expect_error.hpp"
#include "file_helpers.hpp"
#include "gpt/corpus.hpp"
#include "mlp/idx.hpp"
#include "mlp/state_file.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace idx_reader_test {

using namespace io_files;  // NOLINT(google-build-using-namespace): this directory's shared helpers

// ================================================================ examples/mlp/idx.hpp

TEST(IdxReader, IdxImagesPlainAndGzipDecodeToBytesOver255) {
  TempDir dir;
  const std::uint32_t count = 3, rows = 5, cols = 7;
  const Bytes pixels = pattern_bytes(count * rows * cols, 3);
  for (const bool gz : {false, true}) {
    const std::string path = dir / (gz ? "i.gz" : "i.raw");
    if (gz)
      write_gz(path, idx_images(count, rows, cols, pixels));
    else
      write_file(path, idx_images(count, rows, cols, pixels));
    int r = -1, c = -1;
    const MF images = mlp::read_idx_images(path, r, c);
    ASSERT_EQ(images.rows(), 3);
    ASSERT_EQ(images.cols(), 35);
    EXPECT_EQ(r, 5);
    EXPECT_EQ(c, 7);
    for (std::size_t i = 0; i < pixels.size(); ++i) {  // row-major: image i / 35, pixel i % 35
      const double expected = pixels[i] / 255.0;
      EXPECT_NEAR(images(static_cast<remat::Index>(i / 35), static_cast<remat::Index>(i % 35)), expected, 1e-7);
    }
  }
}

TEST(IdxReader, IdxMalformedFilesThrowDataErrorNamingFileAndProblem) {
  TempDir dir;
  int r = 0, c = 0;
  const std::string missing = dir / "absent.gz";
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(missing, r, c); }, {missing, "cannot open"});
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(missing, 10); }, {missing, "cannot open"});

  const std::string empty = dir / "empty.gz";
  write_file(empty, {});
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(empty, r, c); }, {empty, "truncated", "header"});
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(empty, 10); }, {empty, "truncated", "header"});

  const std::string magic = dir / "magic.gz";
  write_file(magic, idx_labels(10, pattern_bytes(10, 1)));  // a label file given as images (18 bytes)
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(magic, r, c); },
                                       {magic, "bad magic number 2049", "2051"});
  write_file(magic, idx_images(1, 1, 1, {0}));
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(magic, 10); },
                                       {magic, "bad magic number 2051", "2049"});

  const std::string bad = dir / "bad.gz";
  for (const auto& dims : std::vector<std::vector<std::uint32_t>>{{0, 2, 2}, {10'000'001, 2, 2}, {0xFFFFFFFFu, 2, 2}}) {
    write_file(bad, idx_images(dims[0], dims[1], dims[2], {}));
    expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(bad, r, c); },
                                         {bad, "implausible image count", std::to_string(dims[0])});
  }
  for (const auto& dims :
       std::vector<std::vector<std::uint32_t>>{{1, 0, 2}, {1, 2, 0}, {1, 1025, 2}, {1, 2, 0xFFFFFFFFu}}) {
    write_file(bad, idx_images(dims[0], dims[1], dims[2], {}));
    expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(bad, r, c); }, {bad, "implausible image size"});
  }
  write_file(bad, idx_labels(0, {}));
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(bad, 10); }, {bad, "implausible label count", "0"});

  // A directory given as the file.
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(dir.path(), r, c); }, {dir.path(), "directory"});

  // Truncated pixel data (plain and gzip), trailing bytes, a gzip stream cut short.
  const Bytes good = idx_images(2, 3, 3, pattern_bytes(18, 4));
  write_file(bad, Bytes(good.begin(), good.end() - 1));  // refused from the header: a plain file of 33 bytes
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(bad, r, c); },
                                       {bad, "truncated", "18 bytes", "plain file of 33 bytes"});
  write_gz(bad, Bytes(good.begin(), good.end() - 1));  // a gzip file could hold them: read, and 17 are there
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(bad, r, c); }, {bad, "truncated", "only 17"});
  Bytes longer = good;
  longer.push_back(0);
  write_gz(bad, longer);
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(bad, r, c); }, {bad, "length mismatch"});
  write_gz(bad, idx_images(50, 28, 28, pattern_bytes(50 * 784, 5)));
  Bytes gz = read_file(bad);
  gz.resize(gz.size() / 2);
  write_file(bad, gz);
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(bad, r, c); }, {bad, "truncated"});
  EXPECT_EQ(r, 0);  // the outputs are written only on success
  EXPECT_EQ(c, 0);

  // Labels out of range name the label, its index and the range.
  write_file(bad, idx_labels(4, {0, 9, 10, 3}));
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(bad, 10); }, {bad, "label 10 at index 2", "0..9"});
  write_file(bad, idx_labels(2, {255, 0}));
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(bad, 10); }, {"label 255 at index 0"});
  write_file(bad, idx_labels(3, {9, 0, 5}));
  EXPECT_EQ(mlp::read_idx_labels(bad, 10), (std::vector<int>{9, 0, 5}));
}

// read_idx_images allocates the declared images before reading them, after checking that the file can hold
// them: a plain file holds its own size, a gzip file at most 1032 times it (deflate's limit, zlib's technical
// details). The check must refuse a declaration just above each bound and let one at it be read (and found
// short), and must not refuse a real file compressed near deflate's limit. (Until the plain bound, a plain
// 8 MiB file declaring 8256 images of 1024x1024, 1032 times its size, was allocated as 34.6 GB of floats.)
TEST(IdxReader, IdxDeclaredSizeIsCheckedAgainstWhatTheFileCanHoldPlainOrGzip) {
  TempDir dir;
  int r = 0, c = 0;
  const std::string zeros = dir / "zeros.gz";
  const std::uint32_t count = 12;  // 12 MiB of zero pixels, compressed at level 9
  const Bytes file = idx_images(count, 1024, 1024, Bytes(std::size_t{count} << 20, 0));
  gzFile f = gzopen(zeros.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, file.data(), static_cast<unsigned>(file.size())), static_cast<int>(file.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
  const double ratio = static_cast<double>(file.size()) / static_cast<double>(std::filesystem::file_size(zeros));
  ASSERT_GT(ratio, 1000.0);  // a bound below deflate's real limit (say 1000-fold) would refuse this file
  const MF images = mlp::read_idx_images(zeros, r, c);
  ASSERT_EQ(images.rows(), count);
  ASSERT_EQ(images.cols(), 1024 * 1024);
  EXPECT_EQ(images.cwiseAbs().maxCoeff(), 0.0f);

  // A plain file of 32 bytes (header and 16 pixels) holds 16 pixels.
  const std::string plain = dir / "plain.idx";
  write_file(plain, idx_images(1, 1, 17, Bytes(16, 0)));  // declares 17: refused before allocating
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(plain, r, c); },
                                       {plain, "truncated", "17 bytes", "a plain file of 32 bytes can hold"});
  write_file(plain, idx_images(1, 4, 4, Bytes(15, 0)));  // declares 16 in a file of 31: refused
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(plain, r, c); }, {plain, "plain file of 31 bytes"});
  write_file(plain, idx_images(1, 4, 4, Bytes(16, 7)));  // exactly what it holds: read
  EXPECT_EQ(mlp::read_idx_images(plain, r, c).rows(), 1);
  // The 1032-fold bound of a plain file's size, which the gzip bound would allow, is refused for a plain file.
  write_file(plain, idx_images(1, 181, 181, Bytes(16, 0)));  // 32,761 ≤ 32 · 1032 but a plain file holds 16
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(plain, r, c); }, {plain, "32761 bytes", "can hold"});

  // A gzip file of S bytes holds at most 1032·S: the first row count of 1024 pixels past that bound (S depends
  // on the header's digits, so each count is compressed and measured) is refused with the bound, the count
  // before it is read and found short.
  const std::string gz = dir / "small.gz";
  auto past_bound = [&](std::uint32_t rows) {
    write_gz(gz, idx_images(1, rows, 1024, Bytes(16, 0)));
    return std::uint64_t{rows} * 1024 + 16 > 1032 * std::filesystem::file_size(gz);
  };
  std::uint32_t above = 1;
  while (above <= 1024 && !past_bound(above)) ++above;
  ASSERT_GT(above, 1u);
  ASSERT_LE(above, 1024u);
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(gz, r, c); },
                                       {gz, "truncated", "more than a gzip file of", "1032-fold"});
  ASSERT_FALSE(past_bound(above - 1));
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(gz, r, c); },
                                       {gz, "truncated", "but only 16 are there"});
}

// Regression: the reader opened the path O_RDONLY and accepted every kind of file: a FIFO made open() wait for a
// writer forever (`mlp --data DIR` hung with DIR/train-images-idx3-ubyte.gz a FIFO), and with a writer nothing
// bounded what its header declared. Now anything but a regular file is refused at once, naming it.
TEST(IdxReader, IdxFifoOrDeviceIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string fifo = dir / "train-images-idx3-ubyte.gz";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  GTEST_FLAG_SET(death_test_style, "fast");  // the child opens the FIFO made above; the parent removes it
  EXPECT_EXIT(run_in_child(
                  [&] {
                    for (const std::string& path : {fifo, std::string("/dev/zero")}) {
                      int r = 0, c = 0;
                      try {
                        mlp::read_idx_images(path, r, c);
                        std::_Exit(2);
                      } catch (const mlp::data_error& e) {
                        if (!contains(e.what(), path) || !contains(e.what(), "not a regular file")) std::_Exit(3);
                      }
                      try {
                        mlp::read_idx_labels(path, 10);
                        std::_Exit(4);
                      } catch (const mlp::data_error& e) {
                        if (!contains(e.what(), path) || !contains(e.what(), "not a regular file")) std::_Exit(5);
                      }
                    }
                  },
                  10),
              ::testing::ExitedWithCode(0), "");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
}

// zlib's gzread ignores bytes after a gzip member that do not begin another one (gzip -d warns about them);
// the reader documents it: what it returns is the member's data, checked by its CRC-32. A second member
// with data is still trailing data, refused.
TEST(IdxReader, IdxGzipMemberFollowedByNonGzipBytesReadsTheMembersDataOnly) {
  TempDir dir;
  const std::string path = dir / "i.gz";
  const Bytes pixels = pattern_bytes(3 * 784, 1);
  write_gz(path, idx_images(3, 28, 28, pixels));
  Bytes b = read_file(path);
  const Bytes member = b;
  b.insert(b.end(), 1000, 0);
  write_file(path, b);
  int r = 0, c = 0;
  const MF images = mlp::read_idx_images(path, r, c);
  ASSERT_EQ(images.rows(), 3);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    ASSERT_EQ(images.data()[i], static_cast<float>(pixels[i]) / 255.0f) << i;
  Bytes two = member;
  const std::string extra = dir / "extra.gz";
  write_gz(extra, Bytes(5, 1));
  const Bytes second = read_file(extra);
  two.insert(two.end(), second.begin(), second.end());
  write_file(path, two);
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(path, r, c); }, {path, "length mismatch"});
}

// A gzip file cut anywhere in its last 8 bytes (the CRC-32 and length trailer) is truncated data. zlib's gzread,
// which the reader used before, returned such an image file's pixels without an error and without checking
// them whenever the last bytes went straight to the caller's buffer (reads of 16 KiB or more: 3000 images).
TEST(IdxReader, IdxGzipFileCutInsideItsTrailerIsTruncated) {
  TempDir dir;
  const Bytes pixels = pattern_bytes(3000 * 784, 3);
  const std::string whole = dir / "whole.gz", cut = dir / "cut.gz";
  write_gz(whole, idx_images(3000, 28, 28, pixels));
  const Bytes packed = read_file(whole);
  int r = 0, c = 0;
  const MF images = mlp::read_idx_images(whole, r, c);
  ASSERT_EQ(images.rows(), 3000);
  EXPECT_EQ(images(2999, 783), static_cast<float>(pixels.back()) / 255.0f);
  for (std::size_t k = 1; k <= 8; ++k) {
    write_file(cut, Bytes(packed.begin(), packed.end() - static_cast<std::ptrdiff_t>(k)));
    expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(cut, r, c); }, {cut, "truncated", "trailer"});
  }
  write_gz(whole, idx_labels(5, Bytes{1, 2, 3, 4, 5}));
  const Bytes packed_labels = read_file(whole);
  for (std::size_t k = 1; k <= 8; ++k) {
    write_file(cut, Bytes(packed_labels.begin(), packed_labels.end() - static_cast<std::ptrdiff_t>(k)));
    expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(cut, 10); }, {cut, "truncated"});
  }
  // The trailer's length (ISIZE, the last 4 bytes, little-endian) off by one: corrupt, not truncated.
  Bytes bad_length = packed_labels;
  bad_length[bad_length.size() - 4] ^= 1;
  write_file(cut, bad_length);
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_labels(cut, 10); }, {cut, "corrupt"});
}

// Concatenated gzip members are one stream (RFC 1952, 2.2; `gzip -d` and gzread read them so): data split
// across two members reads as from one.
TEST(IdxReader, IdxGzipDataSplitAcrossTwoMembersReadsAsOne) {
  TempDir dir;
  const Bytes pixels = pattern_bytes(40 * 784, 4);
  const Bytes file = idx_images(40, 28, 28, pixels);
  const std::string first = dir / "first.gz", second = dir / "second.gz", both = dir / "both.gz";
  const auto half = static_cast<std::ptrdiff_t>(file.size() / 2 + 7);
  write_gz(first, Bytes(file.begin(), file.begin() + half));
  write_gz(second, Bytes(file.begin() + half, file.end()));
  Bytes joined = read_file(first);
  const Bytes tail = read_file(second);
  joined.insert(joined.end(), tail.begin(), tail.end());
  write_file(both, joined);
  int r = 0, c = 0;
  const MF images = mlp::read_idx_images(both, r, c);
  ASSERT_EQ(images.rows(), 40);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    ASSERT_EQ(images.data()[i], static_cast<float>(pixels[i]) / 255.0f) << i;
  // The second member cut inside its trailer: truncated, as for a single member.
  joined.resize(joined.size() - 3);
  write_file(both, joined);
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_images(both, r, c); }, {both, "truncated"});
}

TEST(IdxReader, IdxDatasetWithImagesAndLabelsOfDifferentCountsIsRefused) {
  TempDir dir;
  write_file(dir / "x-images-idx3-ubyte.gz", idx_images(3, 2, 2, pattern_bytes(12, 6)));
  write_file(dir / "x-labels-idx1-ubyte.gz", idx_labels(2, {1, 2}));
  expect_error_naming<mlp::data_error>([&] { mlp::read_idx_dataset(dir.path(), "x", 10); },
                                       {"x-labels-idx1-ubyte.gz", "2 labels", "3 images"});
  write_file(dir / "x-labels-idx1-ubyte.gz", idx_labels(3, {1, 2, 3}));
  const mlp::Dataset d = mlp::read_idx_dataset(dir.path(), "x", 10);
  EXPECT_EQ(d.images.rows(), 3);
  EXPECT_EQ(d.labels, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(d.image_rows, 2);
  EXPECT_EQ(d.image_cols, 2);
}

// Regression: examples/mlp/idx.hpp:133 (read_idx_images) allocates count·rows·cols bytes as the header declares
// before reading any pixel. Each dimension passes its own plausibility check (count ≤ 10,000,000, sides ≤ 1024),
// but their product is up to 10^13 bytes: a 16-byte file declaring 10,000,000 images of 1024x1024 makes it
// allocate 10 TB — std::bad_alloc (not data_error; the example then says "out of memory" without naming the file)
// or, under ASan, an allocation-size-too-big abort; a declared 7.8 GB (10^7 images of 28x28) is allocated and
// zero-filled in full. Expected (doc: "Throws data_error for ... implausible dimensions, truncated ... data"):
// data_error naming the file and "truncated", with memory bounded by what the file holds.
// Fix: read the pixels in chunks (e.g. 16 MiB), growing the vector only as data arrives, so a short file
// stops with "truncated" after allocating about its own size (or cap count·rows·cols, e.g. ≤ 2^32 bytes).
TEST(IdxReader, IdxHugeDeclaredImageCountOnATinyFileIsTruncatedNotATenTerabyteAllocation) {
  TempDir dir;
  const std::string path = dir / "huge.gz";
  write_file(path, idx_images(10'000'000, 1024, 1024, pattern_bytes(64, 7)));
  // "fast": the child is a fork of this process and reads the file made above; the parent removes it.
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(run_in_child([&] {
                int r = 0, c = 0;
                try {
                  mlp::read_idx_images(path, r, c);
                  std::_Exit(2);
                } catch (const mlp::data_error& e) {
                  if (!contains(e.what(), path) || !contains(e.what(), "truncated")) std::_Exit(3);
                } catch (const std::bad_alloc&) {
                  std::_Exit(4);
                }
              }),
              ::testing::ExitedWithCode(0), "");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
}

}  // namespace idx_reader_test
