// The GPT example's corpus reader (examples/gpt/corpus.hpp): regular files read sorted, the rest skipped, every
// byte value kept; an empty, missing or non-directory corpus; the split into every twentieth block and its
// refusals; a sequence length whose successor wraps; a file with a read error; a corpus larger than memory.
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
namespace corpus_test {

using namespace io_files;  // NOLINT(google-build-using-namespace): this directory's shared helpers

// ================================================================ examples/gpt/corpus.hpp

TEST(Corpus, CorpusReadsRegularFilesSortedSkipsTheRestAndKeepsEveryByteValue) {
  TempDir dir;
  Bytes b_bytes, a_bytes;
  for (int v = 0; v < 256; ++v) b_bytes.push_back(static_cast<unsigned char>(255 - v));  // every byte, non-ASCII too
  a_bytes = {'A', '\n', 0x00, 0xC3, 0xA9};
  write_file(dir / "b", b_bytes);
  write_file(dir / "a", a_bytes);
  write_file(dir / "a.dat", {'x'});
  write_file(dir / ".hidden", {'y'});
  fs::create_symlink(dir / "a", dir / "a.u8");
  fs::create_symlink(dir / "b", dir / "link");
  fs::create_directory(dir / "sub");
  write_file(dir / "sub/c", {'z'});
  const gpt::Corpus c = gpt::read_corpus(dir.path());
  EXPECT_EQ(c.files, (std::vector<std::string>{"a", "b"}));
  Bytes expected = a_bytes;
  expected.insert(expected.end(), b_bytes.begin(), b_bytes.end());
  EXPECT_EQ(c.bytes, expected);
  EXPECT_EQ(c.crc32, crc32_bitwise(expected.data(), expected.size()));

  // Windows give byte values 0..255 as they are (no sign extension of bytes ≥ 0x80).
  gpt::Runs runs;
  runs.runs.push_back({0, c.bytes.size()});
  runs.bytes = c.bytes.size();
  const gpt::Windows w(runs, 4);
  EXPECT_EQ(w.count(), c.bytes.size() - 4);
  std::vector<int> ids(8), targets(8);
  w.fill(c, 3, 1, ids, targets);  // window 3 (bytes 3..7) into sequence 1
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(ids[4 + static_cast<std::size_t>(s)], static_cast<int>(expected[3 + static_cast<std::size_t>(s)]));
    EXPECT_EQ(targets[4 + static_cast<std::size_t>(s)], static_cast<int>(expected[4 + static_cast<std::size_t>(s)]));
  }
  EXPECT_EQ(ids[4], 0xC3);
}

TEST(Corpus, CorpusEmptyMissingOrNotADirectoryIsADataErrorNamingIt) {
  TempDir dir;
  fs::create_directory(dir / "empty");
  write_file(dir / "empty/zero", {});
  write_file(dir / "empty/only.dat", {'x', 'y'});
  expect_error_naming<gpt::data_error>([&] { gpt::read_corpus(dir / "empty"); },
                                       {dir / "empty", "the corpus is empty", "1 files"});
  expect_error_naming<gpt::data_error>([&] { gpt::read_corpus(dir / "absent"); },
                                       {dir / "absent", "no such directory"});
  write_file(dir / "file", {'x'});
  expect_error_naming<gpt::data_error>([&] { gpt::read_corpus(dir / "file"); }, {dir / "file", "not a directory"});
}

TEST(Corpus, CorpusSplitIsEveryTwentiethBlockAndRefusesACorpusWithoutAWindowInEachSplit) {
  gpt::Corpus c;
  c.directory = "corpus_dir";
  c.bytes = pattern_bytes(45 * 1024 + 100, 8);  // blocks 0..45 (the last 100 bytes), validation 19 and 39
  gpt::split(c, 64);
  EXPECT_EQ(c.block, 1024u);
  ASSERT_EQ(c.validation.runs.size(), 2u);
  EXPECT_EQ(c.validation.runs[0].begin, 19u * 1024);
  EXPECT_EQ(c.validation.runs[1].begin, 39u * 1024);
  EXPECT_EQ(c.validation.bytes, 2u * 1024);
  ASSERT_EQ(c.train.runs.size(), 3u);  // 0..18, 20..38, 40..45
  EXPECT_EQ(c.train.runs[0].length, 19u * 1024);
  EXPECT_EQ(c.train.runs[2].length, 5u * 1024 + 100);
  EXPECT_EQ(c.train.bytes + c.validation.bytes, c.bytes.size());
  const gpt::Windows train(c.train, 64), validation(c.validation, 64);
  EXPECT_EQ(train.count(), (19u * 1024 - 64) + (19u * 1024 - 64) + (5u * 1024 + 100 - 64));
  EXPECT_EQ(validation.count(), 2u * (1024 - 64));
  EXPECT_EQ(train.at(0), 0u);
  EXPECT_EQ(train.at(19u * 1024 - 64), 20u * 1024);  // the first window of the second run
  EXPECT_EQ(validation.at(1024 - 64), 39u * 1024);
  // A long sequence: blocks of S + 1 bytes.
  gpt::split(c, 2000);
  EXPECT_EQ(c.block, 2001u);
  // Shorter than one window of each split: refused, naming the directory and the size.
  gpt::Corpus small;
  small.directory = "small_dir";
  small.bytes = pattern_bytes(100, 9);
  expect_error_naming<gpt::data_error>([&] { gpt::split(small, 64); }, {"small_dir", "100 bytes", "too small"});
  small.bytes = pattern_bytes(19 * 1024 + 64, 9);  // the validation block holds 64 bytes: no window of 65
  expect_error_naming<gpt::data_error>([&] { gpt::split(small, 64); }, {"too small"});
  small.bytes = pattern_bytes(19 * 1024 + 65, 9);
  gpt::split(small, 64);
  EXPECT_EQ(gpt::Windows(small.validation, 64).count(), 1u);
}

