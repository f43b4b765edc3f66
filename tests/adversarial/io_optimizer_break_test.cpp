// Adversarial tests of the parts that read user input and files (examples/mlp/idx.hpp, examples/common/
// state_file.hpp, examples/gpt/corpus.hpp, the examples' command lines and state files) and of the optimizers
// (include/remat/nn/). Suites:
//   IoOptimizerDefects: the defects this file found, each stating the expected behaviour (doc comment or
//                       PyTorch's documented semantics); they failed before the fixes of 43db879 (the readers,
//                       nn::Adam) and of ccc5bca (the examples' flags and state settings).
//   IoOptimizerBreak:   behaviour checked against an independent oracle and found correct.
// Oracles are closed forms, hand computations in double and the formats as their doc comments describe them
// (e.g. a CRC-32 computed bit by bit here), never values computed by the code under test.
//
// The examples' binaries (mlp, gpt) are looked up next to this program's build directory
// (<build>/examples/mlp/mlp, <build>/examples/gpt/gpt); the tests that run them are skipped when they were not
// built (cmake --build <build> --target mlp gpt).

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
#include "gpt/corpus.hpp"
#include "mlp/idx.hpp"
#include "mlp/state_file.hpp"
#include "remat/nn/adam.hpp"
#include "remat/nn/adamw.hpp"
#include "remat/nn/clip_grad_norm.hpp"
#include "remat/nn/sgd.hpp"
#include "remat/nn/warmup_cosine_schedule.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace io_optimizer_break_test {

namespace fs = std::filesystem;
using remat::Matrix;
using remat::Parameter;
using remat_test::expect_error_naming;
using Bytes = std::vector<unsigned char>;
using MF = Matrix<float>;
using MD = Matrix<double>;

// ---------------------------------------------------------------- helpers

/// A fresh directory under the system's temporary directory, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "io_optimizer_break.XXXXXX").string();
    std::vector<char> name(pattern.begin(), pattern.end());
    name.push_back('\0');
    if (!mkdtemp(name.data())) throw std::runtime_error("mkdtemp failed");
    path_ = name.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}
Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
/// gzip-compresses `bytes` into `path` (zlib's gzwrite).
void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("gzopen " + path);
  if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size()))
    throw std::runtime_error("gzwrite " + path);
  if (gzclose(f) != Z_OK) throw std::runtime_error("gzclose " + path);
}

void put_be32(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}
void put_le(Bytes& b, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
std::uint64_t get_le(const Bytes& b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{b[at + static_cast<std::size_t>(i)]} << (8 * i);
  return v;
}
std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}

/// An IDX image file: big-endian magic, count, rows, cols, then `pixels` (the header's dimensions as given).
Bytes idx_images(std::uint32_t count, std::uint32_t rows, std::uint32_t cols, const Bytes& pixels,
                 std::uint32_t magic = 2051) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}
Bytes idx_labels(std::uint32_t count, const Bytes& labels, std::uint32_t magic = 2049) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, count);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}
Bytes pattern_bytes(std::size_t n, unsigned seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 37 + seed * 11 + (i >> 3)) & 0xFF);
  return b;
}

/// CRC-32 (ISO 3309 / ITU-T V.42, reflected polynomial 0xEDB88320), bit by bit: the oracle of the state
/// file's checksum and the corpus CRC, independent of zlib's table-driven code.
std::uint32_t crc32_bitwise(const unsigned char* p, std::size_t n) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c ^ 0xFFFFFFFFu;
}

/// Runs `body` in a death-test child, which exits 0 only if body returns; a crash, a sanitizer report, an
/// unexpected exception or the alarm makes it exit otherwise.
template <class Body>
void run_in_child(Body body, unsigned seconds = 20) {
  alarm(seconds);
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(7);
  }
  std::fflush(stdout);
  std::_Exit(0);
}

bool contains(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

/// An example's binary next to this program's build directory, or "" if it was not built.
std::string example_binary(const std::string& name) {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  const fs::path binary = self.parent_path().parent_path() / "examples" / name / name;
  return fs::exists(binary, ec) ? binary.string() : std::string();
}

struct RunResult {
  int code = -1;  ///< the exit status; 128 + n for a signal n (as the shell reports it)
  std::string out, err;
};
/// Runs `binary args` through the shell with a time limit, capturing stdout and stderr.
RunResult run_binary(const TempDir& dir, const std::string& binary, const std::string& args, int seconds = 300) {
  const std::string out = dir / "stdout.txt", err = dir / "stderr.txt";
  const std::string command =
      "timeout " + std::to_string(seconds) + " " + binary + " " + args + " >" + out + " 2>" + err + " </dev/null";
  const int status = std::system(command.c_str());
  RunResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const Bytes o = read_file(out), e = read_file(err);
  r.out.assign(o.begin(), o.end());
  r.err.assign(e.begin(), e.end());
  return r;
}
std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.code) + "\nstderr: " + r.err.substr(0, 2000) +
         "\nstdout (end): " + r.out.substr(r.out.size() > 600 ? r.out.size() - 600 : 0);
}

/// A tiny Fashion-MNIST-shaped data set the MLP example reads: 20 training and 10 test images of 28x28
/// (plain IDX bytes under the .gz names: zlib reads uncompressed files as they are).
void write_mlp_dataset(const std::string& dir, std::uint32_t train = 20, std::uint32_t test = 10) {
  fs::create_directories(dir);
  auto labels = [](std::uint32_t n) {
    Bytes b(n);
    for (std::uint32_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i % 10);
    return b;
  };
  write_file(dir + "/train-images-idx3-ubyte.gz", idx_images(train, 28, 28, pattern_bytes(train * 784u, 1)));
  write_file(dir + "/train-labels-idx1-ubyte.gz", idx_labels(train, labels(train)));
  write_file(dir + "/t10k-images-idx3-ubyte.gz", idx_images(test, 28, 28, pattern_bytes(test * 784u, 2)));
  write_file(dir + "/t10k-labels-idx1-ubyte.gz", idx_labels(test, labels(test)));
}

