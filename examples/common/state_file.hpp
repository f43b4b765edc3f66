// The training-state files of the examples (examples/mlp, examples/gpt): written atomically, validated
// completely when read. Each example names its own format (StateFormat: magic and version), so one
// example's file is never mistaken for another's.
//
// Layout (all integers little-endian, floats IEEE-754 little-endian):
//   header  : magic (8 bytes, e.g. "REMATMLP") | format version u32 | payload length u64 | CRC-32 of the payload u32
//   payload : a sequence of fields written by StateWriter and read back in the same order by StateReader.
// A file whose length differs from the header's (truncated or extended) or whose payload's CRC-32
// (zlib's crc32, ISO 3309) differs is rejected before anything is read from it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <remat/matrix.hpp>

namespace examples {

/// The state file is unreadable, truncated, altered, of another version, or does not fit the model;
/// or it cannot be written. what() is one line naming the file.
class state_error : public std::runtime_error {
 public:
  state_error(const std::string& file, const std::string& problem) : std::runtime_error(file + ": " + problem) {}
};

/// Which kind of state file: its magic number, its format version and what it is called in errors
/// ("not a <name> state file").
struct StateFormat {
  char magic[8];
  std::uint32_t version;
  const char* name;
};

constexpr std::size_t state_header_bytes = 8 + 4 + 8 + 4;

/// Appends fields to a payload.
class StateWriter {
 public:
  void u32(std::uint32_t v) { little_endian(v, 4); }
  void u64(std::uint64_t v) { little_endian(v, 8); }
  void f64(double v) {
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    u64(bits);
  }
  void text(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  /// Shape then the values, row-major.
  void matrix(const remat::Matrix<float>& m) {
    u64(static_cast<std::uint64_t>(m.rows()));
    u64(static_cast<std::uint64_t>(m.cols()));
    for (remat::Index i = 0; i < m.size(); ++i) {
      std::uint32_t bits;
      std::memcpy(&bits, m.data() + i, 4);
      u32(bits);
    }
  }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

 private:
  void little_endian(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back(static_cast<unsigned char>(v >> (8 * i)));
  }
  std::vector<unsigned char> bytes_;
};

/// Reads fields back; any read past the end or a shape that differs from the expected throws state_error.
class StateReader {
 public:
  StateReader(std::string path, std::vector<unsigned char> payload)
      : path_(std::move(path)), bytes_(std::move(payload)) {}
  std::uint32_t u32() { return static_cast<std::uint32_t>(little_endian(4)); }
  std::uint64_t u64() { return little_endian(8); }
  double f64() {
    const std::uint64_t bits = u64();
    double v;
    std::memcpy(&v, &bits, 8);
    return v;
  }
  std::string text() {
    const std::uint32_t n = u32();
    need(n, "a string");
    std::string s(bytes_.begin() + static_cast<std::ptrdiff_t>(at_),
                  bytes_.begin() + static_cast<std::ptrdiff_t>(at_ + n));
    at_ += n;
    return s;
  }
  /// Reads a matrix that must be [rows, cols]; `what` names it in errors.
  void matrix(remat::Matrix<float>& m, remat::Index rows, remat::Index cols, const std::string& what) {
    const std::uint64_t r = u64(), c = u64();
    if (r != static_cast<std::uint64_t>(rows) || c != static_cast<std::uint64_t>(cols))
      throw state_error(path_, what + " is [" + std::to_string(r) + "," + std::to_string(c) +
                                   "] in the file but the model needs [" + std::to_string(rows) + "," +
                                   std::to_string(cols) + "]");
    need(static_cast<std::size_t>(r * c * 4), what);
    m.resize(rows, cols);
    for (remat::Index i = 0; i < m.size(); ++i) {
      const std::uint32_t bits = u32();
      std::memcpy(m.data() + i, &bits, 4);
    }
  }
  /// Throws unless every byte was read.
  void expect_end() const {
    if (at_ != bytes_.size())
      throw state_error(path_, std::to_string(bytes_.size() - at_) + " unexpected bytes after the last field");
  }
  const std::string& path() const { return path_; }

 private:
  void need(std::size_t n, const std::string& what) const {
    if (n > bytes_.size() - at_) throw state_error(path_, "payload ends inside " + what);
  }
  std::uint64_t little_endian(int n) {
    need(static_cast<std::size_t>(n), "a number");
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= std::uint64_t{bytes_[at_ + static_cast<std::size_t>(i)]} << (8 * i);
    at_ += static_cast<std::size_t>(n);
    return v;
  }
  std::string path_;
  std::vector<unsigned char> bytes_;
  std::size_t at_ = 0;
};

inline std::uint32_t crc32_of(const std::vector<unsigned char>& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(bytes.size() - done, 1u << 30));
    crc = crc32(crc, bytes.data() + done, chunk);
    done += chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

/// The directory a file at `path` is in: "." for a bare name.
inline std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

/// The temporary file write_state_file writes before renaming it over `path`: `path`.tmp.XXXXXX, made by
/// mkstemp. Returns its descriptor and sets `name`; throws state_error naming `path`.
inline int make_temporary_next_to(const std::string& path, std::string& name) {
  std::string pattern = path + ".tmp.XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  const int fd = mkstemp(buffer.data());
  if (fd < 0)
    throw state_error(path, std::string("cannot create a temporary file next to it: ") + std::strerror(errno));
  name.assign(buffer.data());
  return fd;
}

/// Throws state_error naming `path` unless write_state_file could write it: `path` is not a directory and
/// the temporary file next to it can be created (made and removed here, so that every reason the write
/// would fail — a missing or read-only directory, a name too long once ".tmp.XXXXXX" is added, a file system
/// that takes no files — shows now). The examples check this before training, so that a mistyped --save or
/// --state fails at once instead of after the first epoch or --save-every steps.
inline void check_state_destination(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) == 0 && S_ISDIR(status.st_mode))
    throw state_error(path, "cannot be written: it is a directory");
  std::string temporary;
  ::close(make_temporary_next_to(path, temporary));
  ::unlink(temporary.c_str());
}