// Regression: examples/gpt/corpus.hpp:106/123 (split) and :136 (Windows) compute seq_len + 1 in std::size_t, which
// wraps to 0 for seq_len = SIZE_MAX (what examples/gpt/main.cpp:335 passes for a state file's seq_len 0xFFFFFFFF read
// into an int as -1): split accepts any corpus ("longest < 0" is never true) and Windows counts
// r.length − SIZE_MAX = r.length + 1 windows per run, each reaching 2^64 bytes past the corpus (fill would read
// out of bounds). Expected (doc: "Throws data_error unless each split holds at least one window of S + 1 bytes"):
// data_error naming the directory; Windows(runs, S) with no run of S + 1 bytes counts 0 windows.
// Fix: compare `run.length > seq_len` (and `r.length > seq_len_` in Windows) instead of `>= seq_len + 1`, and
// compute the block as seq_len < 1024 ? 1024 : seq_len + 1 after rejecting seq_len == SIZE_MAX.
TEST(Corpus, CorpusSplitWithASequenceLengthWhoseSuccessorWrapsIsRefused) {
  gpt::Corpus c;
  c.directory = "wrap_dir";
  c.bytes = pattern_bytes(30000, 10);
  const std::size_t huge = std::numeric_limits<std::size_t>::max();
  expect_error_naming<gpt::data_error>([&] { gpt::split(c, huge); }, {"wrap_dir", "too small"});
  gpt::Runs runs;
  runs.runs.push_back({0, c.bytes.size()});
  runs.bytes = c.bytes.size();
  EXPECT_EQ(gpt::Windows(runs, huge).count(), 0u) << "no run holds a window of 2^64 bytes";
}
// Regression: read_corpus read each file through an std::istreambuf_iterator, and libstdc++'s filebuf throws
// std::ios_base::failure on a read error ("basic_filebuf::underflow error reading the file: Invalid argument"),
// which escaped naming no file; an allocation failure escaped as std::bad_alloc. A directory whose regular
// files fail to read (sysfs: a loopback device's speed is EINVAL) must give data_error naming the file.
TEST(Corpus, CorpusFileWithAReadErrorIsADataErrorNamingTheFile) {
  const std::string dir = "/sys/devices/virtual/net/lo";
  {
    const int fd = ::open((dir + "/speed").c_str(), O_RDONLY);
    char b;
    const bool fails = fd >= 0 && ::read(fd, &b, 1) < 0;
    if (fd >= 0) ::close(fd);
    if (!fails) GTEST_SKIP() << dir << "/speed is absent or readable on this machine";
  }
  expect_error_naming<gpt::data_error>([&] { gpt::read_corpus(dir); }, {dir + "/"});
}

#if !defined(__SANITIZE_ADDRESS__)  // RLIMIT_AS and ASan's shadow memory do not mix
// A corpus larger than memory (here a sparse 4 GiB file under a 1 GiB address-space limit): data_error naming
// the directory and its largest file, not std::bad_alloc after reading it byte by byte.
TEST(Corpus, CorpusLargerThanMemoryIsADataErrorNamingItsLargestFile) {
  TempDir dir;
  const std::string big = dir / "big";
  write_file(big, {'x'});
  ASSERT_EQ(truncate(big.c_str(), off_t{4} << 30), 0);  // sparse: no disk used
  write_file(dir / "small", {'y', 'z'});
  GTEST_FLAG_SET(death_test_style, "fast");
  EXPECT_EXIT(run_in_child(
                  [&] {
                    const rlimit limit{rlim_t{1} << 30, rlim_t{1} << 30};
                    if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(6);
                    try {
                      gpt::read_corpus(dir.path());
                      std::_Exit(2);
                    } catch (const gpt::data_error& e) {
                      if (!contains(e.what(), big) || !contains(e.what(), "out of memory")) std::_Exit(3);
                    } catch (const std::bad_alloc&) {
                      std::_Exit(4);
                    }
                  },
                  60),
              ::testing::ExitedWithCode(0), "");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
}
#endif

}  // namespace corpus_test
