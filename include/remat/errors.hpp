// The exceptions remat throws. Every message names the operation and the shapes or values involved.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace remat {

/// Operand shapes do not fit the operation, e.g. "matmul: A is [3,4] but B is [5,2]; A.cols must equal B.rows".
class shape_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An index argument is out of range, e.g. a class label in cross_entropy.
class index_error : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

/// A scalar argument is outside the operation's domain, e.g. dropout with p = 1.
class domain_error : public std::domain_error {
 public:
  using std::domain_error::domain_error;
};

/// A memory budget cannot be met, all figures in bytes. From checkpoint_sequential_auto: no schedule keeps
/// the tape's peak_bytes within it; needed_bytes() is the peak the leanest schedule reaches and
/// least_budget_bytes() the smallest budget that works. From a tape under Tape::set_memory_budget (DTR): an
/// allocation cannot be served even after evicting everything evictable; needed_bytes() is that allocation's
/// size and least_budget_bytes() the live bytes nothing could evict then plus needed_bytes() (a lower bound
/// for the call: no smaller budget serves that allocation from that state). Derives from domain_error: the
/// budget is a scalar argument outside what the operation can do.
class memory_budget_error : public domain_error {
 public:
  /// `what` is the message; the three figures are in bytes (see the class comment).
  memory_budget_error(const std::string& what, std::size_t budget_bytes, std::size_t needed_bytes,
                      std::size_t least_budget_bytes)
      : domain_error(what), budget_(budget_bytes), needed_(needed_bytes), least_(least_budget_bytes) {}
  std::size_t budget_bytes() const noexcept { return budget_; }       ///< the budget asked for
  std::size_t needed_bytes() const noexcept { return needed_; }       ///< see the class comment
  std::size_t least_budget_bytes() const noexcept { return least_; }  ///< see the class comment

 private:
  std::size_t budget_, needed_, least_;
};

/// Anomaly detection (Tape::set_detect_anomaly, torch.autograd.set_detect_anomaly's role) found a NaN or an
/// infinity: in a leaf's data, in an op's forward value, or in a gradient an op's backward wrote. The message
/// names the node, its op and shape, the first non-finite element, and for a backward the forward op whose
/// backward wrote it; node() is that node's id (the op whose forward produced the value, or whose backward
/// wrote the gradient).
class anomaly_error : public std::runtime_error {
 public:
  /// `what` is the message, `node` the id of the node it names.
  anomaly_error(const std::string& what, std::int32_t node) : std::runtime_error(what), node_(node) {}
  /// The node whose forward made the value, or whose backward wrote the gradient (its id on the tape).
  std::int32_t node() const noexcept { return node_; }

 private:
  std::int32_t node_;
};

/// Misuse of a tape: a Var from another tape or from a cleared tape, an empty Var, a region nested too deep.
class tape_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// A value or residual that was already freed is needed: another backward after one without retain_graph
/// (over the same graph, or over a step recorded on the tape without clear() before it), or value() of an
/// interior value the tape released.
class freed_value_error : public tape_error {
 public:
  using tape_error::tape_error;
};

/// A Parameter recorded on the tape was modified (Parameter::mutable_value()) before backward used it;
/// the gradient would be computed from the wrong value.
class stale_value_error : public tape_error {
 public:
  using tape_error::tape_error;
};

/// A value or gradient was read on a shapes-only tape (Tape(remat::shapes_only), remat::estimate_memory), which
/// records shapes and counts bytes but computes nothing, or an op that cannot be estimated was recorded on
/// one. The message names what was read (the node, its op and shape) or the op.
class shapes_only_error : public tape_error {
 public:
  using tape_error::tape_error;
};

/// A file cannot be read or written, or what it holds is not what the reader was asked for (remat/io/). what()
/// names the file, the tensor where one is concerned, and what to do about it; path() and tensor() return the
/// two names (tensor() is empty for a problem of the whole file). A runtime condition, not a misuse of the API:
/// the same call succeeds with another file or once the file system lets it.
class io_error : public std::runtime_error {
 public:
  /// `what` is the message; `path` the file, `tensor` the tensor concerned (empty: the whole file).
  io_error(const std::string& what, std::string path, std::string tensor = {})
      : std::runtime_error(what),
        names_(std::make_shared<const std::pair<std::string, std::string>>(std::move(path), std::move(tensor))) {}
  const std::string& path() const noexcept { return names_->first; }     ///< the file
  const std::string& tensor() const noexcept { return names_->second; }  ///< the tensor, or empty

 private:
  // Shared, so that copying the exception (as throwing does) cannot throw.
  std::shared_ptr<const std::pair<std::string, std::string>> names_;
};

/// The file breaks the rules of its format: truncated, a header length beyond the file, malformed JSON, offsets
/// that overlap or leave a hole, an unknown dtype, ... Another copy of the file is needed.
class format_error : public io_error {
 public:
  using io_error::io_error;
};

/// A well-formed file does not fit what it is being loaded into: a tensor is missing, the file has tensors
/// nobody asked for, or a tensor's dtype or shape differs from its destination's.
class mismatch_error : public io_error {
 public:
  using io_error::io_error;
};

/// A name given to a save or load is empty, given twice, reserved by the format, or not valid UTF-8; or one
/// Parameter is given under two names.
class name_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A double as error messages write it: the shortest decimal text that reads back as `x` exactly (std::to_chars),
/// "0.001", "1e-09", "inf", "nan", where std::to_string would write "0.000000" (at most 24 characters; allocates
/// the string only). For an op's message about a floating-point attribute, as clamp's and layer_norm's.
inline std::string number_text(double x) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, x).ptr;
  return std::string(text, end);
}

}  // namespace remat