/// The settings of an MLP state file, in the order examples/mlp/main.cpp's encode_state writes them.
struct MlpState {
  std::uint64_t seed = 42;
  std::uint32_t batch = 4;
  double dropout = 0;
  std::uint64_t train_count = 20;
  std::uint32_t activation = 0;  // relu
  double lr = 1e-3;
  std::uint32_t schedule = 1;  // cosine
  std::uint32_t epochs = 2;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  std::uint64_t steps = 5;
  std::uint64_t shuffle = 12345;
  std::uint32_t history_count = 1;  // as written in the file; history_count records follow only if it is 1
};
/// A complete state file of the MLP "--hidden 8" (784→8→10): the layer count, then value, first and second
/// moment of W0 [784,8], b0 [1,8], W1 [8,10], b1 [1,10], then the history: examples/common/state_file.hpp's
/// layout, built here from its documentation (header: magic, version, payload length, CRC-32).
void write_mlp_state(const std::string& path, const MlpState& s) {
  examples::StateWriter w;
  w.u64(s.seed);
  w.u32(s.batch);
  w.f64(s.dropout);
  w.u64(s.train_count);
  w.u32(s.activation);
  w.f64(s.lr);
  w.u32(s.schedule);
  w.u32(s.epochs);
  w.f64(s.beta1);
  w.f64(s.beta2);
  w.f64(s.epsilon);
  w.u64(s.steps);
  w.u64(s.shuffle);
  w.u32(2);
  const remat::Index shapes[4][2] = {{784, 8}, {1, 8}, {8, 10}, {1, 10}};
  for (const auto& shape : shapes) {
    w.matrix(MF::Constant(shape[0], shape[1], 0.01f));
    w.matrix(MF::Zero(shape[0], shape[1]));
    w.matrix(MF::Constant(shape[0], shape[1], 1e-6f));
  }
  w.u32(s.history_count);
  if (s.history_count == 1)
    for (double v : {2.0, 0.5, 0.5, 1.0}) w.f64(v);
  examples::write_state_file(path, mlp::state_format, w.bytes());
}

/// The settings at the head of a GPT state file, as examples/gpt/main.cpp's encode_state writes them (what
/// decode_settings reads before --estimate returns: the rest of the file is not needed for --estimate).
struct GptSettings {
  std::uint64_t seed = 42;
  std::uint32_t layers = 1, width = 8, heads = 2, seq_len = 8, batch = 2, warmup = 0;
  std::uint64_t steps = 3;
  double dropout = 0, lr = 3e-3;
};
void write_gpt_settings_state(const std::string& path, const GptSettings& s) {
  examples::StateWriter w;
  w.u64(s.seed);
  for (std::uint32_t v : {s.layers, s.width, s.heads, s.seq_len, s.batch, s.warmup}) w.u32(v);
  w.u64(s.steps);
  w.f64(s.dropout);
  w.f64(s.lr);
  const examples::StateFormat gpt_format{{'R', 'E', 'M', 'A', 'T', 'G', 'P', 'T'}, 1, "remat GPT"};
  examples::write_state_file(path, gpt_format, w.bytes());
}

// ================================================================ 1. examples/mlp/idx.hpp

