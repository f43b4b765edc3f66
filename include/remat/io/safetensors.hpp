// Saving and loading Parameters and matrices in the safetensors format, the format PyTorch and Hugging Face
// models are distributed in. Not part of the umbrella header remat/remat.hpp: it needs nlohmann-json (Debian:
// nlohmann-json3-dev), which the rest of remat does not; in CMake, link remat::safetensors. POSIX only (the
// atomic save renames a temporary file and fsyncs it). docs/saving.md shows how to use it.
//
// The format (the safetensors specification: the README of github.com/huggingface/safetensors and its
// reference reader, safetensors/src/tensor.rs):
//   8 bytes     N, the header's length in bytes, an unsigned 64-bit little-endian integer; N ≤ 100,000,000
//   N bytes     the header: UTF-8 JSON, beginning with '{', possibly padded at the end with spaces (0x20) so
//               that the data starts at a multiple of 8 bytes. An object with one member per tensor,
//                 "NAME": {"dtype": "F32", "shape": [3, 4], "data_offsets": [BEGIN, END]},
//               and optionally "__metadata__": {"key": "value", ...} (strings only). Names are unique.
//   the rest    the byte buffer: every tensor's elements, little-endian, row-major ('C' order), no strides.
//               data_offsets are byte offsets into this buffer (END one past the last byte); END − BEGIN is
//               the shape's element count times the dtype's size; sorted by offset the tensors cover the
//               buffer from 0 to its end without a hole or an overlap, and the buffer ends at the end of the
//               file. A shape [] is a scalar; a dimension of 0 an empty tensor with no bytes.
#pragma once

#if defined(__has_include)
#if !__has_include(<nlohmann/json.hpp>)
#error \
    "remat/io/safetensors.hpp needs nlohmann-json (Debian: apt-get install nlohmann-json3-dev; CMake: link remat::safetensors)"
#endif
#endif

// The data is copied between the file and memory as it is: a big-endian host would read every number
// byte-swapped. Refused when compiling rather than at run time.
#if !defined(__BYTE_ORDER__) || !defined(__ORDER_LITTLE_ENDIAN__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "remat/io/safetensors.hpp supports little-endian hosts only (safetensors stores little-endian numbers)"
#endif

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/nn/batch_norm2d.hpp"
#include "remat/nn/conv2d.hpp"
#include "remat/nn/linear.hpp"
#include "remat/parameter.hpp"

namespace remat::safetensors {

static_assert(std::numeric_limits<float>::is_iec559 && sizeof(float) == 4, "F32 is IEEE-754 binary32");
static_assert(std::numeric_limits<double>::is_iec559 && sizeof(double) == 8, "F64 is IEEE-754 binary64");

/// The largest header (N) a file may declare, in bytes: the limit of the reference implementation, which
/// keeps a damaged or hostile length from making the reader allocate and parse gigabytes.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;

/// How a Parameter's value is laid out in the file. PyTorch's tensors have any rank, as remat's N-D
/// Parameters (made from a remat::Tensor, e.g. nn::Conv2d's weight [out, in/groups, kH, kW]) do; PyTorch's
/// nn.Linear stores its weight as [out, in] and its bias as [out], where remat's nn::Linear holds W [in, out] and
/// b [1, out] (y = x·W + b against PyTorch's y = x·Wᵀ + b). Nothing is ever transposed or reshaped unless the
/// Entry asks for it; a shape that does not fit is a mismatch_error.
enum class Layout {
  /// The Parameter's own shape (Parameter::shape()): its N-D dimensions, or [rows, cols] for a matrix. On load a
  /// [1, n] Parameter also accepts a 1-D tensor [n] (PyTorch's bias), a [1, 1] Parameter a scalar [] (rank 0),
  /// and an N-D Parameter the [rows, cols] of its matrix view (what remat wrote before it saved N-D shapes):
  /// the same elements in the same order.
  matrix,
  /// Shape [cols, rows]: the file holds the transpose, as PyTorch's nn.Linear weight [out, in] is of remat's
  /// nn::Linear weight [in, out]. Saving writes valueᵀ; loading transposes back. Only for matrices (a Parameter
  /// whose shape() has rank 2): any other is a shape_error.
  transposed,
  /// Shape [cols] for a [1, cols] Parameter (PyTorch's nn.Linear bias). On load [1, cols] is accepted too.
  /// Only for Parameters of one row: any other is a shape_error.
  vector,
};

/// The optional "__metadata__" of a file: free-form text keys and values (PyTorch's files say {"format": "pt"}).
using Metadata = std::map<std::string, std::string>;

/// One tensor of a file named for a Parameter<float> (dtype F32) or Parameter<double> (F64), and its layout; or for
/// an std::int64_t, a scalar of dtype I64 (shape [], as PyTorch's nn.BatchNorm2d's num_batches_tracked). The Entry
/// refers to the Parameter or the integer: it must outlive the save or load call it is given to.
class Entry {
 public:
  /// Tensor `name` is `parameter`'s value (F32), laid out as `layout` says.
  Entry(std::string name, Parameter<float>& parameter, Layout layout = Layout::matrix)
      : name_(std::move(name)), float_(&parameter), layout_(layout) {}
  /// The same for a Parameter<double> (F64).
  Entry(std::string name, Parameter<double>& parameter, Layout layout = Layout::matrix)
      : name_(std::move(name)), double_(&parameter), layout_(layout) {}
  /// Tensor `name` is `scalar`, I64 of shape [] (a count, such as nn::BatchNorm2d::num_batches_tracked()).
  /// required false: a file without the tensor loads, and leaves `scalar` as it is (as PyTorch's BatchNorm loads
  /// a state_dict without num_batches_tracked); a tensor of that name must still be an I64 scalar.
  Entry(std::string name, std::int64_t& scalar, bool required = true)
      : name_(std::move(name)), int64_(&scalar), layout_(Layout::matrix), required_(required) {}

