// Helpers shared by the tests of the examples' readers and command lines (tests/io): a temporary directory,
// whole-file reads and writes (plain and gzip), little- and big-endian fields, IDX files built from their
// documented layout, a bit-by-bit CRC-32 (the oracle of the state file's and the corpus's checksums), a
// death-test child with an alarm, and running an example's binary with a time limit.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "remat/remat.hpp"

namespace io_files {

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
    std::string pattern = (fs::temp_directory_path() / "remat_io_test.XXXXXX").string();
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

inline void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}
inline Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
/// gzip-compresses `bytes` into `path` (zlib's gzwrite).
inline void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("gzopen " + path);
  if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size()))
    throw std::runtime_error("gzwrite " + path);
  if (gzclose(f) != Z_OK) throw std::runtime_error("gzclose " + path);
}

inline void put_be32(Bytes& b, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}
inline void put_le(Bytes& b, std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
inline std::uint64_t get_le(const Bytes& b, std::size_t at, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{b[at + static_cast<std::size_t>(i)]} << (8 * i);
  return v;
}
inline std::uint64_t bits_of(double x) {
  std::uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
}

/// An IDX image file: big-endian magic, count, rows, cols, then `pixels` (the header's dimensions as given).
inline Bytes idx_images(std::uint32_t count, std::uint32_t rows, std::uint32_t cols, const Bytes& pixels,
                        std::uint32_t magic = 2051) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, count);
  put_be32(b, rows);
  put_be32(b, cols);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}
inline Bytes idx_labels(std::uint32_t count, const Bytes& labels, std::uint32_t magic = 2049) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, count);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}
inline Bytes pattern_bytes(std::size_t n, unsigned seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 37 + seed * 11 + (i >> 3)) & 0xFF);
  return b;
}

/// CRC-32 (ISO 3309 / ITU-T V.42, reflected polynomial 0xEDB88320), bit by bit: the oracle of the state
/// file's checksum and the corpus CRC, independent of zlib's table-driven code.
inline std::uint32_t crc32_bitwise(const unsigned char* p, std::size_t n) {
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
inline void run_in_child(Body body, unsigned seconds = 20) {
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

inline bool contains(const std::string& text, const std::string& word) {
  return text.find(word) != std::string::npos;
}

/// An example's binary next to this program's build directory, or "" if it was not built.
inline std::string example_binary(const std::string& name) {
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
inline RunResult run_binary(const TempDir& dir, const std::string& binary, const std::string& args, int seconds = 300) {
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
inline std::string describe(const RunResult& r) {
  return "exit " + std::to_string(r.code) + "\nstderr: " + r.err.substr(0, 2000) +
         "\nstdout (end): " + r.out.substr(r.out.size() > 600 ? r.out.size() - 600 : 0);
}

}  // namespace io_files