TEST(IoOptimizerBreak, IdxImagesPlainAndGzipDecodeToBytesOver255) {
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

TEST(IoOptimizerBreak, IdxMalformedFilesThrowDataErrorNamingFileAndProblem) {
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
TEST(IoOptimizerBreak, IdxDeclaredSizeIsCheckedAgainstWhatTheFileCanHoldPlainOrGzip) {
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

// DEFECT: the reader opened the path O_RDONLY and accepted every kind of file: a FIFO made open() wait for a
// writer forever (`mlp --data DIR` hung with DIR/train-images-idx3-ubyte.gz a FIFO), and with a writer nothing
// bounded what its header declared. Now anything but a regular file is refused at once, naming it.
TEST(IoOptimizerDefects, IdxFifoOrDeviceIsRefusedWithoutWaitingForAWriter) {
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
TEST(IoOptimizerBreak, IdxGzipMemberFollowedByNonGzipBytesReadsTheMembersDataOnly) {
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
TEST(IoOptimizerDefects, IdxGzipFileCutInsideItsTrailerIsTruncated) {
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
TEST(IoOptimizerBreak, IdxGzipDataSplitAcrossTwoMembersReadsAsOne) {
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

TEST(IoOptimizerBreak, IdxDatasetWithImagesAndLabelsOfDifferentCountsIsRefused) {
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

// DEFECT: examples/mlp/idx.hpp:133 (read_idx_images) allocates count·rows·cols bytes as the header declares
// before reading any pixel. Each dimension passes its own plausibility check (count ≤ 10,000,000, sides ≤ 1024),
// but their product is up to 10^13 bytes: a 16-byte file declaring 10,000,000 images of 1024x1024 makes it
// allocate 10 TB — std::bad_alloc (not data_error; the example then says "out of memory" without naming the file)
// or, under ASan, an allocation-size-too-big abort; a declared 7.8 GB (10^7 images of 28x28) is allocated and
// zero-filled in full. Expected (doc: "Throws data_error for ... implausible dimensions, truncated ... data"):
// data_error naming the file and "truncated", with memory bounded by what the file holds.
// Fix: read the pixels in chunks (e.g. 16 MiB), growing the vector only as data arrives, so a short file
// stops with "truncated" after allocating about its own size (or cap count·rows·cols, e.g. ≤ 2^32 bytes).
TEST(IoOptimizerDefects, IdxHugeDeclaredImageCountOnATinyFileIsTruncatedNotATenTerabyteAllocation) {
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

// ================================================================ 2. examples/common/state_file.hpp

TEST(IoOptimizerBreak, StateFileLayoutIsTheDocumentedOneAndRoundTripsEveryBit) {
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

TEST(IoOptimizerBreak, StateFileDamagedWrongVersionOrOtherModelIsRefusedNamingTheFile) {
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

TEST(IoOptimizerBreak, StateReaderRefusesWrongShapesAndReadsPastTheEndLeavingTheTargetUnchanged) {
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

TEST(IoOptimizerBreak, StateFileWriteFailuresLeaveTheOldFileAndNoTemporaries) {
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

// DEFECT: examples/common/state_file.hpp:204-205 (read_state_file): a read error while reading the file escapes
// as std::ios_base::failure thrown by libstdc++'s basic_filebuf::underflow inside the istreambuf_iterator copy (the
// `in.bad()` check after it never runs), so its message does not name the file: for a directory given as
// `mlp --resume DIR` or `gpt --state DIR` (which exists, so gpt resumes from it) the examples print
// "error: basic_filebuf::underflow error reading the file: Is a directory". (An I/O error on a real file
// — EIO — takes the same path.) Expected (doc: "Throws state_error describing the first problem found";
// state_error: "what() is one line naming the file"): state_error naming the path (e.g. "not a regular file" or
// "read error: Is a directory"). Fix: reject !std::filesystem::is_regular_file(path) up front, and wrap the read in
// try { ... } catch (const std::ios_base::failure& e) { throw state_error(path, std::string("read error: ") +
// e.what()); } (or read with in.read() of the size found by seekg/tellg and test in.fail()).
TEST(IoOptimizerDefects, StateFileThatIsADirectoryIsAStateErrorNamingIt) {
  TempDir dir;
  const std::string directory = dir / "a_directory";
  fs::create_directory(directory);
  expect_error_naming<examples::state_error>([&] { mlp::read_state_file(directory); }, {directory});
}

// DEFECT (a review of the fix above): read_state_file opened the path O_RDONLY, which for a FIFO waits for a
// writer, so `--resume FIFO` hung before the regular-file check could refuse it. Expected: state_error naming
// the path, at once (the child has 10 s).
TEST(IoOptimizerDefects, StateFileThatIsAFifoIsRefusedWithoutWaitingForAWriter) {
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

// DEFECT: examples/common/state_file.hpp:204 (read_state_file) reads the whole file into memory before looking
// at its header: a file that is not a state file at all but large (a wrong --resume path: a disk image, a
// sparse file, /dev/zero) is read in full — gigabytes allocated, minutes spent, or std::bad_alloc / an ASan
// out-of-memory abort — before "bad magic number" could be said (for /dev/zero it never ends). Expected
// (doc: "Throws state_error describing the first problem found"): state_error "not a remat MLP state file (bad
// magic number)" after reading the 24-byte header. Fix: read the header first (magic, version, length), compare
// the length with the file's size (fstat / seekg), and only then read exactly `length` payload bytes.
// The test gives a 1 TiB sparse file (no disk used) and a 10 s limit.
TEST(IoOptimizerDefects, StateFileThatIsAHugeNonStateFileIsRefusedFromItsHeaderNotReadInFull) {
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

// ================================================================ 3. examples/gpt/corpus.hpp

TEST(IoOptimizerBreak, CorpusReadsRegularFilesSortedSkipsTheRestAndKeepsEveryByteValue) {
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

TEST(IoOptimizerBreak, CorpusEmptyMissingOrNotADirectoryIsADataErrorNamingIt) {
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

TEST(IoOptimizerBreak, CorpusSplitIsEveryTwentiethBlockAndRefusesACorpusWithoutAWindowInEachSplit) {
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

// DEFECT: examples/gpt/corpus.hpp:106/123 (split) and :136 (Windows) compute seq_len + 1 in std::size_t, which wraps
// to 0 for seq_len = SIZE_MAX (what examples/gpt/main.cpp:335 passes for a state file's seq_len 0xFFFFFFFF read
// into an int as -1): split accepts any corpus ("longest < 0" is never true) and Windows counts
// r.length − SIZE_MAX = r.length + 1 windows per run, each reaching 2^64 bytes past the corpus (fill would read
// out of bounds). Expected (doc: "Throws data_error unless each split holds at least one window of S + 1 bytes"):
// data_error naming the directory; Windows(runs, S) with no run of S + 1 bytes counts 0 windows.
// Fix: compare `run.length > seq_len` (and `r.length > seq_len_` in Windows) instead of `>= seq_len + 1`, and
// compute the block as seq_len < 1024 ? 1024 : seq_len + 1 after rejecting seq_len == SIZE_MAX.
TEST(IoOptimizerDefects, CorpusSplitWithASequenceLengthWhoseSuccessorWrapsIsRefused) {
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

// ================================================================ 4. include/remat/nn/

// DEFECT: include/remat/nn/adam.hpp:119-125 — nn::Adam's constructor never calls reject_duplicates(), unlike nn::AdamW
// and nn::SGD (optimizer.hpp:103: "Throws domain_error if a parameter was given twice (it would be updated twice
// per step)"; clip_grad_norm.hpp: "the optimizers refuse it too"). Adam({&p, &p}) is accepted and each step()
// updates p twice with two different moment pairs: a silently wrong result (the step is about 2α, not α).
// Expected: domain_error naming nn::Adam, both indices and "same parameter", as AdamW. torch.optim rejects a
// parameter in two groups (ValueError) and warns for one repeated within a group.
// Fix: `this->reject_duplicates();` after the loop in Adam's constructor.
TEST(IoOptimizerDefects, AdamRejectsAParameterGivenTwiceAsAdamWAndSGDDo) {
  Parameter<double> p(MD::Constant(1, 1, 1.0)), q(MD::Constant(1, 1, 2.0));
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::Adam<double> adam({&p, &q, &p});
      },
      {"nn::Adam", "0", "2", "same parameter"});
  // What the accepted optimizer does: one step with g = 1 moves p by about 2α (each copy by α·g/(|g|+ε)).
  remat::nn::Adam<double>::Options o;
  o.learning_rate = 0.1;
  try {
    remat::nn::Adam<double> adam({&p, &p}, o);
    p.mutable_grad() = MD::Constant(1, 1, 1.0);
    adam.step();
    EXPECT_NEAR(p.value()(0, 0), 1.0 - 0.1 * 1 / (1 + 1e-8), 1e-12) << "p was updated twice in one step";
  } catch (const remat::domain_error&) {
  }
}

// DEFECT: include/remat/nn/adam.hpp:121-124 and :135 format the offending values with std::to_string ("%f", six
// decimals), so the message of nn::Adam's constructor and set_learning_rate does not name the values: epsilon
// 1e-8 (the default) prints as "0.000000", a negative epsilon -1e-12 as "-0.000000", learning_rate -1e-9 as
// "-0.000000" — e.g. `mlp --lr nan` says "got nan, 0.900000, 0.999000, 0.000000", as if epsilon were the zero
// that is wrong. The project's standard (tests/support/expect_error.hpp) and its siblings nn::AdamW, nn::SGD,
// nn::WarmupCosineSchedule use detail::number_text ("1e-08") and name each value. Expected: the exact values,
// each with its name. Fix: detail::number_text and "learning_rate X, beta1 X, ..." as in adamw.hpp.
TEST(IoOptimizerDefects, AdamErrorMessagesNameTheOffendingValuesExactly) {
  Parameter<float> p(MF::Ones(1, 1));
  remat::nn::Adam<float>::Options o;
  o.epsilon = -1e-12;
  expect_error_naming<remat::domain_error>([&] { remat::nn::Adam<float>({&p}, o); }, {"nn::Adam", "epsilon", "-1e-12"});
  o = {};
  o.learning_rate = std::nan("");
  expect_error_naming<remat::domain_error>([&] { remat::nn::Adam<float>({&p}, o); },
                                           {"nn::Adam", "learning_rate nan", "epsilon 1e-08"});
  remat::nn::Adam<float> adam({&p});
  expect_error_naming<remat::domain_error>([&] { adam.set_learning_rate(-1e-9); }, {"nn::Adam", "-1e-09"});
  EXPECT_EQ(adam.options().learning_rate, 1e-3);
}

// DEFECT: include/remat/nn/adam.hpp:120 and :134 accept learning_rate = +inf and epsilon = +inf (the tests are
// "> 0"), which nn::AdamW (adamw.hpp:69: "0 ≤ α < ∞ ... 0 < ε < ∞"), nn::SGD and nn::WarmupCosineSchedule refuse.
// With α = inf a parameter whose gradient is 0 becomes NaN (inf · 0) and every other one ±inf after one step; with
// ε = inf nothing ever moves: silent. Expected: domain_error naming nn::Adam and the value, parameters unchanged,
// as AdamW. (torch.optim.Adam checks only 0 <= lr and 0 <= eps, so it would accept inf too; AdamW here is
// stricter, and Adam should agree with it — they share adam_update.) Fix: add std::isfinite to both checks.
TEST(IoOptimizerDefects, AdamRefusesAnInfiniteLearningRateOrEpsilonAsAdamWDoes) {
  const double inf = std::numeric_limits<double>::infinity();
  Parameter<float> p(MF::Ones(1, 2));
  remat::nn::AdamW<float>::Options w;
  w.learning_rate = inf;
  EXPECT_THROW(remat::nn::AdamW<float>({&p}, w), remat::domain_error);  // the sibling's documented behaviour
  remat::nn::Adam<float>::Options o;
  o.learning_rate = inf;
  EXPECT_THROW(remat::nn::Adam<float>({&p}, o), remat::domain_error) << "learning_rate inf accepted";
  o = {};
  o.epsilon = inf;
  EXPECT_THROW(remat::nn::Adam<float>({&p}, o), remat::domain_error) << "epsilon inf accepted";
  remat::nn::Adam<float> adam({&p});
  EXPECT_THROW(adam.set_learning_rate(inf), remat::domain_error) << "set_learning_rate(inf) accepted";
  // What an accepted α = inf does: a zero gradient makes the parameter NaN.
  try {
    adam.set_learning_rate(inf);
    MF g(1, 2);
    g << 0.0f, 1.0f;
    p.mutable_grad() = g;
    adam.step();
    EXPECT_FALSE(std::isnan(p.value()(0, 0))) << "a parameter with gradient 0 became NaN";
  } catch (const remat::domain_error&) {
  }
}

TEST(IoOptimizerBreak, AdamAndAdamWRefuseInvalidHyperparametersWithDomainError) {
  Parameter<float> p(MF::Ones(2, 2));
  const double nan = std::nan("");
  for (const auto& bad : std::vector<std::vector<double>>{{0, 0.9, 0.999, 1e-8},
                                                          {-1e-3, 0.9, 0.999, 1e-8},
                                                          {nan, 0.9, 0.999, 1e-8},
                                                          {1e-3, 1.0, 0.999, 1e-8},
                                                          {1e-3, -0.1, 0.999, 1e-8},
                                                          {1e-3, 0.9, 1.0, 1e-8},
                                                          {1e-3, 0.9, nan, 1e-8},
                                                          {1e-3, 0.9, 0.999, 0},
                                                          {1e-3, 0.9, 0.999, -1e-8},
                                                          {1e-3, 0.9, 0.999, nan}}) {
    remat::nn::Adam<float>::Options o{bad[0], bad[1], bad[2], bad[3]};
    EXPECT_THROW(remat::nn::Adam<float>({&p}, o), remat::domain_error);
  }
  for (const auto& bad : std::vector<std::vector<double>>{{-1e-3, 0.9, 0.999, 1e-8, 0.01},
                                                          {1e-3, 1.0, 0.999, 1e-8, 0.01},
                                                          {1e-3, 0.9, -0.5, 1e-8, 0.01},
                                                          {1e-3, 0.9, 0.999, 0, 0.01},
                                                          {1e-3, 0.9, 0.999, 1e-8, -0.01},
                                                          {1e-3, 0.9, 0.999, 1e-8, nan}}) {
    remat::nn::AdamW<float>::Options o{bad[0], bad[1], bad[2], bad[3], bad[4]};
    expect_error_naming<remat::domain_error>([&] { remat::nn::AdamW<float>({&p}, o); }, {"nn::AdamW"});
  }
  remat::nn::Adam<float> adam({&p});
  EXPECT_THROW(adam.set_learning_rate(0), remat::domain_error);
  EXPECT_THROW(adam.set_learning_rate(nan), remat::domain_error);
  EXPECT_EQ(adam.options().learning_rate, 1e-3);
  EXPECT_EQ(p.value(), MF::Ones(2, 2));
}

// Adam's first step moves every element by α·g/(|g| + ε) whatever β₁, β₂ (the bias corrections cancel
// (1 − β)): PyTorch's formula with m₁ = (1−β₁)g, v₁ = (1−β₂)g², hand-evaluated in double. A second step with
// β₁ = β₂ = 0 is again α·g/(|g| + ε) (m = g, v = g², corrections 1 − 0ᵗ = 1).
TEST(IoOptimizerBreak, AdamFirstStepIsLearningRateTimesSignAndZeroBetasKeepNoHistory) {
  for (const std::vector<double>& betas : std::vector<std::vector<double>>{{0.5, 0.25}, {0.9, 0.999}, {0.0, 0.0}}) {
    MD theta0(1, 4);
    theta0 << 1.0, -2.0, 0.5, 3.0;
    MD g(1, 4);
    g << 3.0, -2.0, 1e-3, 0.0;
    Parameter<double> p(theta0);
    remat::nn::Adam<double>::Options o;
    o.learning_rate = 0.1;
    o.beta1 = betas[0];
    o.beta2 = betas[1];
    remat::nn::Adam<double> adam({&p}, o);
    p.mutable_grad() = g;
    adam.step();
    for (int j = 0; j < 4; ++j)
      EXPECT_NEAR(p.value()(0, j), theta0(0, j) - 0.1 * g(0, j) / (std::abs(g(0, j)) + 1e-8), 1e-12);
    if (betas[0] == 0 && betas[1] == 0) {
      MD g2(1, 4);
      g2 << -1.0, 5.0, 2.0, 0.0;
      const MD theta1 = p.value();
      p.mutable_grad() = g2;
      adam.step();
      for (int j = 0; j < 4; ++j)
        EXPECT_NEAR(p.value()(0, j), theta1(0, j) - 0.1 * g2(0, j) / (std::abs(g2(0, j)) + 1e-8), 1e-12);
    }
  }
}

// torch.optim.AdamW: θ ← θ·(1 − αλ) before the Adam update; with zero gradients the update is 0, so after t steps
// θ = θ₀·(1 − αλ)ᵗ exactly (closed form, in double). The decay follows set_learning_rate, a group with λ = 0 does
// not decay, and nn::Adam (no decay) leaves θ bitwise unchanged under zero gradients.
TEST(IoOptimizerBreak, AdamWDecaysDecoupledFromTheGradientByLearningRateTimesLambda) {
  MD theta0(2, 2);
  theta0 << 1.0, -2.0, 4.0, 0.25;
  Parameter<double> decayed(theta0), undecayed(theta0), plain(theta0);
  remat::nn::AdamW<double>::Options o;
  o.learning_rate = 0.05;
  o.weight_decay = 0.2;
  remat::nn::AdamW<double> adamw({{{&decayed}}, {{&undecayed}, 0.0}}, o);
  remat::nn::Adam<double> adam({&plain});
  for (int t = 1; t <= 5; ++t) {
    decayed.mutable_grad() = MD::Zero(2, 2);
    undecayed.mutable_grad() = MD::Zero(2, 2);
    plain.mutable_grad() = MD::Zero(2, 2);
    adamw.step();
    adam.step();
  }
  const double factor = std::pow(1 - 0.05 * 0.2, 5);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(decayed.value().data()[i], theta0.data()[i] * factor, 1e-14);
  EXPECT_EQ(undecayed.value(), theta0);
  EXPECT_EQ(plain.value(), theta0);
  // α changed: the next decay is by 1 − α'λ.
  adamw.set_learning_rate(0.5);
  const MD before = decayed.value();
  decayed.mutable_grad() = MD::Zero(2, 2);
  adamw.step();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(decayed.value().data()[i], before.data()[i] * (1 - 0.5 * 0.2), 1e-14);
  // α = 0 (allowed for AdamW): nothing moves, bitwise.
  adamw.set_learning_rate(0);
  const MD frozen = decayed.value();
  decayed.mutable_grad() = MD::Constant(2, 2, 3.0);
  adamw.step();
  EXPECT_EQ(decayed.value(), frozen);
}

// step() before any backward: no parameter has a gradient, so nothing changes (values and moments), while the
// step still counts (optimizer.hpp: "A parameter without a gradient ... is left unchanged (its state too) ... the
// step still counts in step_count()"). The same for an optimizer of no parameters.
TEST(IoOptimizerBreak, StepBeforeAnyBackwardChangesNothingButCounts) {
  Parameter<float> a(MF::Constant(2, 3, 0.5f)), b(MF::Constant(1, 3, -1.0f));
  remat::nn::Adam<float> adam({&a, &b});
  remat::nn::AdamW<float> adamw({&a, &b});
  remat::nn::SGD<float> sgd({&a, &b}, {0.1, 0.9, 0.1, true});
  adam.step();
  adamw.step();
  sgd.step();
  EXPECT_EQ(a.value(), MF::Constant(2, 3, 0.5f));
  EXPECT_EQ(b.value(), MF::Constant(1, 3, -1.0f));
  EXPECT_EQ(adam.first_moment(0), MF::Zero(2, 3));
  EXPECT_EQ(adamw.second_moment(1), MF::Zero(1, 3));
  EXPECT_EQ(sgd.momentum_buffer(0), MF::Zero(2, 3));
  EXPECT_EQ(adam.step_count(), 1u);
  EXPECT_EQ(sgd.step_count(), 1u);
  remat::nn::Adam<float> none(std::vector<Parameter<float>*>{});
  none.step();
  EXPECT_EQ(none.step_count(), 1u);
  expect_error_naming<remat::domain_error>([] { remat::nn::Adam<float>({nullptr}); }, {"nn::Adam", "null"});
}

// torch.optim.SGD (dampening 0): d = g + λθ; b = d at the first step, else μb + d; d = nesterov ? d + μb : b;
// θ ← θ − αd. Three steps hand-evaluated in double for plain, heavy-ball and Nesterov momentum.
TEST(IoOptimizerBreak, SGDMomentumAndNesterovFollowPyTorchsFormulaOverThreeSteps) {
  const double alpha = 0.1, mu = 0.9, lambda = 0.05;
  const double grads[3][2] = {{1.0, -2.0}, {0.5, 0.25}, {-3.0, 1.0}};
  for (int variant = 0; variant < 3; ++variant) {
    const bool momentum = variant > 0, nesterov = variant == 2;
    MD theta0(1, 2);
    theta0 << 2.0, -1.0;
    Parameter<double> p(theta0);
    remat::nn::SGD<double> sgd({&p}, {alpha, momentum ? mu : 0.0, lambda, nesterov});
    double theta[2] = {2.0, -1.0}, buffer[2] = {0, 0};
    for (int t = 0; t < 3; ++t) {
      MD g(1, 2);
      g << grads[t][0], grads[t][1];
      p.mutable_grad() = g;
      sgd.step();
      for (int j = 0; j < 2; ++j) {
        double d = grads[t][j] + lambda * theta[j];
        if (momentum) {
          buffer[j] = t == 0 ? d : mu * buffer[j] + d;
          d = nesterov ? d + mu * buffer[j] : buffer[j];
        }
        theta[j] -= alpha * d;
        EXPECT_NEAR(p.value()(0, j), theta[j], 1e-14) << "variant " << variant << " step " << t;
      }
    }
  }
  Parameter<float> q(MF::Ones(1, 1));
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::SGD<float>({&q}, {0.1, 0.0, 0.0, true});
      },
      {"nn::SGD", "nesterov"});
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::SGD<float>({&q}, {-0.1, 0.0, 0.0, false});
      },
      {"nn::SGD", "learning_rate -0.1"});
}

// torch.nn.utils.clip_grad_norm_: N = √Σg², scaled by c = max_norm/(N + 1e-6) when c < 1.
TEST(IoOptimizerBreak, ClipGradNormScalesByTorchsFactorAndHandlesZeroInfAndNaN) {
  Parameter<float> p(MF::Zero(1, 2)), q(MF::Zero(1, 2)), none(MF::Zero(1, 1));
  MF gp(1, 2), gq(1, 2);
  gp << 3.0f, 4.0f;
  gq << 0.0f, 12.0f;
  p.mutable_grad() = gp;
  q.mutable_grad() = gq;
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p, &q, &none}, 6.5), 13.0);
  const float c = static_cast<float>(6.5 / (13.0 + 1e-6));
  EXPECT_EQ(p.grad()(0, 0), 3.0f * c);
  EXPECT_EQ(p.grad()(0, 1), 4.0f * c);
  EXPECT_EQ(q.grad()(0, 1), 12.0f * c);
  EXPECT_FALSE(none.has_grad());  // skipped, not created
  // Below the bound: unchanged. All zero: norm 0, unchanged.
  p.mutable_grad() = gp;
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, 5.1), 5.0);
  EXPECT_EQ(MF(p.grad()), gp);
  p.mutable_grad() = MF::Zero(1, 2);
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, 1.0), 0.0);
  EXPECT_EQ(MF(p.grad()), MF::Zero(1, 2));
  // An infinite gradient: N = inf, unchanged (or domain_error with error_if_nonfinite).
  MF ginf = gp;
  ginf(0, 1) = std::numeric_limits<float>::infinity();
  p.mutable_grad() = ginf;
  EXPECT_TRUE(std::isinf(remat::nn::clip_grad_norm<float>({&p}, 1.0)));
  EXPECT_EQ(MF(p.grad()), ginf);
  expect_error_naming<remat::domain_error>([&] { remat::nn::clip_grad_norm<float>({&p}, 1.0, true); },
                                           {"clip_grad_norm", "inf"});
  // Float gradients whose float squared norm would overflow (1e20² > FLT_MAX) are measured in double.
  p.mutable_grad() = MF::Constant(1, 2, 1e20f);
  EXPECT_NEAR(remat::nn::clip_grad_norm<float>({&p}, 1.0), std::sqrt(2.0) * static_cast<double>(1e20f), 1e6);
  EXPECT_NEAR(MF(p.grad()).norm(), 1.0, 1e-6);
  for (const double bad : {-1.0, std::nan("")})
    expect_error_naming<remat::domain_error>([&] { remat::nn::clip_grad_norm<float>({&p}, bad); },
                                             {"clip_grad_norm", "max_norm"});
}

// The schedule's closed form (warmup_cosine_schedule.hpp), evaluated independently.
TEST(IoOptimizerBreak, WarmupCosineScheduleMatchesItsClosedFormAndRefusesBadStepCounts) {
  const double pi = std::acos(-1.0);
  const remat::nn::WarmupCosineSchedule s(1.0, 10, 110, 0.1);
  for (std::uint64_t t : {0, 1, 5, 9}) EXPECT_DOUBLE_EQ(s.at(t), (t + 1) / 10.0);
  for (std::uint64_t t : {10, 11, 35, 60, 100, 109})
    EXPECT_NEAR(s.at(t), 0.1 + 0.45 * (1 + std::cos(pi * (t - 10.0) / 100.0)), 1e-14);
  EXPECT_NEAR(s.at(60), 0.55, 1e-14);
  for (std::uint64_t t : {std::uint64_t{110}, std::uint64_t{1} << 40, std::numeric_limits<std::uint64_t>::max()})
    EXPECT_EQ(s.at(t), 0.1);
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 20, 10); },
                                           {"WarmupCosineSchedule", "warmup_steps 20", "total_steps 10"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, 0); }, {"total_steps 0"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, -5); }, {"total_steps -5"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, 5, 2.0); }, {"min_lr 2"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1.0, 0, 5, -1e-9); },
                                           {"min_lr -1e-09"});
  expect_error_naming<remat::domain_error>(
      [] { remat::nn::WarmupCosineSchedule(std::numeric_limits<double>::infinity(), 0, 5); }, {"peak_lr inf"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(-1.0, 0, 5); }, {"peak_lr -1"});
}