/// Writes header + payload to `path` atomically: into a temporary file in the same directory, flushed
/// and fsync'ed, then renamed over `path` (rename is atomic on POSIX file systems), then the directory
/// is fsync'ed. A crash leaves either the old file or the new one, never a mixture. Throws state_error.
inline void write_state_file(const std::string& path, const StateFormat& format,
                             const std::vector<unsigned char>& payload) {
  std::vector<unsigned char> bytes(format.magic, format.magic + 8);
  StateWriter h;
  h.u32(format.version);
  h.u64(payload.size());
  h.u32(crc32_of(payload));
  bytes.insert(bytes.end(), h.bytes().begin(), h.bytes().end());
  bytes.insert(bytes.end(), payload.begin(), payload.end());

  const std::string dir = directory_of(path);
  std::string temporary;
  const int fd = make_temporary_next_to(path, temporary);
  auto fail = [&](const char* step) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    throw state_error(path, std::string(step) + " failed: " + reason + " (the previous file, if any, is unchanged)");
  };
  FILE* f = fdopen(fd, "wb");
  if (!f) {
    ::close(fd);
    fail("fdopen");
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool flushed = written && std::fflush(f) == 0;
  const bool synced = flushed && ::fsync(fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (!written) fail("write");
  if (!flushed) fail("fflush");
  if (!synced) fail("fsync");
  if (!closed) fail("close");
  if (std::rename(temporary.c_str(), path.c_str()) != 0) fail("rename");
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);  // makes the rename itself durable; best effort
    ::close(dir_fd);
  }
}

namespace detail {

/// An open file descriptor, closed on every path out.
class ReadOnlyFile {
 public:
  /// O_NONBLOCK: opening a FIFO would otherwise wait for a writer, before regular_size() could refuse it
  /// (on a regular file it changes nothing).
  explicit ReadOnlyFile(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {
    if (fd_ < 0) throw state_error(path, std::string("cannot open: ") + std::strerror(errno));
  }
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile() { ::close(fd_); }

  /// The file's size in bytes; throws state_error for anything but a regular file (a directory, a device
  /// such as /dev/zero, a pipe: none of them can be a state file, and some never end).
  std::uint64_t regular_size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw state_error(path_, std::string("cannot stat: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw state_error(path_, "not a regular file (a directory, device or pipe?)");
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// Reads up to `count` bytes; fewer only at the end of the file. Throws state_error for a read error.
  std::size_t read(unsigned char* out, std::size_t count) const {
    std::size_t done = 0;
    while (done < count) {
      const ssize_t got = ::read(fd_, out + done, std::min<std::size_t>(count - done, std::size_t{1} << 30));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw state_error(path_, std::string("read error: ") + std::strerror(errno));
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    return done;
  }

 private:
  std::string path_;
  int fd_;
};

}  // namespace detail

/// Reads and validates a state file: magic, version, length and CRC-32, in that order, the header
/// checked before the payload is read (a wrong path to a huge file is refused from its first 24 bytes).
/// Returns a reader over the payload. Throws state_error describing the first problem found, for a path
/// that is not a regular file too.
inline StateReader read_state_file(const std::string& path, const StateFormat& format) {
  const detail::ReadOnlyFile file(path);
  const std::uint64_t size = file.regular_size();
  unsigned char head[state_header_bytes];
  // Judged by the size fstat gave, which the payload's length is compared with below.
  const std::uint64_t got = size < state_header_bytes ? size : file.read(head, state_header_bytes);
  if (got < state_header_bytes)
    throw state_error(path, "truncated: " + std::to_string(got) + " bytes, shorter than the " +
                                std::to_string(state_header_bytes) + "-byte header");
  if (std::memcmp(head, format.magic, 8) != 0)
    throw state_error(path, std::string("not a ") + format.name + " state file (bad magic number)");
  StateReader header(path, std::vector<unsigned char>(head + 8, head + state_header_bytes));
  const std::uint32_t version = header.u32();
  const std::uint64_t length = header.u64();
  const std::uint32_t crc = header.u32();
  if (version != format.version)
    throw state_error(path, "format version " + std::to_string(version) +
                                " is not supported (this program reads version " + std::to_string(format.version) +
                                ")");
  const std::uint64_t actual = size - state_header_bytes;
  if (actual != length)
    throw state_error(path, (actual < length ? "truncated: the payload has " : "length mismatch: the payload has ") +
                                std::to_string(actual) + " bytes but the header says " + std::to_string(length));
  std::vector<unsigned char> payload(static_cast<std::size_t>(length));
  const std::size_t read = file.read(payload.data(), payload.size());
  unsigned char more;
  if (read != payload.size() || file.read(&more, 1) != 0)
    throw state_error(path, "changed while it was read (its size is no longer " + std::to_string(size) + " bytes)");
  if (crc32_of(payload) != crc) throw state_error(path, "checksum mismatch: the file was altered or damaged");
  return StateReader(path, std::move(payload));
}

}  // namespace examples
