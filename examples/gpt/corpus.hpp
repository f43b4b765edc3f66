// The byte corpus of the GPT example (docs/gpt.md §Training): the text files of a directory, concatenated,
// split into training and validation bytes, and the windows of S + 1 bytes a batch is made of.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <remat/nn/linear.hpp>

namespace gpt {

/// The corpus cannot be read or is too small; what() is one line naming the directory or file.
class data_error : public std::runtime_error {
 public:
  data_error(const std::string& where, const std::string& problem) : std::runtime_error(where + ": " + problem) {}
};

/// Contiguous stretches [begin, begin + length) of the corpus that belong to one split. Windows are drawn
/// inside a run, never across two, so no window joins text that is not adjacent in the corpus.
struct Runs {
  struct Run {
    std::size_t begin = 0, length = 0;
  };
  std::vector<Run> runs;
  std::size_t bytes = 0;  ///< the sum of the lengths
};

/// Every byte of the corpus, its files and how it is split.
struct Corpus {
  std::string directory;
  std::vector<std::string> files;  ///< file names, sorted: the order of concatenation
  std::vector<unsigned char> bytes;
  std::uint32_t crc32 = 0;  ///< of `bytes`: a state file records it, so a resumed run trains on the same text
  std::size_t block = 0;    ///< split block size (bytes)
  Runs train, validation;
};

/// Each corpus file is a regular file directly in the directory whose name does not end in .dat (the
/// fortune index files) or .u8 (Debian's fortunes package ships each text file again as a symlink
/// name.u8 -> name). Symlinks are skipped altogether: in the fortunes package every one duplicates a file.
inline bool is_corpus_file(const std::filesystem::directory_entry& entry) {
  const std::string name = entry.path().filename().string();
  auto ends_with = [&](const char* suffix) {
    const std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  std::error_code ec;
  if (entry.is_symlink(ec) || !entry.is_regular_file(ec)) return false;
  return !ends_with(".dat") && !ends_with(".u8") && name[0] != '.';
}

namespace detail {

/// Reserves room for the files' bytes (their sizes now; a file that grows is still read whole). Throws
/// data_error naming the directory and its largest file when that is more than memory holds.
inline void reserve_corpus(const std::string& directory, const std::vector<std::string>& files,
                           std::vector<unsigned char>& bytes) {
  namespace fs = std::filesystem;
  std::uintmax_t total = 0, largest = 0;
  std::string largest_path;
  for (const std::string& name : files) {
    std::error_code ec;
    const std::string path = (fs::path(directory) / name).string();
    const std::uintmax_t size = fs::file_size(path, ec);
    if (ec) throw data_error(path, "cannot read its size: " + ec.message());
    total += size;
    if (size >= largest) {
      largest = size;
      largest_path = path;
    }
  }
  bool reserved = total <= bytes.max_size();
  try {
    if (reserved) bytes.reserve(static_cast<std::size_t>(total));
  } catch (const std::bad_alloc&) {
    reserved = false;
  }
  if (!reserved)
    throw data_error(directory, "out of memory for the corpus's " + std::to_string(total) +
                                    " bytes (the largest file: " + largest_path + ", " + std::to_string(largest) +
                                    " bytes)");
}

/// Appends the bytes of the regular file `path` to `out`. Throws data_error naming the file when it cannot
/// be opened or read, is no longer a regular file, or does not fit in memory. (POSIX reads, not an
/// std::ifstream: libstdc++'s filebuf throws std::ios_base::failure for a read error, naming no file.)
inline void append_file(const std::string& path, std::vector<unsigned char>& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO swapped in: no wait
  if (fd < 0) throw data_error(path, std::string("cannot open: ") + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat status {};
  if (::fstat(fd, &status) != 0) throw data_error(path, std::string("cannot read: ") + std::strerror(errno));
  if (!S_ISREG(status.st_mode)) throw data_error(path, "cannot read: not a regular file");
  std::vector<unsigned char> buffer(std::size_t{1} << 16);
  for (;;) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw data_error(path, std::string("read error: ") + std::strerror(errno));
    if (got == 0) return;
    try {
      out.insert(out.end(), buffer.data(), buffer.data() + got);
    } catch (const std::bad_alloc&) {  // the file grew past what was reserved, and memory ran out
      throw data_error(path, "out of memory after " + std::to_string(out.size()) + " bytes of the corpus");
    }
  }
}

}  // namespace detail

/// Reads the corpus files of `directory` (is_corpus_file), sorted by name so the corpus is the same
/// on every machine, and concatenates them. Throws data_error for a missing or unreadable directory or
/// file, a corpus larger than memory holds (naming its largest file), and a corpus of 0 bytes.
inline Corpus read_corpus(const std::string& directory) {
  namespace fs = std::filesystem;
  Corpus c;
  c.directory = directory;
  std::error_code ec;
  if (!fs::is_directory(directory, ec))
    throw data_error(directory, fs::exists(directory, ec) ? "not a directory"
                                                          : "no such directory (the fortunes corpus is Debian's "
                                                            "fortunes package; or give --data DIR)");
  fs::directory_iterator it(directory, ec), end;
  if (ec) throw data_error(directory, "cannot list the directory: " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw data_error(directory, "cannot list the directory: " + ec.message());
    if (is_corpus_file(*it)) c.files.push_back(it->path().filename().string());
  }
  std::sort(c.files.begin(), c.files.end());
  detail::reserve_corpus(directory, c.files, c.bytes);
  for (const std::string& name : c.files) detail::append_file((fs::path(directory) / name).string(), c.bytes);
  if (c.bytes.empty())
    throw data_error(directory, "the corpus is empty (" + std::to_string(c.files.size()) +
                                    " files of 0 bytes; it reads the regular files not ending in .dat or .u8)");
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::size_t done = 0; done < c.bytes.size();) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(c.bytes.size() - done, 1u << 30));
    crc = crc32(crc, c.bytes.data() + done, chunk);
    done += chunk;
  }
  c.crc32 = static_cast<std::uint32_t>(crc);
  return c;
}