// ================================================================ 5. the examples' command lines and state files

TEST(IoOptimizerBreak, MlpRefusesOutOfRangeFlagsWithExitCode2AndResumesAHandBuiltStateFile) {
  const std::string mlp_binary = example_binary("mlp");
  if (mlp_binary.empty()) GTEST_SKIP() << "examples/mlp/mlp not built (cmake --build <build> --target mlp)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string base = "--data " + data + " --hidden 8 --batch 4 --epochs 1 ";
  for (const std::string& bad : std::vector<std::string>{
           "--epochs -1", "--batch 0", "--batch -3", "--threads -1", "--threads 1000", "--checkpoint everything",
           "--hidden 0", "--limit -1", "--eval-batch 0", "--lr 0", "--lr -1", "--dropout 1", "--dropout -0.1",
           "--activation swish", "--schedule linear", "--epochs abc"}) {
    const RunResult r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 " + bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, bad.substr(0, bad.find(' ')))) << bad << "\n" << describe(r);
  }
  // A batch larger than the data set is one batch of every image; 0 epochs only evaluates.
  RunResult r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --batch 1000 --epochs 1");
  EXPECT_EQ(r.code, 0) << describe(r);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --epochs 0");
  EXPECT_EQ(r.code, 0) << describe(r);
  // The hand-built state file (the format as documented) resumes: the builder of the defect tests is right.
  const std::string state = dir / "ok.state";
  write_mlp_state(state, MlpState{});
  r = run_binary(dir, mlp_binary, base.substr(0, base.find("--epochs")) + "--resume " + state);
  EXPECT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "resumed from " + state + " after epoch 1 (step 5)")) << describe(r);
  // A state file of another network, another data set or an unknown activation: exit 2 naming the file.
  MlpState other;
  other.train_count = 21;
  write_mlp_state(state, other);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --resume " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "21 images")) << describe(r);
  other = {};
  other.activation = 7;
  write_mlp_state(state, other);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --resume " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "activation id 7")) << describe(r);
  write_mlp_state(state, MlpState{});
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 16 --resume " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "check --hidden")) << describe(r);
}

