// The examples' state files (examples/common/state_file.hpp, examples/mlp/state_file.hpp): the documented
// layout round-tripping every bit, damaged files, a wrong version or another model's file refused naming the
// file, wrong shapes and reads past the end leaving the target unchanged, failed writes leaving the old file and
// no temporaries, a directory, a FIFO or a huge file that is not a state file refused from its header.
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
namespace state_file_test {

using namespace io_files;  // NOLINT(google-build-using-namespace): this directory's shared helpers

// ================================================================ examples/common/state_file.hpp

TEST(StateFile, StateFileLayoutIsTheDocumentedOneAndRoundTripsEveryBit) {
  TempDir dir;
  const std::string path = dir / "s.state";
  examples::StateWriter w;
  w.u32(0xDEADBEEFu);
  w.u64(0x0123456789ABCDEFull);
  const double specials[] = {-0.0, std::numeric_limits<double>::infinity(), std::nan("0x5"), 1e-310};
  for (double v : specials) w.f64(v);
  w.text("h\xC3\xA9llo\0x");
  MF m(2, 3);
  m << 1.5f, -0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e-40f, 7;
  w.matrix(m);
  const Bytes payload = w.bytes();
  examples::write_state_file(path, mlp::state_format, payload);

  // The bytes on disk, read as the header comment describes them.
  const Bytes file = read_file(path);
  ASSERT_EQ(file.size(), 24 + payload.size());
  EXPECT_EQ(std::string(file.begin(), file.begin() + 8), "REMATMLP");
  EXPECT_EQ(get_le(file, 8, 4), 1u);
  EXPECT_EQ(get_le(file, 12, 8), payload.size());
  EXPECT_EQ(get_le(file, 20, 4), crc32_bitwise(file.data() + 24, payload.size()));
  EXPECT_EQ(get_le(file, 24, 4), 0xDEADBEEFu);  // little-endian fields
  EXPECT_EQ(get_le(file, 28, 8), 0x0123456789ABCDEFull);
  EXPECT_EQ(get_le(file, 36, 8), bits_of(-0.0));

  examples::StateReader r = mlp::read_state_file(path);
  EXPECT_EQ(r.u32(), 0xDEADBEEFu);
  EXPECT_EQ(r.u64(), 0x0123456789ABCDEFull);
  for (double v : specials) EXPECT_EQ(bits_of(r.f64()), bits_of(v));
  EXPECT_EQ(r.text(), std::string("h\xC3\xA9llo"));  // the literal's \0 ends it
  MF back;
  r.matrix(back, 2, 3, "m");
  ASSERT_EQ(back.rows(), 2);
  EXPECT_EQ(std::memcmp(back.data(), m.data(), 6 * sizeof(float)), 0);  // NaN and -0 bit for bit
  r.expect_end();
  // No temporary file is left next to it.
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u);
}

TEST(StateFile, StateFileDamagedWrongVersionOrOtherModelIsRefusedNamingTheFile) {
  TempDir dir;
  const std::string path = dir / "s.state";
  examples::StateWriter w;
  for (std::uint32_t i = 0; i < 40; ++i) w.u32(i * 2654435761u);
  examples::write_state_file(path, mlp::state_format, w.bytes());
  const Bytes good = read_file(path);
  auto with = [&](const Bytes& bytes) {
    write_file(path, bytes);
    return path;
  };
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(with(Bytes(good.begin(), good.end() - 1))); },
                                             {path, "truncated", "159", "160"});
  Bytes longer = good;
  longer.push_back(0);
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(with(longer)); },
                                             {path, "length mismatch", "161", "160"});
  expect_error_naming<examples::state_error>(
      [&] { mlp::read_state_file(with(Bytes(good.begin(), good.begin() + 10))); },
      {path, "truncated", "10 bytes", "24-byte header"});
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(with({})); }, {path, "truncated", "0 bytes"});
  for (std::size_t at : {std::size_t{24}, good.size() / 2, good.size() - 1}) {
    Bytes flipped = good;
    flipped[at] ^= 0x10;
    expect_error_naming<examples::state_error>([&] { mlp::read_state_file(with(flipped)); },
                                               {path, "checksum mismatch"});
  }
  Bytes version = good;
  version[8] = 2;
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(with(version)); },
                                             {path, "format version 2", "version 1"});
  Bytes other = good;  // a GPT example's file given to the MLP
  std::memcpy(other.data(), "REMATGPT", 8);
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(with(other)); },
                                             {path, "not a remat MLP state file"});
  // A header length that does not fit (2^64 − 1): refused as truncated, nothing allocated for it.
  Bytes huge = good;
  for (int i = 0; i < 8; ++i) huge[12 + static_cast<std::size_t>(i)] = 0xFF;
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(with(huge)); },
                                             {path, "truncated", "18446744073709551615"});
  const std::string missing = dir / "none.state";
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(missing); }, {missing, "cannot open"});
}