  const std::string& name() const noexcept { return name_; }                ///< the tensor's name in the file
  Layout layout() const noexcept { return layout_; }                        ///< how the value maps to the tensor
  Parameter<float>* float_parameter() const noexcept { return float_; }     ///< null unless a float Parameter
  Parameter<double>* double_parameter() const noexcept { return double_; }  ///< null unless a double Parameter
  std::int64_t* int64_scalar() const noexcept { return int64_; }            ///< null unless an I64 scalar
  /// false: load accepts a file without this tensor (only an I64 scalar's Entry can say so).
  bool required() const noexcept { return required_; }

 private:
  std::string name_;
  Parameter<float>* float_ = nullptr;
  Parameter<double>* double_ = nullptr;
  std::int64_t* int64_ = nullptr;
  Layout layout_;
  bool required_ = true;
};

/// The entries of an nn::Linear as PyTorch's nn.Linear names and lays them out: "PREFIX.weight" [out, in]
/// (Layout::transposed) and "PREFIX.bias" [out] (Layout::vector). A file saved with them loads into
/// torch.nn.Linear(in, out) with load_state_dict, and one written by PyTorch loads into nn::Linear(in, out).
template <class T>
std::vector<Entry> torch_linear(const std::string& prefix, nn::Linear<T>& layer) {
  return {Entry(prefix + ".weight", layer.weight, Layout::transposed),
          Entry(prefix + ".bias", layer.bias, Layout::vector)};
}

/// The entries of an nn::Conv2d as PyTorch's nn.Conv2d names them: "PREFIX.weight" [out, in/groups, kH, kW] and,
/// if the layer has a bias, "PREFIX.bias" [out], in the same layouts as PyTorch's.
template <class T>
std::vector<Entry> torch_conv2d(const std::string& prefix, nn::Conv2d<T>& layer) {
  std::vector<Entry> entries{Entry(prefix + ".weight", layer.weight)};
  if (layer.bias.value().size() > 0) entries.emplace_back(prefix + ".bias", layer.bias);
  return entries;
}

/// The entries of an nn::BatchNorm2d as PyTorch's nn.BatchNorm2d's state_dict names them: "PREFIX.weight",
/// "PREFIX.bias", "PREFIX.running_mean", "PREFIX.running_var", each [C], and "PREFIX.num_batches_tracked", an I64
/// scalar. A file saved with them loads into torch.nn.BatchNorm2d(C) with load_state_dict(strict=True), and one
/// written by PyTorch loads into nn::BatchNorm2d(C) without LoadOptions::allow_extra. The counter is not required
/// on load: a file without it (saved by remat before the layer kept one) loads and leaves the count as it is, as
/// PyTorch does for a state_dict without it.
template <class T>
std::vector<Entry> torch_batch_norm2d(const std::string& prefix, nn::BatchNorm2d<T>& layer) {
  return {Entry(prefix + ".weight", layer.weight), Entry(prefix + ".bias", layer.bias),
          Entry(prefix + ".running_mean", layer.running_mean), Entry(prefix + ".running_var", layer.running_var),
          Entry(prefix + ".num_batches_tracked", layer.num_batches_tracked(), false)};
}

/// What load accepts besides an exact match of names, dtypes and shapes.
struct LoadOptions {
  /// Ignore the file's tensors that no Entry names (a Hugging Face checkpoint of a whole model, of which only
  /// some layers are loaded). false: they are a mismatch_error, which catches a misspelt or missing Entry.
  bool allow_extra = false;
  /// Convert between F32 and F64 when a tensor's dtype differs from its Parameter's: F32 → double is exact;
  /// F64 → float rounds to nearest (as PyTorch's tensor.float() does), and a finite value beyond float's
  /// range is a mismatch_error rather than an infinity. false: a different dtype is a mismatch_error. Other
  /// dtypes (F16, BF16, integers, ...) are never converted: convert them in PyTorch (tensor.float()).
  bool convert_dtype = false;
};

/// One tensor as a file's header describes it.
struct TensorInfo {
  std::string name;                  ///< its key in the header
  std::string dtype;                 ///< as the file spells it: "F32", "F64", "F16", "BF16", "I64", ...
  std::vector<std::uint64_t> shape;  ///< empty for a scalar
  std::uint64_t begin = 0;           ///< offset of its first byte in the byte buffer (after the header)
  std::uint64_t end = 0;             ///< one past its last byte; end − begin = elements × the dtype's size
};

/// A file's header, validated (read_header).
struct Header {
  std::vector<TensorInfo> tensors;  ///< in the order of their data in the file
  Metadata metadata;                ///< "__metadata__", empty if the file has none
  std::uint64_t header_bytes = 0;   ///< N: the JSON header's length, padding included
  std::uint64_t file_bytes = 0;     ///< the file's size: 8 + N + the byte buffer's length
  /// The tensor called `name`, or null.
  const TensorInfo* find(const std::string& name) const {
    for (const TensorInfo& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

namespace detail {

/// Bytes per element of the dtypes the specification lists (those with whole bytes): a file whose tensors
/// remat does not load is still checked completely (offsets against shapes), so every known dtype has a size.
/// 0: unknown, or a sub-byte dtype (F4, F6_*), which this reader refuses.
inline unsigned dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, unsigned> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

template <class T>
const char* dtype_of();
template <>
inline const char* dtype_of<float>() {
  return "F32";
}
template <>
inline const char* dtype_of<double>() {
  return "F64";
}
template <class T>
const char* type_name();
template <>
inline const char* type_name<float>() {
  return "float";
}
template <>
inline const char* type_name<double>() {
  return "double";
}

/// A tensor name in a message, quoted, with control characters and quotes escaped as JSON writes them (a NUL
/// in a name would cut the message short).
inline std::string quote_name(const std::string& name) {
  return nlohmann::json(name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

/// The text of `error` (an errno value, taken before anything else can change errno).
inline std::string errno_text(int error) {
  return std::strerror(error);
}

/// A file opened for reading, closed on every path out; reads are positioned (pread), so the tensors a load
/// needs are read without the others.
class InputFile {
 public:
  /// O_NONBLOCK: opening a FIFO would otherwise wait for a writer before size() could refuse it.
  explicit InputFile(const std::string& path)
      : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {
    if (fd_ < 0) {
      const int error = errno;
      throw io_error(path + ": cannot open: " + errno_text(error), path);
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const std::string reason = errno_text(errno);
      ::close(fd_);
      throw io_error(path + ": cannot stat: " + reason, path);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw io_error(path + ": not a regular file (a directory, a device or a pipe?)", path);
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  std::uint64_t size() const { return size_; }

  /// Reads exactly `count` bytes at `offset`, which the header's checks placed inside the size fstat gave;
  /// fewer bytes mean the file shrank since (format_error). `what` names the bytes in errors.
  void read_at(std::uint64_t offset, void* out, std::uint64_t count, const std::string& what,
               const std::string& tensor = {}) const {
    auto* bytes = static_cast<unsigned char*>(out);
    std::uint64_t done = 0;
    while (done < count) {
      const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(count - done, std::uint64_t{1} << 30));
      const ssize_t got = ::pread(fd_, bytes + done, chunk, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        const int error = errno;
        throw io_error(path_ + ": read error in " + what + ": " + errno_text(error), path_, tensor);
      }
      if (got == 0)
        throw format_error(path_ + ": truncated while reading " + what + " (the file is shorter than the " +
                               std::to_string(size_) + " bytes it had when opened)",
                           path_, tensor);
      done += static_cast<std::uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_;
  std::uint64_t size_ = 0;
};

/// An unsigned integer of the header (a dimension or an offset): nlohmann-json gives non-negative integers
/// that fit 64 bits as number_unsigned; a negative, fractional or larger number is not one.
inline bool header_integer(const nlohmann::json& j, std::uint64_t& out) {
  if (!j.is_number_unsigned()) return false;
  out = j.get<std::uint64_t>();
  return true;
}

/// Reads and checks the header of `file` against every rule of the format; throws format_error naming the
/// first rule broken (and the tensor, where one is concerned).
inline Header parse_header(const std::string& path, const InputFile& file) {
  Header header;
  header.file_bytes = file.size();
  auto bad = [&](const std::string& problem, const std::string& tensor = {}) {
    return format_error(path + ": " + problem + " (not a valid safetensors file: is it damaged or truncated?)", path,
                        tensor);
  };
  if (file.size() < 8)
    throw bad("truncated: " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length");
  unsigned char length[8];
  file.read_at(0, length, 8, "the header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{length[i]} << (8 * i);
  if (n > max_header_bytes)
    throw bad("the header length is " + std::to_string(n) + " bytes, more than the format's limit of " +
              std::to_string(max_header_bytes));
  if (n > file.size() - 8)
    throw bad("the header length is " + std::to_string(n) + " bytes but only " + std::to_string(file.size() - 8) +
              " bytes follow it");
  header.header_bytes = n;
  std::string text(static_cast<std::size_t>(n), '\0');
  file.read_at(8, text.data(), n, "the header");
  if (text.empty() || text[0] != '{') throw bad("the header does not begin with '{'");

  // JSON objects keep the last of repeated keys, which would hide one of two tensors of the same name (and
  // their bytes would then be a hole, or read under the wrong name): repeated keys are refused as they are
  // met, in every object. Nesting deeper than the format's (an array in a shape) is refused there too, so a
  // hostile header cannot make the parser build a deep tree.
  std::vector<std::set<std::string>> keys;
  const auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using event_t = nlohmann::json::parse_event_t;
    if ((event == event_t::object_start || event == event_t::array_start) && depth > 2)
      throw bad("the header nests objects or arrays deeper than the format's (a shape or offsets inside an array?)");
    if (event == event_t::object_start) keys.emplace_back();
    if (event == event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == event_t::key && !keys.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      // depth 1: a tensor's name (or "__metadata__"); deeper: a member of one
      if (!keys.back().insert(key).second)
        throw bad("the header repeats the key " + quote_name(key), depth == 1 ? key : std::string());
    }
    return true;
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text, check);  // allows trailing whitespace: the spaces that pad the header
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("the header is not valid JSON: ") + e.what());
  }
  if (!json.is_object()) throw bad("the header is not a JSON object");

  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& value = it.value();
    if (name == "__metadata__") {
      if (!value.is_object()) throw bad("\"__metadata__\" is not an object of strings");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string())
          throw bad("\"__metadata__\" maps " + quote_name(m.key()) + " to something other than a string");
        header.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor " + quote_name(name);
    if (!value.is_object()) throw bad(what + " is not an object {dtype, shape, data_offsets}", name);
    // Members other than these three are ignored, as the reference reader ignores them.
    const auto dtype = value.find("dtype");
    const auto shape = value.find("shape");
    const auto offsets = value.find("data_offsets");
    if (dtype == value.end() || shape == value.end() || offsets == value.end())
      throw bad(what + " lacks \"dtype\", \"shape\" or \"data_offsets\"", name);
    TensorInfo info;
    info.name = name;
    if (!dtype->is_string()) throw bad(what + ": \"dtype\" is not a string", name);
    info.dtype = dtype->get<std::string>();
    const unsigned element_bytes = dtype_bytes(info.dtype);
    if (element_bytes == 0) throw bad(what + " has the unknown or unsupported dtype " + quote_name(info.dtype), name);
    if (!shape->is_array()) throw bad(what + ": \"shape\" is not an array", name);
    std::uint64_t elements = 1;
    bool overflow = false, empty = false;
    for (const nlohmann::json& d : *shape) {
      std::uint64_t dim = 0;
      if (!header_integer(d, dim)) throw bad(what + ": \"shape\" holds " + d.dump() + ", not a dimension", name);
      info.shape.push_back(dim);
      empty = empty || dim == 0;
      if (dim != 0 && elements > std::numeric_limits<std::uint64_t>::max() / dim) overflow = true;
      elements *= dim;  // wraps when it overflows: then only `overflow` counts
    }
    // A dimension of 0 makes the tensor empty whatever the others: only a non-empty product can overflow.
    if (empty) elements = 0;
    if (!empty && overflow) throw bad(what + "'s shape " + shape_text(info.shape) + " overflows 64 bits", name);
    if (!offsets->is_array() || offsets->size() != 2 || !header_integer((*offsets)[0], info.begin) ||
        !header_integer((*offsets)[1], info.end))
      throw bad(what + ": \"data_offsets\" is not [BEGIN, END] of two byte offsets", name);
    if (info.end < info.begin) throw bad(what + "'s data_offsets " + offsets->dump() + " end before they begin", name);
    if (elements > std::numeric_limits<std::uint64_t>::max() / element_bytes)
      throw bad(what + "'s shape " + shape_text(info.shape) + " overflows 64 bits in bytes", name);
    if (info.end - info.begin != elements * element_bytes)
      throw bad(what + " is " + info.dtype + " " + shape_text(info.shape) + ", " +
                    std::to_string(elements * element_bytes) + " bytes, but its data_offsets " + offsets->dump() +
                    " span " + std::to_string(info.end - info.begin),
                name);
    header.tensors.push_back(std::move(info));
  }

  // Sorted by offset, each tensor begins where the previous one ends, the first at 0, and the last ends at
  // the end of the file: no byte is read for two tensors, and no byte goes unaccounted (a hole could hide
  // another file, a "polyglot").
  std::sort(header.tensors.begin(), header.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const std::uint64_t buffer = file.size() - 8 - n;
  std::uint64_t at = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : header.tensors) {
    const std::string range = "[" + std::to_string(t.begin) + "," + std::to_string(t.end) + "]";
    const std::string after = previous ? "the end of tensor " + quote_name(previous->name) : "the start of the data";
    if (t.begin < at)
      throw bad("tensor " + quote_name(t.name) + "'s data_offsets " + range + " overlap " +
                    (previous ? "tensor " + quote_name(previous->name) : std::string("another tensor")),
                t.name);
    if (t.begin > at)
      throw bad("a hole of " + std::to_string(t.begin - at) + " bytes between " + after + " and tensor " +
                    quote_name(t.name) + " (data_offsets " + range + ")",
                t.name);
    if (t.end > buffer)
      throw bad("truncated: tensor " + quote_name(t.name) + " ends at byte " + std::to_string(t.end) +
                    " of the data but the file holds " + std::to_string(buffer) + " bytes of data",
                t.name);
    at = t.end;
    previous = &t;
  }
  if (at != buffer)
    throw bad(std::to_string(buffer - at) + " bytes after " +
              (previous ? "the last tensor, " + quote_name(previous->name) + "," : std::string("the header")) +
              " belong to no tensor");
  return header;
}

/// The dimensions of `s`, as the file's shape.
inline std::vector<std::uint64_t> dims_of(const Shape& s) {
  std::vector<std::uint64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(static_cast<std::uint64_t>(s[i]));
  return d;
}

/// The shape a Parameter of shape() `dims` ([rows, cols] as a matrix) has in the file under `layout` (what save
/// writes).
inline std::vector<std::uint64_t> file_shape(const Shape& dims, Index rows, Index cols, Layout layout) {
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  if (layout == Layout::transposed) return {c, r};
  if (layout == Layout::vector) return {c};
  if (dims.rank() != 2) return dims_of(dims);
  return {r, c};
}

inline const char* layout_name(Layout layout) {
  return layout == Layout::transposed ? "Layout::transposed"
         : layout == Layout::vector   ? "Layout::vector"
                                      : "Layout::matrix";
}

/// Whether a tensor of `shape` fits a destination of shape() `dims` ([rows, cols] as a matrix) under `layout`
/// (see Layout for what each accepts).
inline bool shape_fits(const std::vector<std::uint64_t>& shape, const Shape& dims, Index rows, Index cols,
                       Layout layout) {
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  if (layout == Layout::matrix && dims.rank() != 2 && shape == dims_of(dims)) return true;
  switch (layout) {
    case Layout::transposed:
      return shape.size() == 2 && shape[0] == c && shape[1] == r;
    case Layout::vector:
      return (shape.size() == 1 && shape[0] == c) || (shape.size() == 2 && shape[0] == 1 && shape[1] == c);
    case Layout::matrix:
      break;
  }
  if (shape.size() == 2) return shape[0] == r && shape[1] == c;
  if (shape.size() == 1) return r == 1 && shape[0] == c;
  return shape.empty() && r == 1 && c == 1;
}

/// Why a tensor does not fit, and what to do (a mismatch_error).
inline mismatch_error shape_mismatch(const std::string& path, const TensorInfo& t, const Shape& dims, Index rows,
                                     Index cols, Layout layout) {
  const auto r = static_cast<std::uint64_t>(rows), c = static_cast<std::uint64_t>(cols);
  std::string message = path + ": tensor " + quote_name(t.name) + " is " + shape_text(t.shape) +
                        " in the file but its Parameter is " + to_string(dims) + " (" + layout_name(layout) +
                        " expects " + shape_text(file_shape(dims, rows, cols, layout)) + ")";
  if (layout == Layout::matrix && t.shape.size() == 2 && t.shape[0] == c && t.shape[1] == r)
    message +=
        "; the file holds its transpose, as PyTorch's nn.Linear stores its weight [out, in] for remat's "
        "[in, out]: name it with Layout::transposed (safetensors::torch_linear does so for a layer)";
  else if (layout == Layout::transposed && t.shape.size() == 2 && t.shape[0] == r && t.shape[1] == c)
    message += "; the file holds the Parameter's own orientation: name it with Layout::matrix";
  else
    message += "; build the model with the file's sizes, or load another file";
  return mismatch_error(message, path, t.name);
}

/// Reads tensor `t` (F32 or F64) into a [rows, cols] matrix of T under `layout`, converting as `options`
/// allow; the caller checked its dtype and shape.
template <class T>
Matrix<T> read_matrix(const std::string& path, const InputFile& file, const Header& header, const TensorInfo& t,
                      Index rows, Index cols, Layout layout) {
  const std::uint64_t at = 8 + header.header_bytes + t.begin;
  const std::string what = "tensor " + quote_name(t.name);
  const bool transposed = layout == Layout::transposed;
  auto read_as = [&](auto zero) {
    using U = decltype(zero);
    // The file's row-major elements as they lie: [cols, rows] for a transposed layout.
    Matrix<U> m(transposed ? cols : rows, transposed ? rows : cols);
    file.read_at(at, m.data(), t.end - t.begin, what, t.name);
    return m;
  };
  Matrix<T> out;
  if (t.dtype == dtype_of<T>()) {
    out = read_as(T(0));
    if (transposed) out = Matrix<T>(out.transpose());
    return out;
  }
  if (t.dtype == "F32") {  // into double: exact
    const Matrix<float> m = read_as(0.0f);
    out = transposed ? Matrix<T>(m.transpose().template cast<T>()) : Matrix<T>(m.template cast<T>());
    return out;
  }
  const Matrix<double> m = read_as(0.0);  // F64 into float: rounds to nearest
  for (Index i = 0; i < m.size(); ++i) {
    const double v = m.data()[i];
    // Converting a finite double beyond float's range is undefined behaviour in C++, and an infinity where
    // the file has a number would be a silent change: refused.
    if (std::isfinite(v) && std::abs(v) > static_cast<double>(std::numeric_limits<float>::max()))
      throw mismatch_error(path + ": tensor " + quote_name(t.name) + " holds " + remat::number_text(v) +
                               " at element " + std::to_string(i) +
                               ", beyond float's range: load it into a Parameter<double>",
                           path, t.name);
  }
  out = transposed ? Matrix<T>(m.transpose().template cast<T>()) : Matrix<T>(m.template cast<T>());
  return out;
}

/// Throws mismatch_error unless tensor `t`'s dtype can be loaded into T under `options`.
template <class T>
void check_dtype(const std::string& path, const TensorInfo& t, const LoadOptions& options, const std::string& into) {
  if (t.dtype == dtype_of<T>()) return;
  const bool floating = t.dtype == "F32" || t.dtype == "F64";
  if (floating && options.convert_dtype) return;
  std::string message = path + ": tensor " + quote_name(t.name) + " is " + t.dtype + " in the file but " + into +
                        " is " + dtype_of<T>() + " (" + type_name<T>() + ")";
  if (floating)
    message += std::string("; load it into a Parameter<") + (t.dtype == "F32" ? "float" : "double") +
               ">, convert it in PyTorch (tensor." + (t.dtype == "F32" ? "double" : "float") +
               "()), or pass LoadOptions::convert_dtype = true (" +
               (t.dtype == "F32" ? "F32 to double is exact)" : "F64 to float rounds to nearest)");
  else
    message += "; remat loads F32 and F64 only: convert it in PyTorch (tensor.float()) and save it again";
  throw mismatch_error(message, path, t.name);
}

/// The checks of names common to save and load: none empty, none repeated, none "__metadata__", all valid
/// UTF-8 (JSON text must be), and no Parameter under two names (on load the second would overwrite the
/// first; on save the file would read back as two Parameters).
inline void check_entries(const std::vector<Entry>& entries, const char* op) {
  std::set<std::string> names;
  std::set<const void*> parameters;
  for (const Entry& e : entries) {
    const std::string where = std::string("safetensors::") + op + ": ";
    if (e.name().empty()) throw name_error(where + "a tensor name is empty");
    if (e.name() == "__metadata__")
      throw name_error(where + "\"__metadata__\" is the format's name for the metadata, not a tensor name");
    try {
      (void)nlohmann::json(e.name()).dump();
    } catch (const nlohmann::json::type_error&) {
      throw name_error(where + "the tensor name " + quote_name(e.name()) + " is not valid UTF-8");
    }
    if (!names.insert(e.name()).second)
      throw name_error(where + "the tensor name " + quote_name(e.name()) + " is given twice");
    if (e.int64_scalar()) {
      if (!parameters.insert(e.int64_scalar()).second)
        throw name_error(where + "the integer named " + quote_name(e.name()) + " is also given under another name");
      continue;
    }
    const void* identity =
        e.float_parameter() ? static_cast<const void*>(remat::detail::ParameterAccess::identity(*e.float_parameter()))
                            : static_cast<const void*>(remat::detail::ParameterAccess::identity(*e.double_parameter()));
    if (identity && !parameters.insert(identity).second)
      throw name_error(where + "the Parameter named " + quote_name(e.name()) + " is also given under another name");
    const Index rows = e.float_parameter() ? e.float_parameter()->rows() : e.double_parameter()->rows();
    const Index cols = e.float_parameter() ? e.float_parameter()->cols() : e.double_parameter()->cols();
    if (e.layout() == Layout::vector && rows != 1)
      throw shape_error(where + "tensor " + quote_name(e.name()) + " has Layout::vector but its Parameter is " +
                        to_string(Shape{rows, cols}) + "; a vector is a [1,n] Parameter");
    const Shape dims = e.float_parameter() ? e.float_parameter()->shape() : e.double_parameter()->shape();
    if (e.layout() == Layout::transposed && dims.rank() != 2)
      throw shape_error(where + "tensor " + quote_name(e.name()) + " has Layout::transposed but its Parameter is " +
                        to_string(dims) + "; only a matrix is transposed (Layout::matrix keeps N-D shapes)");
  }
}

/// What save writes for one tensor.
struct Source {
  std::string name;
  const char* dtype;
  std::vector<std::uint64_t> shape;
  const void* data;  // row-major elements, `bytes` of them
  std::uint64_t bytes;
  Matrix<float> transposed_float;  // the transpose written for Layout::transposed, owned here
  Matrix<double> transposed_double;
};

template <class T>
Source make_source(const std::string& name, const Matrix<T>& value, const Shape& dims, Layout layout) {
  Source s;
  s.name = name;
  s.dtype = dtype_of<T>();
  s.shape = file_shape(dims, value.rows(), value.cols(), layout);
  s.bytes = static_cast<std::uint64_t>(value.size()) * sizeof(T);
  s.data = value.data();
  if (layout == Layout::transposed && value.size() > 0) {
    Matrix<T> t = value.transpose();
    if constexpr (std::is_same_v<T, float>) {
      s.transposed_float = std::move(t);
      s.data = s.transposed_float.data();
    } else {
      s.transposed_double = std::move(t);
      s.data = s.transposed_double.data();
    }
  }
  return s;
}

/// An I64 scalar (shape []) of the 8 bytes at `value`.
inline Source make_source(const std::string& name, const std::int64_t& value) {
  Source s;
  s.name = name;
  s.dtype = "I64";
  s.data = &value;
  s.bytes = sizeof(std::int64_t);
  return s;
}

/// Throws mismatch_error unless tensor `t` is an I64 scalar (shape []), what an Entry of an std::int64_t loads.
inline void check_int64_scalar(const std::string& path, const TensorInfo& t) {
  if (t.dtype == "I64" && t.shape.empty()) return;
  throw mismatch_error(path + ": tensor " + quote_name(t.name) + " is " + t.dtype + " " + shape_text(t.shape) +
                           " in the file but its entry is an std::int64_t, an I64 scalar []; a count such as "
                           "num_batches_tracked is saved so by PyTorch and remat",
                       path, t.name);
}

/// The directory a file at `path` is in: "." for a bare name.
inline std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

/// The temporary file a save writes before renaming it over its target; removed by the destructor unless
/// committed.
class TemporaryFile {
 public:
  /// Created next to `path` (a rename is atomic only within one file system), with a name no other save
  /// uses at the same time (process id and a counter; O_EXCL refuses an existing file, such as one left by a
  /// crash) and the mode a new file gets (0666 less the umask).
  explicit TemporaryFile(const std::string& path) : path_(path) {
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      name_ = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
      fd_ = ::open(name_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    if (fd_ < 0)
      throw io_error(path + ": cannot create a temporary file next to it (" + name_ + "): " + errno_text(errno) +
                         "; check that the directory exists and is writable",
                     path);
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(name_.c_str());
  }

  void write(const void* data, std::uint64_t count) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    std::uint64_t done = 0;
    while (done < count) {
      const std::size_t chunk = static_cast<std::size_t>(std::min<std::uint64_t>(count - done, std::uint64_t{1} << 30));
      const ssize_t wrote = ::write(fd_, bytes + done, chunk);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote < 0) fail("write");
      done += static_cast<std::uint64_t>(wrote);
    }
  }

  /// fsync, close, rename over the target, fsync the directory: after a crash the target is the old file or
  /// the new one, complete.
  void commit() {
    if (::fsync(fd_) != 0) fail("fsync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("close");
    if (std::rename(name_.c_str(), path_.c_str()) != 0) fail("rename");
    committed_ = true;
    const int dir = ::open(directory_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);  // makes the rename itself durable; best effort (some file systems refuse it)
      ::close(dir);
    }
  }

 private:
  [[noreturn]] void fail(const char* step) {
    const int error = errno;
    throw io_error(path_ + ": " + step + " failed: " + errno_text(error) +
                       " (the previous file, if any, is unchanged; check the free space and the directory)",
                   path_);
  }
  std::string path_, name_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `sources` and `metadata` to `path` atomically, in the order and layout of the reference writer:
/// sorted by dtype size (largest first, so every tensor is aligned to its element size) then by name, the
/// metadata first, the header padded with spaces to a multiple of 8 bytes.
inline void write_file(const std::string& path, std::vector<Source>& sources, const Metadata& metadata) {
  for (const auto& [key, value] : metadata) {
    try {
      (void)nlohmann::json(key).dump();
      (void)nlohmann::json(value).dump();
    } catch (const nlohmann::json::type_error&) {
      throw name_error("safetensors::save: the metadata entry " + quote_name(key) + " is not valid UTF-8");
    }
  }
  std::sort(sources.begin(), sources.end(), [](const Source& a, const Source& b) {
    const unsigned sa = dtype_bytes(a.dtype), sb = dtype_bytes(b.dtype);
    return sa != sb ? sa > sb : a.name < b.name;
  });
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) m[key] = value;
    json["__metadata__"] = std::move(m);
  }
  std::uint64_t offset = 0;
  for (const Source& s : sources) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = s.dtype;
    entry["shape"] = s.shape;
    entry["data_offsets"] = std::vector<std::uint64_t>{offset, offset + s.bytes};
    json[s.name] = std::move(entry);
    offset += s.bytes;
  }
  std::string text = json.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > max_header_bytes)
    throw io_error(path + ": the header would be " + std::to_string(text.size()) +
                       " bytes, over the format's limit of " + std::to_string(max_header_bytes) +
                       "; save the tensors in several files",
                   path);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));

  TemporaryFile out(path);
  out.write(length, 8);
  out.write(text.data(), text.size());
  for (const Source& s : sources) out.write(s.data, s.bytes);
  out.commit();
}

}  // namespace detail

/// Reads and validates the header of the safetensors file at `path` (every rule in this file's opening
/// comment; the tensors' bytes are not read): to see what a file holds before loading it.
/// Throws io_error if the file cannot be opened or read, format_error if it breaks the format.
inline Header read_header(const std::string& path) {
  const detail::InputFile file(path);
  return detail::parse_header(path, file);
}

/// Saves each entry's Parameter as a tensor of the entry's name, layout and dtype (F32 for float, F64 for
/// double), and each entry's std::int64_t as an I64 scalar [], with `metadata` as "__metadata__" (none if empty), to
/// the file at `path` (created or replaced).
///
/// Atomic: the file is written to a temporary file in the same directory (`path`.tmp.PID.N), flushed to the
/// disk (fsync) and renamed over `path`; a save that fails at any step removes the temporary file and leaves
/// the previous file at `path`, if any, unchanged, and a crash leaves the old file or the new one whole.
///
/// Throws name_error for an empty, repeated, reserved ("__metadata__") or non-UTF-8 name or metadata text,
/// or a Parameter given twice; shape_error for Layout::vector on a Parameter of more than one row (both
/// before anything is written); io_error if the file cannot be written (the message names the step and the
/// system's reason).
inline void save(const std::string& path, const std::vector<Entry>& entries, const Metadata& metadata = {}) {
  detail::check_entries(entries, "save");
  std::vector<detail::Source> sources;
  sources.reserve(entries.size());
  for (const Entry& e : entries)
    sources.push_back(
        e.int64_scalar() ? detail::make_source(e.name(), *e.int64_scalar())
        : e.float_parameter()
            ? detail::make_source(e.name(), e.float_parameter()->value(), e.float_parameter()->shape(), e.layout())
            : detail::make_source(e.name(), e.double_parameter()->value(), e.double_parameter()->shape(), e.layout()));
  detail::write_file(path, sources, metadata);
}

/// Loads the tensors of the file at `path` into the entries' Parameters (and integers), each from the tensor of its
/// name.
///
/// Checked before any Parameter changes: the whole file against the format (format_error), then that every
/// entry's name is in the file (but for an integer's entry made with required false, which a file may lack: it is
/// then left as it is), that each tensor's dtype is its Parameter's (F32 for float, F64 for double;
/// LoadOptions::convert_dtype converts between the two) and its shape fits the Parameter's [rows, cols] under
/// the entry's Layout, that an integer's tensor is an I64 scalar [], that the file has no tensor no entry names
/// (unless LoadOptions::allow_extra), and that
/// no backward is still reading a Parameter (mismatch_error, tape_error); then every tensor is read (an
/// io_error or a format_error if the file shrinks meanwhile). Only when all of that succeeded are the
/// Parameters assigned, in place (their buffers and shapes stay; their versions move on, so a tape that
/// recorded one of them refuses to backward with the new value), and the integers: a failed load leaves every
/// Parameter and integer as it was.
///
/// Throws name_error and shape_error as save does; io_error if the file cannot be opened or read;
/// format_error if it is not a valid safetensors file; mismatch_error as above; tape_error if a backward
/// still reads a Parameter (from a gradient-ready callback). Each message names the file and the tensor.
inline void load(const std::string& path, const std::vector<Entry>& entries, const LoadOptions& options = {}) {
  detail::check_entries(entries, "load");
  const detail::InputFile file(path);
  const Header header = detail::parse_header(path, file);

  std::vector<const TensorInfo*> tensors;
  std::string missing;
  std::size_t missing_count = 0;
  const std::string* first_missing = nullptr;
  std::size_t found = 0;
  for (const Entry& e : entries) {
    tensors.push_back(header.find(e.name()));
    if (tensors.back()) ++found;
    if (tensors.back() || !e.required()) continue;
    if (!first_missing) first_missing = &e.name();
    if (++missing_count <= 5) missing += (missing_count > 1 ? ", " : "") + detail::quote_name(e.name());
  }
  if (first_missing) {
    std::string present;
    for (std::size_t i = 0; i < header.tensors.size() && i < 8; ++i)
      present += (i ? ", " : "") + detail::quote_name(header.tensors[i].name);
    if (header.tensors.size() > 8) present += ", ... (" + std::to_string(header.tensors.size()) + " in all)";
    throw mismatch_error(path + ": has no tensor " + missing + (missing_count > 5 ? ", ..." : "") + " (" +
                             std::to_string(missing_count) + " missing); the file holds " +
                             (present.empty() ? std::string("no tensor") : present) +
                             ": check the names, or read_header() to list them",
                         path, *first_missing);
  }
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    if (!tensors[k]) continue;  // an entry not required, absent from the file
    const TensorInfo& t = *tensors[k];
    if (e.int64_scalar()) {
      detail::check_int64_scalar(path, t);
      continue;
    }
    const std::string into = "its Parameter";
    if (e.float_parameter())
      detail::check_dtype<float>(path, t, options, into);
    else
      detail::check_dtype<double>(path, t, options, into);
    const Index rows = e.float_parameter() ? e.float_parameter()->rows() : e.double_parameter()->rows();
    const Index cols = e.float_parameter() ? e.float_parameter()->cols() : e.double_parameter()->cols();
    const Shape dims = e.float_parameter() ? e.float_parameter()->shape() : e.double_parameter()->shape();
    if (!detail::shape_fits(t.shape, dims, rows, cols, e.layout()))
      throw detail::shape_mismatch(path, t, dims, rows, cols, e.layout());
  }
  if (!options.allow_extra && header.tensors.size() > found) {
    std::set<std::string> named;
    for (const Entry& e : entries) named.insert(e.name());
    std::string extra;
    std::size_t count = 0;
    const TensorInfo* first = nullptr;
    for (const TensorInfo& t : header.tensors) {
      if (named.count(t.name)) continue;
      if (!first) first = &t;
      if (++count <= 5) extra += (count > 1 ? ", " : "") + detail::quote_name(t.name);
    }
    throw mismatch_error(path + ": holds " + std::to_string(count) + " tensor" + (count == 1 ? "" : "s") +
                             " that no entry names: " + extra + (count > 5 ? ", ..." : "") +
                             "; name them, or pass LoadOptions::allow_extra = true to ignore them",
                         path, first->name);
  }
  // A backward that still reads a Parameter (a gradient-ready callback calling load) would make the commit
  // below throw half-way: checked for every Parameter first.
  for (const Entry& e : entries) {
    if (e.float_parameter())
      remat::detail::ParameterAccess::storage(*e.float_parameter())->check_not_read("safetensors::load");
    else if (e.double_parameter())
      remat::detail::ParameterAccess::storage(*e.double_parameter())->check_not_read("safetensors::load");
  }
  std::vector<Matrix<float>> floats(entries.size());
  std::vector<Matrix<double>> doubles(entries.size());
  std::vector<std::int64_t> integers(entries.size());
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    if (!tensors[k]) continue;
    if (e.int64_scalar())
      file.read_at(8 + header.header_bytes + tensors[k]->begin, &integers[k], sizeof(std::int64_t),
                   "tensor " + detail::quote_name(e.name()), e.name());
    else if (e.float_parameter())
      floats[k] = detail::read_matrix<float>(path, file, header, *tensors[k], e.float_parameter()->rows(),
                                             e.float_parameter()->cols(), e.layout());
    else
      doubles[k] = detail::read_matrix<double>(path, file, header, *tensors[k], e.double_parameter()->rows(),
                                               e.double_parameter()->cols(), e.layout());
  }
  // Nothing below throws: the shapes are the Parameters' own, so each assignment copies into the existing
  // buffer without allocating, and no backward reads them.
  for (std::size_t k = 0; k < entries.size(); ++k) {
    if (!tensors[k]) continue;
    if (entries[k].int64_scalar())
      *entries[k].int64_scalar() = integers[k];
    else if (entries[k].float_parameter())
      entries[k].float_parameter()->mutable_value() = floats[k];
    else
      entries[k].double_parameter()->mutable_value() = doubles[k];
  }
}