// DEFECT: --dropout nan (examples/mlp/main.cpp:516, CLI::Range(0.0, 0.99)) and --temperature nan
// (examples/gpt/main.cpp:587, CLI::Range(0.0, 100.0)) pass: CLI11's Range tests `v < min || v > max`, which is
// false for NaN. The MLP then trains with "dropout nan" (its mask test p > 0 is false, so no dropout at all) and
// its --json prints "dropout":nan, which is not JSON; the GPT samples with softmax(logits / nan): every byte is
// the same (the last, 0xFF) and exit 0. Expected: exit 2 with a usage error naming the flag, as for
// --dropout 1. (gpt --dropout nan is refused later, by gpt::Model.) Fix: add a check that rejects non-finite
// values, e.g. ->check(CLI::Validator([](std::string& s) { return std::isfinite(std::stod(s)) ? "" : "not a
// number"; }, "FINITE")) before the Range, for every floating-point flag of both examples.
TEST(IoOptimizerDefects, ExamplesRefuseNaNForFloatingPointFlags) {
  const std::string mlp_binary = example_binary("mlp"), gpt_binary = example_binary("gpt");
  if (mlp_binary.empty() || gpt_binary.empty())
    GTEST_SKIP() << "examples not built (cmake --build <build> --target mlp gpt)";
  TempDir dir;
  RunResult r = run_binary(dir, mlp_binary, "--estimate --hidden 8 --batch 4 --dropout nan");
  EXPECT_EQ(r.code, 2) << "mlp --dropout nan\n" << describe(r);
  EXPECT_TRUE(contains(r.err, "--dropout")) << describe(r);
  r = run_binary(dir, gpt_binary, "--estimate --layers 1 --width 8 --heads 2 --seq-len 8 --batch 2 --temperature nan");
  EXPECT_EQ(r.code, 2) << "gpt --temperature nan\n" << describe(r);
  EXPECT_TRUE(contains(r.err, "--temperature")) << describe(r);
}