TEST(StateFile, StateReaderRefusesWrongShapesAndReadsPastTheEndLeavingTheTargetUnchanged) {
  examples::StateWriter w;
  w.matrix(MF::Constant(2, 3, 1.0f));
  w.u32(5);  // a string's length with only 2 bytes after it
  w.u32(0x00004142);
  examples::StateReader r("f.state", w.bytes());
  MF target = MF::Constant(3, 2, 9.0f);
  expect_error_naming<examples::state_error>([&] { r.matrix(target, 3, 2, "weight 0"); },
                                             {"f.state", "weight 0", "[2,3]", "[3,2]"});
  EXPECT_EQ(target, MF::Constant(3, 2, 9.0f));
  // A matrix whose values are cut short: the shape fits, the values do not.
  examples::StateWriter short_values;
  short_values.u64(4);
  short_values.u64(4);
  short_values.u32(0);
  examples::StateReader r2("g.state", short_values.bytes());
  expect_error_naming<examples::state_error>([&] { r2.matrix(target, 4, 4, "bias 1"); },
                                             {"g.state", "payload ends inside bias 1"});
  EXPECT_EQ(target, MF::Constant(3, 2, 9.0f));
  // A string longer than the rest; a number past the end; bytes left over.
  examples::StateWriter t;
  t.u32(1000);
  t.u32(1);
  examples::StateReader r3("h.state", t.bytes());
  expect_error_naming<examples::state_error>([&] { r3.text(); }, {"h.state", "payload ends inside a string"});
  examples::StateReader r4("i.state", Bytes{1, 2, 3});
  expect_error_naming<examples::state_error>([&] { r4.u32(); }, {"i.state", "payload ends inside a number"});
  examples::StateReader r5("j.state", Bytes{1, 2, 3, 4, 5});
  EXPECT_EQ(r5.u32(), 0x04030201u);
  expect_error_naming<examples::state_error>([&] { r5.expect_end(); }, {"j.state", "1 unexpected bytes"});
}

TEST(StateFile, StateFileWriteFailuresLeaveTheOldFileAndNoTemporaries) {
  TempDir dir;
  const std::string target = dir / "keep.state";
  write_file(target, {1, 2, 3});
  const std::string into_missing = dir / "no/such/dir/x.state";
  expect_error_naming<examples::state_error>([&] { examples::write_state_file(into_missing, mlp::state_format, {}); },
                                             {into_missing, "cannot create a temporary file"});
  fs::create_directory(dir / "a_directory");
  const std::string over_directory = dir / "a_directory";
  expect_error_naming<examples::state_error>([&] { examples::write_state_file(over_directory, mlp::state_format, {}); },
                                             {over_directory, "rename"});
  EXPECT_TRUE(fs::is_directory(over_directory));
  EXPECT_EQ(read_file(target), (Bytes{1, 2, 3}));
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) entries += e.path().filename() != "a_directory" ? 1 : 0;
  EXPECT_EQ(entries, 1u);  // keep.state only: the failed write's temporary file was removed
}