/// Saves named matrices, each as a tensor of shape [rows, cols] (F32 for float, F64 for double), atomically as
/// save does. Throws as save does (a name_error for an empty, reserved or non-UTF-8 name).
template <class T>
void save_matrices(const std::string& path, const std::map<std::string, Matrix<T>>& matrices,
                   const Metadata& metadata = {}) {
  std::vector<detail::Source> sources;
  for (const auto& [name, value] : matrices) {
    if (name.empty()) throw name_error("safetensors::save_matrices: a tensor name is empty");
    if (name == "__metadata__")
      throw name_error("safetensors::save_matrices: \"__metadata__\" is the format's name for the metadata");
    try {
      (void)nlohmann::json(name).dump();
    } catch (const nlohmann::json::type_error&) {
      throw name_error("safetensors::save_matrices: the tensor name " + detail::quote_name(name) +
                       " is not valid UTF-8");
    }
    sources.push_back(detail::make_source(name, value, Shape{value.rows(), value.cols()}, Layout::matrix));
  }
  detail::write_file(path, sources, metadata);
}

/// Loads every tensor of the file at `path` as a matrix of T, by name: a [r, c] tensor as [r, c], a 1-D [n] as
/// [1, n], a scalar [] as [1, 1]. Throws io_error and format_error as load does; mismatch_error for a tensor
/// of rank 3 or more (remat's matrices are 2-D), or of a dtype other than T's (F32 and F64 convert with
/// LoadOptions::convert_dtype; allow_extra has no effect here). Returns nothing until every tensor was read.
template <class T>
std::map<std::string, Matrix<T>> load_matrices(const std::string& path, const LoadOptions& options = {}) {
  const detail::InputFile file(path);
  const Header header = detail::parse_header(path, file);
  for (const TensorInfo& t : header.tensors) {
    if (t.shape.size() > 2)
      throw mismatch_error(path + ": tensor " + detail::quote_name(t.name) + " has rank " +
                               std::to_string(t.shape.size()) + " (shape " + detail::shape_text(t.shape) +
                               "); remat's matrices are 2-D: reshape it in PyTorch and save it again",
                           path, t.name);
    for (const std::uint64_t d : t.shape)
      if (d > static_cast<std::uint64_t>(std::numeric_limits<Index>::max()))
        throw mismatch_error(path + ": tensor " + detail::quote_name(t.name) + "'s shape " +
                                 detail::shape_text(t.shape) + " does not fit a matrix's index type",
                             path, t.name);
    detail::check_dtype<T>(path, t, options, "the matrix");
  }
  std::map<std::string, Matrix<T>> out;
  for (const TensorInfo& t : header.tensors) {
    const Index rows = t.shape.size() == 2 ? static_cast<Index>(t.shape[0]) : 1;
    const Index cols = t.shape.empty() ? 1 : static_cast<Index>(t.shape.back());
    out.emplace(t.name, detail::read_matrix<T>(path, file, header, t, rows, cols, Layout::matrix));
  }
  return out;
}

}  // namespace remat::safetensors