// DEFECT: examples/mlp/main.cpp:179-258 (decode_state) takes the batch size, dropout and epochs of a state file
// as they are, without the checks the flags get (--batch 1..2^20, --dropout 0..0.99): a file with a valid
// checksum whose batch is 0 (a file of another program version, a hand-edited or fuzzed one) makes
// main.cpp:356 divide by zero (SIGFPE; UBSan "division by zero"); a batch of 0xFFFFFFFF becomes the int -1 and
// Eigen aborts on Matrix(-1, 784); a dropout of 5 fails later as "dropout: p must be in [0, 1), got 5.000000"
// without naming the file. And main.cpp:247 allocates `r.u32()` history records (32 bytes each) before checking
// that the payload holds them: a count of 0xFFFFFFFF is a 137 GB allocation (std::bad_alloc → "out of memory",
// or an ASan out-of-memory abort). Expected (state_file.hpp: "validated completely when read"; state_error:
// "does not fit the model ... what() is one line naming the file"): exit 2 with a state_error naming the file
// and the field. Fix: in decode_state, throw state_error unless 1 ≤ batch ≤ 2^20, 0 ≤ dropout ≤ 0.99 (finite) and
// epochs ≤ 100000, as the flags' ranges; read the history count and check count·32 ≤ bytes left (a
// StateReader::need-like check, e.g. a public `remaining()`) before allocating.
TEST(IoOptimizerDefects, MlpStateFileWithAZeroBatchOrAHugeHistoryCountIsAStateErrorNotACrash) {
  const std::string mlp_binary = example_binary("mlp");
  if (mlp_binary.empty()) GTEST_SKIP() << "examples/mlp/mlp not built (cmake --build <build> --target mlp)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string state = dir / "bad.state";
  struct Case {
    const char* what;
    MlpState s;
    const char* word;
  };
  std::vector<Case> cases;
  MlpState s;
  s.batch = 0;
  cases.push_back({"batch 0", s, "batch"});
  s = {};
  s.batch = 0xFFFFFFFFu;
  cases.push_back({"batch 0xFFFFFFFF", s, "batch"});
  s = {};
  s.dropout = 5;
  cases.push_back({"dropout 5", s, "dropout"});
  s = {};
  s.dropout = 0.9900001;  // just above the flag's 0.99: the message must not round it onto the bound
  cases.push_back({"dropout 0.9900001", s, "--dropout 0.9900001"});
  s = {};
  s.history_count = 0xFFFFFFFFu;
  cases.push_back({"history count 0xFFFFFFFF", s, ""});  // any message that names the file
  for (const Case& c : cases) {
    write_mlp_state(state, c.s);
    const RunResult r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --resume " + state);
    EXPECT_EQ(r.code, 2) << c.what << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, state) && contains(r.err, c.word)) << c.what << "\n" << describe(r);
  }
}