// Regression: examples/common/state_file.hpp:204-205 (read_state_file): a read error while reading the file escapes
// as std::ios_base::failure thrown by libstdc++'s basic_filebuf::underflow inside the istreambuf_iterator copy (the
// `in.bad()` check after it never runs), so its message does not name the file: for a directory given as
// `mlp --resume DIR` or `gpt --state DIR` (which exists, so gpt resumes from it) the examples print
// "error: basic_filebuf::underflow error reading the file: Is a directory". (An I/O error on a real file
// — EIO — takes the same path.) Expected (doc: "Throws state_error describing the first problem found";
// state_error: "what() is one line naming the file"): state_error naming the path (e.g. "not a regular file" or
// "read error: Is a directory"). Fix: reject !std::filesystem::is_regular_file(path) up front, and wrap the read in
// try { ... } catch (const std::ios_base::failure& e) { throw state_error(path, std::string("read error: ") +
// e.what()); } (or read with in.read() of the size found by seekg/tellg and test in.fail()).
TEST(StateFile, StateFileThatIsADirectoryIsAStateErrorNamingIt) {
  TempDir dir;
  const std::string directory = dir / "a_directory";
  fs::create_directory(directory);
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(directory); }, {directory});
}

// Regression: read_state_file opened the path O_RDONLY, which for a FIFO waits for a
// writer, so `--resume FIFO` hung before the regular-file check could refuse it. Expected: state_error naming
// the path, at once (the child has 10 s).
TEST(StateFile, StateFileThatIsAFifoIsRefusedWithoutWaitingForAWriter) {
  TempDir dir;
  const std::string fifo = dir / "a_fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  GTEST_FLAG_SET(death_test_style, "fast");  // the child opens the FIFO made above; the parent removes it
  EXPECT_EXIT(run_in_child(
                  [&] {
                    try {
                      mlp::read_state_file(fifo);
                      std::_Exit(2);
                    } catch (const examples::state_error& e) {
                      if (!contains(e.what(), fifo) || !contains(e.what(), "not a regular file")) std::_Exit(3);
                    }
                  },
                  10),
              ::testing::ExitedWithCode(0), "");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
}

// Regression: examples/common/state_file.hpp:204 (read_state_file) reads the whole file into memory before looking
// at its header: a file that is not a state file at all but large (a wrong --resume path: a disk image, a
// sparse file, /dev/zero) is read in full — gigabytes allocated, minutes spent, or std::bad_alloc / an ASan
// out-of-memory abort — before "bad magic number" could be said (for /dev/zero it never ends). Expected
// (doc: "Throws state_error describing the first problem found"): state_error "not a remat MLP state file (bad
// magic number)" after reading the 24-byte header. Fix: read the header first (magic, version, length), compare
// the length with the file's size (fstat / seekg), and only then read exactly `length` payload bytes.
// The test gives a 1 TiB sparse file (no disk used) and a 10 s limit.
TEST(StateFile, StateFileThatIsAHugeNonStateFileIsRefusedFromItsHeaderNotReadInFull) {
  TempDir dir;
  const std::string path = dir / "sparse.img";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite("NOTSTATE", 1, 8, f);
    std::fclose(f);
  }
  std::error_code ec;
  fs::resize_file(path, std::uintmax_t{1} << 40, ec);
  if (ec) GTEST_SKIP() << "this file system cannot hold a 1 TiB sparse file: " << ec.message();
  GTEST_FLAG_SET(death_test_style, "fast");  // the child reads the file made above; the parent removes it
  EXPECT_EXIT(run_in_child(
                  [&] {
                    try {
                      mlp::read_state_file(path);
                      std::_Exit(2);
                    } catch (const examples::state_error& e) {
                      if (!contains(e.what(), "bad magic")) std::_Exit(3);
                    }
                  },
                  10),
              ::testing::ExitedWithCode(0), "");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
}

}  // namespace state_file_test