/// The validation split: the corpus cut into blocks of max(1024, S + 1) bytes, every 20th block (blocks
/// 19, 39, …) for validation, the rest for training — 5 % of the bytes, spread over the whole corpus.
/// (The last 5 % of the sorted fortunes files would be one file, zippy and work, not a sample of the
/// corpus.) Throws data_error unless each split holds at least one window of S + 1 bytes.
inline void split(Corpus& c, std::size_t seq_len) {
  const std::string size = std::to_string(c.bytes.size()) + " bytes";
  // Checked first, so that S + 1 below cannot wrap (a state file may give any S); the minimum is then
  // stated only where it fits in a size_t.
  if (seq_len >= c.bytes.size()) {
    const std::size_t block = std::max<std::size_t>(1024, seq_len + 1);
    const bool stated = seq_len < std::numeric_limits<std::size_t>::max() / 40;
    throw data_error(
        c.directory,
        "the corpus (" + size + ") is too small: validation is every 20th block of " +
            (stated ? std::to_string(block) : std::string("S + 1")) + " bytes, so it needs at least " +
            (stated ? std::to_string(19 * block + seq_len + 1) + " bytes" : std::string("19 blocks and S + 1 bytes")) +
            " for --seq-len " + std::to_string(seq_len));
  }
  c.block = std::max<std::size_t>(1024, seq_len + 1);
  c.train = {};
  c.validation = {};
  for (std::size_t begin = 0, k = 0; begin < c.bytes.size(); begin += c.block, ++k) {
    const std::size_t length = std::min(c.block, c.bytes.size() - begin);
    Runs& r = k % 20 == 19 ? c.validation : c.train;
    if (!r.runs.empty() && r.runs.back().begin + r.runs.back().length == begin)
      r.runs.back().length += length;  // adjacent training blocks are one run
    else
      r.runs.push_back({begin, length});
    r.bytes += length;
  }
  auto longest = [](const Runs& r) {
    std::size_t n = 0;
    for (const Runs::Run& run : r.runs) n = std::max(n, run.length);
    return n;
  };
  // Validation's first block, 19, holds a window from 19 blocks and S + 1 bytes on.
  if (longest(c.train) <= seq_len || longest(c.validation) <= seq_len)
    throw data_error(c.directory, "the corpus (" + size + ") is too small: validation is every 20th block of " +
                                      std::to_string(c.block) + " bytes, so it needs at least " +
                                      std::to_string(19 * c.block + seq_len + 1) + " bytes for --seq-len " +
                                      std::to_string(seq_len));
}

/// The start offsets of the windows of S + 1 bytes inside the runs, counted through the runs in order:
/// window i of a split is at(i), i < count().
class Windows {
 public:
  Windows(const Runs& runs, std::size_t seq_len) : seq_len_(seq_len) {
    for (const Runs::Run& r : runs.runs)
      if (r.length > seq_len) {  // not seq_len + 1, which wraps for SIZE_MAX
        begins_.push_back(r.begin);
        first_.push_back(count_);
        count_ += r.length - seq_len;
      }
  }
  std::size_t count() const { return count_; }
  /// The corpus offset of window i.
  std::size_t at(std::size_t i) const {
    const std::size_t run =
        static_cast<std::size_t>(std::upper_bound(first_.begin(), first_.end(), i) - first_.begin()) - 1;
    return begins_[run] + (i - first_[run]);
  }
  /// Fills sequence b of a batch: ids[b·S + s] = corpus[w + s], targets[b·S + s] = corpus[w + s + 1].
  void fill(const Corpus& c, std::size_t i, std::size_t b, std::vector<int>& ids, std::vector<int>& targets) const {
    const std::size_t w = at(i);
    for (std::size_t s = 0; s < seq_len_; ++s) {
      ids[b * seq_len_ + s] = c.bytes[w + s];
      targets[b * seq_len_ + s] = c.bytes[w + s + 1];
    }
  }

 private:
  std::size_t seq_len_, count_ = 0;
  std::vector<std::size_t> begins_, first_;
};

/// The entropy −Σ p log p (nats per byte) of the byte frequencies of a split: the loss of the best model
/// that ignores context, the baseline a trained model must beat.
inline double unigram_entropy(const Corpus& c, const Runs& runs) {
  std::vector<double> counts(256, 0.0);
  for (const Runs::Run& r : runs.runs)
    for (std::size_t i = r.begin; i < r.begin + r.length; ++i) counts[c.bytes[i]] += 1;
  double h = 0;
  for (double n : counts)
    if (n > 0) {
      const double p = n / static_cast<double>(runs.bytes);
      h -= p * std::log(p);
    }
  return h;
}

}  // namespace gpt