// DEFECT: examples/gpt/main.cpp:136-164 (decode_settings, the loop at :155) takes --layers, --width, --heads,
// --seq-len, --batch and
// --warmup from a state file without the flags' range checks, and main.cpp:323 then computes o.width % o.heads:
// a file (valid checksum) with heads 0 divides by zero (SIGFPE; UBSan "division by zero") — even with
// --estimate, which reads nothing else. Other bad values are caught later by messages that blame a flag the
// user did not give and do not name the file ("--batch 0 is smaller than the 1 ranks", "gpt::Model: ... S = -1").
// Expected (state_file.hpp: "validated completely"; state_error names the file): exit 2 with a message naming the
// file and "heads". Fix: after reading each u32, throw state_error naming the file unless it is in the flag's
// range (layers 1..1024, width/heads/seq_len 1..65536, batch 1..2^20, warmup 0..2^30, steps 1..2^30).
TEST(IoOptimizerDefects, GptStateFileWithZeroHeadsIsAStateErrorNotADivisionByZero) {
  const std::string gpt_binary = example_binary("gpt");
  if (gpt_binary.empty()) GTEST_SKIP() << "examples/gpt/gpt not built (cmake --build <build> --target gpt)";
  TempDir dir;
  const std::string state = dir / "g.state";
  write_gpt_settings_state(state, GptSettings{});
  RunResult r = run_binary(dir, gpt_binary, "--estimate --state " + state);  // the control: settings applied
  ASSERT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "L=1 H=8 heads=2 S=8")) << describe(r);
  GptSettings bad;
  bad.heads = 0;
  write_gpt_settings_state(state, bad);
  r = run_binary(dir, gpt_binary, "--estimate --state " + state);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, state) && contains(r.err, "heads")) << describe(r);
}

