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

class GzFile {
 public:
  /// Opens a regular file (O_NONBLOCK: opening a FIFO would otherwise wait for a writer before the check
  /// below could refuse it; on a regular file it changes nothing). Throws data_error for a missing or
  /// unreadable path and for anything but a regular file: a directory, a device or a pipe cannot be an
  /// IDX file, some never end, and none has a size to check a header against.
  explicit GzFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw data_error(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat status {};
    if (::fstat(fd, &status) != 0) {
      const int error = errno;
      ::close(fd);
      throw data_error(path, std::string("cannot open: ") + std::strerror(error));
    }
    if (!S_ISREG(status.st_mode)) {
      ::close(fd);
      throw data_error(path, S_ISDIR(status.st_mode) ? "cannot read: Is a directory"
                                                     : "cannot read: not a regular file (a device or a pipe?)");
    }
    file_bytes_ = static_cast<std::uint64_t>(status.st_size);
    file_ = gzdopen(fd, "rb");  // owns fd from here: gzclose closes it
    if (!file_) {
      ::close(fd);
      throw data_error(path, "cannot open: out of memory");
    }
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile() { gzclose(file_); }

  /// Reads up to `count` bytes; returns how many were read (fewer only at the end of the data).
  /// Throws data_error for a decompression error (corrupt stream, bad CRC, truncated stream).
  std::size_t read(void* buffer, std::size_t count) {
    auto* out = static_cast<unsigned char*>(buffer);
    std::size_t done = 0;
    while (done < count) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(count - done, 1u << 30));
      const int got = gzread(file_, out + done, chunk);
      if (got < 0) throw data_error(path_, "corrupt compressed data (" + error() + ")");
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
    }
    int code = Z_OK;
    const char* message = gzerror(file_, &code);
    if (code != Z_OK && code != Z_STREAM_END)
      throw data_error(path_, "corrupt or truncated compressed data (" + strip_path(message) + ")");
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

  /// The most bytes of data the file can hold: its own size if zlib reads it as it is (a plain file; known
  /// after the first read), deflate's limit of 1032 output bytes per input byte if it is gzip-compressed.
  std::uint64_t can_hold() const {
    if (!compressed()) return file_bytes_;
    return file_bytes_ <= std::numeric_limits<std::uint64_t>::max() / deflate_max_expansion
               ? file_bytes_ * deflate_max_expansion
               : std::numeric_limits<std::uint64_t>::max();
  }
  /// Whether zlib decompresses the file (gzip) rather than reading it as it is; known after the first read.
  bool compressed() const { return gzdirect(file_) == 0; }

  /// Checks that nothing follows the data (this also makes zlib verify the gzip trailer's CRC-32 when the
  /// trailer is there: a file cut inside its 8-byte trailer ends without an error from gzread, so its data,
  /// complete, is read unchecked).
  void expect_end(const std::string& what) {
    unsigned char extra[64];
    const std::size_t got = read(extra, sizeof extra);
    if (got != 0)
      throw data_error(path_, "length mismatch: unexpected bytes after the " + what +
                                  " (the header's dimensions do not match the file's length)");
  }


 private:
  std::string error() {
    int code = Z_OK;
    return strip_path(gzerror(file_, &code));
  }
  /// zlib prefixes its messages with the path, which data_error already gives.
  std::string strip_path(const std::string& message) const {
    const std::string prefix = path_ + ": ";
    return message.compare(0, prefix.size(), prefix) == 0 ? message.substr(prefix.size()) : message;
  }
  std::string path_;
  gzFile file_ = nullptr;
  std::uint64_t file_bytes_ = 0;  // the file's size on disk
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
/// ignores them: what is read is the members' data, checked against their CRC-32s, except the last
/// member's when the file is cut inside its 8-byte trailer (gzread reports no error there).
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
