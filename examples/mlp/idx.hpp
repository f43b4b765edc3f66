// Reading MNIST-style IDX files (optionally gzip-compressed) with full validation.
//
// The IDX format (LeCun, Cortes & Burges, http://yann.lecun.com/exdb/mnist/; the same for Fashion-MNIST,
// Xiao, Rasul & Vollgraf 2017): a big-endian header — magic 0x00000803 (2051) for unsigned-byte images
// [count, rows, cols], 0x00000801 (2049) for unsigned-byte labels [count] — followed by the bytes.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <remat/matrix.hpp>

namespace mlp {

/// A data file is missing, unreadable, truncated or malformed. what() is one line: "<file>: <problem>".
class data_error : public std::runtime_error {
 public:
  data_error(const std::string& file, const std::string& problem) : std::runtime_error(file + ": " + problem) {}
};

/// Images scaled to [0, 1], one flattened image per row, and their class labels.
struct Dataset {
  remat::Matrix<float> images;  ///< [count, rows·cols]
  std::vector<int> labels;      ///< count entries in [0, classes)
  int image_rows = 0;
  int image_cols = 0;
};

namespace detail {

/// Deflate's largest expansion, output bytes per input byte (zlib's technical details,
/// https://zlib.net/zlib_tech.html, "Maximum Compression Factor"); a plain file, which zlib reads as it is,
/// holds its own size.
constexpr std::uint64_t deflate_max_expansion = 1032;

/// A data file read through zlib's inflate: gzip-compressed (it begins with gzip's magic bytes 1f 8b) or plain
/// (read as it is). Every gzip member is checked to its end: its CRC-32 and length trailer (RFC 1952) must be
/// there and match, so a file cut anywhere, inside the trailer too, is truncated data. (zlib's gzread was used
/// before: it ended without an error on a file cut inside its 8-byte trailer whenever the data's last bytes
/// had gone straight to the caller's buffer, so the data was read unchecked.)
class GzFile {
 public:
  /// Opens a regular file (O_NONBLOCK: opening a FIFO would otherwise wait for a writer before the check
  /// below could refuse it; on a regular file it changes nothing). Throws data_error for a missing or
  /// unreadable path and for anything but a regular file: a directory, a device or a pipe cannot be an
  /// IDX file, some never end, and none has a size to check a header against.
  explicit GzFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw data_error(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat status {};
    if (::fstat(fd_, &status) != 0) {
      const int error = errno;
      ::close(fd_);
      throw data_error(path, std::string("cannot open: ") + std::strerror(error));
    }
    if (!S_ISREG(status.st_mode)) {
      ::close(fd_);
      throw data_error(path, S_ISDIR(status.st_mode) ? "cannot read: Is a directory"
                                                     : "cannot read: not a regular file (a device or a pipe?)");
    }
    file_bytes_ = static_cast<std::uint64_t>(status.st_size);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile() {
    if (mode_ == Mode::gzip) inflateEnd(&stream_);
    ::close(fd_);
  }

  /// Reads up to `count` bytes; returns how many were read (fewer only at the end of the data). Throws
  /// data_error for corrupt compressed data (a bad CRC-32 or length included), a gzip member cut short
  /// (inside its trailer too), a read error, or no memory for the inflater.
  std::size_t read(void* buffer, std::size_t count) {
    auto* out = static_cast<unsigned char*>(buffer);
    if (mode_ == Mode::unknown) detect();
    if (mode_ == Mode::plain) return read_plain(out, count);
    std::size_t done = 0;
    while (done < count && !finished_) {
      if (member_ended_) {
        next_member_or_finish();
        continue;
      }
      if (stream_.avail_in == 0 && !fill())
        throw data_error(path_, "truncated compressed data: the file's " + std::to_string(file_bytes_) +
                                    " bytes end inside a gzip member (part of its data or of its 8-byte " +
                                    "CRC-32 and length trailer is missing)");
      const auto chunk = static_cast<uInt>(std::min<std::size_t>(count - done, 1u << 30));
      stream_.next_out = out + done;
      stream_.avail_out = chunk;
      const int status = inflate(&stream_, Z_NO_FLUSH);
      done += chunk - stream_.avail_out;
      if (status == Z_STREAM_END)
        member_ended_ = true;                                                        // its CRC-32 and length matched
      else if (status != Z_OK && !(status == Z_BUF_ERROR && stream_.avail_in == 0))  // (refilled next round)
        throw data_error(path_, "corrupt compressed data (" + zlib_message(status) + ")");
    }
    return done;
  }

  /// Reads exactly `count` bytes of `what`; throws data_error naming what is missing otherwise.
  void read_exactly(void* buffer, std::size_t count, const std::string& what) {
    const std::size_t got = read(buffer, count);
    if (got != count)
      throw data_error(path_, "truncated: " + what + " needs " + std::to_string(count) + " bytes but only " +
                                  std::to_string(got) + " are there");
  }

  /// Reads exactly `count` bytes of `what` into `out` (resized to them), in chunks of at most 16 MiB that
  /// `out` grows by as the data arrives: a header that declares terabytes on a file of a few bytes is
  /// truncated data, found after reading what is there, not an allocation of the declared size.
  void read_growing(std::vector<unsigned char>& out, std::size_t count, const std::string& what) {
    constexpr std::size_t chunk = std::size_t{16} << 20;
    out.clear();
    while (out.size() < count) {
      const std::size_t have = out.size(), want = std::min(chunk, count - have);
      out.resize(have + want);
      const std::size_t got = read(out.data() + have, want);
      if (got != want)
        throw data_error(path_, "truncated: " + what + " needs " + std::to_string(count) + " bytes but only " +
                                    std::to_string(have + got) + " are there");
    }
  }

  /// The file's size on disk (bytes).
  std::uint64_t file_bytes() const { return file_bytes_; }

  /// The most bytes of data the file can hold: its own size if it is plain (known after the first read),
  /// deflate's limit of 1032 output bytes per input byte if it is gzip-compressed.
  std::uint64_t can_hold() const {
    if (!compressed()) return file_bytes_;
    return file_bytes_ <= std::numeric_limits<std::uint64_t>::max() / deflate_max_expansion
               ? file_bytes_ * deflate_max_expansion
               : std::numeric_limits<std::uint64_t>::max();
  }
  /// Whether the file is gzip-compressed rather than plain; known after the first read.
  bool compressed() const { return mode_ == Mode::gzip; }

  /// Checks that nothing follows the data; for a gzip file this also reads the last member's trailer and
  /// checks its CRC-32 and length (read() stops as soon as it has the bytes asked for).
  void expect_end(const std::string& what) {
    unsigned char extra[64];
    const std::size_t got = read(extra, sizeof extra);
    if (got != 0)
      throw data_error(path_, "length mismatch: unexpected bytes after the " + what +
                                  " (the header's dimensions do not match the file's length)");
  }

 private:
  enum class Mode { unknown, plain, gzip };
  static constexpr std::size_t input_bytes = std::size_t{1} << 17;

  /// gzip or plain, from the first two bytes (a file of fewer is plain, as for gzread and `gzip -d -f`).
  void detect() {
    input_.resize(input_bytes);
    if (gzip_member_next()) {
      const int status = inflateInit2(&stream_, 16 + MAX_WBITS);  // gzip wrapper only: checks CRC-32 and length
      if (status != Z_OK)
        throw data_error(
            path_, "cannot decompress: " + std::string(status == Z_MEM_ERROR ? "out of memory" : zlib_message(status)));
      mode_ = Mode::gzip;
    } else {
      mode_ = Mode::plain;
    }
  }

  /// Whether the unread input begins with gzip's magic bytes 1f 8b (reading more of the file to see two bytes).
  bool gzip_member_next() {
    while (stream_.avail_in < 2 && fill()) {
    }
    return stream_.avail_in >= 2 && stream_.next_in[0] == 0x1f && stream_.next_in[1] == 0x8b;
  }

  /// Appends the file's next bytes to the unread input; false at the end of the file. Throws data_error
  /// for a read error.
  bool fill() {
    if (stream_.avail_in > 0 && stream_.next_in != input_.data())
      std::memmove(input_.data(), stream_.next_in, stream_.avail_in);
    stream_.next_in = input_.data();
    for (;;) {
      const ssize_t got = ::read(fd_, input_.data() + stream_.avail_in, input_.size() - stream_.avail_in);
      if (got > 0) {
        stream_.avail_in += static_cast<uInt>(got);
        return true;
      }
      if (got == 0) return false;
      if (errno != EINTR) throw data_error(path_, std::string("read error: ") + std::strerror(errno));
    }
  }

  /// A plain file: what detect() read ahead, then the file itself.
  std::size_t read_plain(unsigned char* out, std::size_t count) {
    std::size_t done = 0;
    while (done < count) {
      if (stream_.avail_in == 0 && !fill()) break;
      const std::size_t n = std::min<std::size_t>(count - done, stream_.avail_in);
      std::memcpy(out + done, stream_.next_in, n);
      stream_.next_in += n;
      stream_.avail_in -= static_cast<uInt>(n);
      done += n;
    }
    return done;
  }

  /// After a member's end: another member if the next bytes begin one (concatenated gzip files are one
  /// stream); otherwise the data has ended, and what follows is ignored, as zlib's gzread and `gzip -d` (with
  /// a warning) ignore it.
  void next_member_or_finish() {
    if (gzip_member_next()) {
      inflateReset(&stream_);
      member_ended_ = false;
    } else {
      finished_ = true;
    }
  }

  std::string zlib_message(int status) const {
    return stream_.msg ? std::string(stream_.msg) : std::string(zError(status));
  }

  std::string path_;
  int fd_ = -1;
  std::uint64_t file_bytes_ = 0;  // the file's size on disk
  Mode mode_ = Mode::unknown;
  z_stream stream_{};  // next_in/avail_in: the unread input, in plain mode too
  std::vector<unsigned char> input_;
  bool member_ended_ = false, finished_ = false;
};

inline std::uint32_t big_endian(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

inline void check_magic(const std::string& path, std::uint32_t magic, std::uint32_t expected, const char* kind) {
  if (magic != expected)
    throw data_error(path, "bad magic number " + std::to_string(magic) + " (expected " + std::to_string(expected) +
                               " for an IDX " + kind + " file; is it the right file, and not corrupt?)");
}

}  // namespace detail

constexpr std::uint32_t idx_images_magic = 2051;  // 0x00000803: unsigned bytes, 3 dimensions
constexpr std::uint32_t idx_labels_magic = 2049;  // 0x00000801: unsigned bytes, 1 dimension
constexpr std::uint32_t idx_max_count = 10'000'000;
constexpr std::uint32_t idx_max_side = 1024;

/// Reads an IDX image file (gzip or plain; zlib reads both); pixels are scaled from 0..255 to [0, 1].
/// Returns [count, rows·cols]. Throws data_error for a missing file or one that is not a regular file, wrong
/// magic, implausible dimensions, dimensions that need more bytes than the file can hold (a plain file its own
/// size, a gzip file 1032 times it), truncated or corrupt data, or trailing data. Bytes after the last gzip
/// member that do not begin another member are ignored, as zlib's gzread (and `gzip -d`, with a warning)
/// ignores them: what is read is the members' data, each member checked against its CRC-32 and length.
inline remat::Matrix<float> read_idx_images(const std::string& path, int& rows, int& cols) {
  detail::GzFile file(path);
  unsigned char header[16];
  file.read_exactly(header, sizeof header, "the 16-byte image header");
  detail::check_magic(path, detail::big_endian(header), idx_images_magic, "image");
  const std::uint32_t count = detail::big_endian(header + 4);
  const std::uint32_t r = detail::big_endian(header + 8), c = detail::big_endian(header + 12);
  if (count == 0 || count > idx_max_count)
    throw data_error(path, "implausible image count " + std::to_string(count) + " (expected 1.." +
                               std::to_string(idx_max_count) + ")");
  if (r == 0 || c == 0 || r > idx_max_side || c > idx_max_side)
    throw data_error(path, "implausible image size " + std::to_string(r) + "x" + std::to_string(c));
  const std::size_t pixels = std::size_t{r} * c, total = std::size_t{count} * pixels;
  const std::string what =
      std::to_string(count) + " images of " + std::to_string(r) + "x" + std::to_string(c) + " pixels";
  // A header that declares more than the file can hold is truncated data, found before allocating it.
  if (const std::uint64_t can_hold = file.can_hold(); total + sizeof header > can_hold)
    throw data_error(
        path,
        "truncated: " + what + " need " + std::to_string(total) + " bytes after the " + std::to_string(sizeof header) +
            "-byte header, more than a " + (file.compressed() ? "gzip" : "plain") + " file of " +
            std::to_string(file.file_bytes()) + " bytes can hold" +
            (file.compressed() ? " (deflate expands at most " + std::to_string(detail::deflate_max_expansion) + "-fold)"
                               : std::string()));
  remat::Matrix<float> images;
  try {
    images.resize(static_cast<remat::Index>(count), static_cast<remat::Index>(pixels));
  } catch (const std::bad_alloc&) {
    throw data_error(path, "out of memory for " + what + " (" + std::to_string(4 * total) + " bytes as floats)");
  }
  // The pixels are converted as they arrive, through one small buffer: a file-sized temporary costs a second
  // pass over the data, and on some virtual machines its release (a large munmap) makes the next pass over the
  // images slow; it cost the first epoch 0.3 s here (docs/mlp.md, "Loading the data").
  std::vector<unsigned char> chunk(std::min<std::size_t>(total, std::size_t{1} << 20));
  for (std::size_t done = 0; done < total;) {
    const std::size_t want = std::min(chunk.size(), total - done), got = file.read(chunk.data(), want);
    if (got != want)
      throw data_error(path, "truncated: " + what + " need " + std::to_string(total) + " bytes but only " +
                                 std::to_string(done + got) + " are there");
    float* out = images.data() + done;
    for (std::size_t i = 0; i < got; ++i) out[i] = static_cast<float>(chunk[i]) / 255.0f;
    done += got;
  }
  file.expect_end("pixel data");
  rows = static_cast<int>(r);
  cols = static_cast<int>(c);
  return images;
}

/// Reads an IDX label file; every label must be in [0, classes). Throws data_error as read_idx_images.
inline std::vector<int> read_idx_labels(const std::string& path, int classes) {
  detail::GzFile file(path);
  unsigned char header[8];
  file.read_exactly(header, sizeof header, "the 8-byte label header");
  detail::check_magic(path, detail::big_endian(header), idx_labels_magic, "label");
  const std::uint32_t count = detail::big_endian(header + 4);
  if (count == 0 || count > idx_max_count)
    throw data_error(path, "implausible label count " + std::to_string(count) + " (expected 1.." +
                               std::to_string(idx_max_count) + ")");
  std::vector<unsigned char> bytes;
  file.read_growing(bytes, count, std::to_string(count) + " labels");
  file.expect_end("labels");
  std::vector<int> labels(count);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] >= classes)
      throw data_error(path, "label " + std::to_string(bytes[i]) + " at index " + std::to_string(i) +
                                 " is outside 0.." + std::to_string(classes - 1));
    labels[i] = bytes[i];
  }
  return labels;
}

/// Reads `<dir>/<prefix>-images-idx3-ubyte.gz` and `<dir>/<prefix>-labels-idx1-ubyte.gz` and checks
/// that they hold the same number of items.
inline Dataset read_idx_dataset(const std::string& dir, const std::string& prefix, int classes) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  Dataset d;
  d.images = read_idx_images(images_path, d.image_rows, d.image_cols);
  d.labels = read_idx_labels(labels_path, classes);
  if (static_cast<remat::Index>(d.labels.size()) != d.images.rows())
    throw data_error(labels_path, "has " + std::to_string(d.labels.size()) + " labels but " + images_path + " has " +
                                      std::to_string(d.images.rows()) + " images");
  return d;
}

}  // namespace mlp