// DEFECT: read_corpus read each file through an std::istreambuf_iterator, and libstdc++'s filebuf throws
// std::ios_base::failure on a read error ("basic_filebuf::underflow error reading the file: Invalid argument"),
// which escaped naming no file; an allocation failure escaped as std::bad_alloc. A directory whose regular
// files fail to read (sysfs: a loopback device's speed is EINVAL) must give data_error naming the file.
TEST(IoOptimizerDefects, CorpusFileWithAReadErrorIsADataErrorNamingTheFile) {
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
TEST(IoOptimizerDefects, CorpusLargerThanMemoryIsADataErrorNamingItsLargestFile) {
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

// DEFECT: the MLP example never checked that training stayed finite (the GPT example does): with --lr 1e308 it
// exited 0 and its --json printed "loss":-nan, which is not JSON. Now a learning rate that diverges (1e20)
// stops it after the epoch, as the GPT example does, naming --lr; 1e308 is refused by nn::Adam<float> before
// training; and a sane run's JSON has no NaN.
TEST(IoOptimizerDefects, MlpDivergedTrainingIsAnErrorNamingTheLearningRate) {
  const std::string mlp_binary = example_binary("mlp");
  if (mlp_binary.empty()) GTEST_SKIP() << "examples/mlp/mlp not built (cmake --build <build> --target mlp)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string flags = "--data " + data + " --hidden 8 --batch 4 --epochs 2 --threads 1 --json --lr ";
  RunResult r = run_binary(dir, mlp_binary, flags + "1e20");
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "diverged in epoch 1") && contains(r.err, "--lr")) << describe(r);
  r = run_binary(dir, mlp_binary, flags + "1e308");  // Adam's first step would be inf in float: refused
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "nn::Adam: learning_rate 1e+308") && contains(r.err, "float")) << describe(r);
  r = run_binary(dir, mlp_binary, flags + "1e-3");
  EXPECT_EQ(r.code, 0) << describe(r);
  EXPECT_FALSE(contains(r.out, "nan")) << describe(r);
}

// DEFECT: CLI11 2.1.2 converts integers with base 0 and narrows unsigned ones silently: `--epochs 0x10` trained 16
// epochs, `--batch 010` was 8 (octal), `--seed -1` and `--seed 18446744073709551616` became 2^64 − 1, and
// `--hidden 8,,8` was read as two layers. Integer flags now take decimal digits only ("010" is 10), in range.
TEST(IoOptimizerDefects, ExamplesReadIntegerFlagsAsDecimalAndRefuseTheRest) {
  const std::string mlp_binary = example_binary("mlp"), gpt_binary = example_binary("gpt");
  if (mlp_binary.empty() || gpt_binary.empty())
    GTEST_SKIP() << "examples not built (cmake --build <build> --target mlp gpt)";
  TempDir dir;
  for (const std::string bad :
       {"--seed -1", "--seed 18446744073709551616", "--seed -18446744073709551615", "--seed 1e3", "--epochs 0x10",
        "--eval-batch 0x8", "--batch +4", "--hidden 8,,8", "--hidden 8,", "--hidden ,8", "--hidden 0x8"}) {
    const RunResult r = run_binary(dir, mlp_binary, "--estimate " + bad);
    EXPECT_EQ(r.code, 2) << "mlp " << bad << "\n" << describe(r);
    EXPECT_TRUE(contains(r.err, bad.substr(0, bad.find(' ')))) << "mlp " << bad << "\n" << describe(r);
  }
  RunResult r = run_binary(dir, mlp_binary, "--estimate --json --batch 010 --hidden 016,8");
  ASSERT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "\"batch\":10")) << describe(r);
  EXPECT_TRUE(contains(r.out, "784→16→8→10")) << describe(r);
  const std::string gpt_flags = "--estimate --layers 1 --width 8 --seq-len 8 --warmup 0 ";
  for (const std::string bad : {"--seed -1", "--seed 18446744073709551616", "--steps 0x10", "--heads 02x"}) {
    const RunResult g =
        run_binary(dir, gpt_binary, gpt_flags + (bad.rfind("--heads", 0) == 0 ? "" : "--heads 2 ") + bad);
    EXPECT_EQ(g.code, 2) << "gpt " << bad << "\n" << describe(g);
    EXPECT_TRUE(contains(g.err, bad.substr(0, bad.find(' ')))) << "gpt " << bad << "\n" << describe(g);
  }
  r = run_binary(dir, gpt_binary, gpt_flags + "--heads 02");
  EXPECT_EQ(r.code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "heads=2")) << describe(r);
}

// DEFECT (late failure): `mlp --save /missing/dir/state` trained a whole epoch and only then failed ("cannot
// create a temporary file next to it"); `gpt --state` the same after --save-every steps. Both now fail before
// training, naming the path: the check makes and removes the temporary file the write would make.
TEST(IoOptimizerDefects, SaveIntoAMissingDirectoryFailsBeforeTraining) {
  const std::string mlp_binary = example_binary("mlp"), gpt_binary = example_binary("gpt");
  if (mlp_binary.empty() || gpt_binary.empty())
    GTEST_SKIP() << "examples not built (cmake --build <build> --target mlp gpt)";
  TempDir dir;
  const std::string data = dir / "data";
  write_mlp_dataset(data);
  const std::string save = dir / "absent/state";
  RunResult r =
      run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --batch 4 --epochs 1 --threads 1 --save " + save);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, save) && contains(r.err, "cannot create a temporary file next to it")) << describe(r);
  EXPECT_FALSE(contains(r.out, "epoch  1/1")) << "an epoch was trained first\n" << describe(r);
  // A name that fits the file system's 255 bytes but not with ".tmp.XXXXXX" added (a helper's case).
  const std::string long_name = dir / std::string(250, 'a');
  r = run_binary(dir, mlp_binary,
                 "--data " + data + " --hidden 8 --batch 4 --epochs 1 --threads 1 --save " + long_name);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "File name too long")) << describe(r);
  EXPECT_FALSE(contains(r.out, "epoch  1/1")) << "an epoch was trained first\n" << describe(r);
  r = run_binary(dir, mlp_binary, "--data " + data + " --hidden 8 --batch 4 --epochs 1 --threads 1 --save " + data);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "it is a directory")) << describe(r);
  const std::string corpus = dir / "corpus";
  fs::create_directories(corpus);
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "a fortune, " + std::to_string(i) + "\n%\n";
  write_file(corpus + "/text", Bytes(text.begin(), text.end()));
  r = run_binary(dir, gpt_binary,
                 "--data " + corpus +
                     " --layers 1 --width 8 --heads 2 --seq-len 8 --batch 2 --steps 3 --warmup 1 "
                     "--threads 1 --state " +
                     save);
  EXPECT_EQ(r.code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, save) && contains(r.err, "cannot create a temporary file next to it")) << describe(r);
}

}  // namespace io_optimizer_break_test
