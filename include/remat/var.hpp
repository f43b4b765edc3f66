// Var<T>: a handle to a value recorded on a tape.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "remat/detail/tape_state.hpp"

namespace remat {

template <class T>
class Tape;
template <class T>
class Var;

namespace detail {
/// The tape's and the library's access to a Var's internals (its tape state, node id and node), which are not
/// part of the public API: an op reaches the tape only through the op recipe (remat/op.hpp).
struct VarAccess {
  template <class T>
  static TapeState<T>* state(const Var<T>& v) {
    return v.state_;
  }
  template <class T>
  static std::int32_t id(const Var<T>& v) {
    return v.id_;
  }
  /// The node `v` refers to; throws tape_error (empty or stale handle) or freed_value_error naming `op`.
  template <class T>
  static const Node<T>& node(const Var<T>& v, const char* op) {
    return v.node(op);
  }
  /// A handle to node `id`, whose handle count already includes it (right after recording).
  template <class T>
  static Var<T> adopt(TapeState<T>* state, std::int32_t id) {
    return Var<T>::adopt(state, id);
  }
};
}  // namespace detail

/// Handle to one value on a tape (a leaf or an op's output). Copying a Var is cheap (two counter
/// increments). While any handle to a value exists the tape keeps the value; once the last handle is
/// gone the tape keeps it only if a pending backward or checkpoint replay reads it (docs/design.md §2). A Var may
/// outlive its Tape; using it afterwards (or after Tape::clear()) throws remat::tape_error.
template <class T>
class Var {
 public:
  /// An empty handle (valid() is false).
  Var() = default;
  /// Another handle to the same value: the tape keeps the value while any handle refers to it.
  Var(const Var& other) : state_(other.state_), id_(other.id_), generation_(other.generation_) { acquire(); }
  /// Takes over other's reference; other becomes empty.
  Var(Var&& other) noexcept : state_(other.state_), id_(other.id_), generation_(other.generation_) {
    other.state_ = nullptr;
  }
  /// Refers to what other refers to (the old value's reference is released).
  Var& operator=(Var other) noexcept {
    swap(other);
    return *this;
  }
  ~Var() { release(); }

  /// Exchanges the two handles' references.
  void swap(Var& other) noexcept {
    std::swap(state_, other.state_);
    std::swap(id_, other.id_);
    std::swap(generation_, other.generation_);
  }

  /// True when the handle refers to a value on a tape that has not been cleared since.
  bool valid() const { return state_ && state_->generation() == generation_; }

  /// The value, [rows, cols]. Throws tape_error for an empty or stale handle, shapes_only_error on a
  /// shapes-only tape (Tape(remat::shapes_only), remat::estimate_memory), which computes no value.
  ///
  /// Under a memory budget (Tape::set_memory_budget) an evicted value is regenerated first (its recorded op
  /// re-run from its inputs, which may evict others; throws memory_budget_error if the budget cannot hold it,
  /// with the tape unchanged), and the view stays valid only until the next call that may evict (recording,
  /// backward, another value()): copy it (`Matrix<T> m = v.value();`) to keep it.
  MatrixView<T> value() const {
    const auto& n = node("value");
    state_->check_has_numbers("value", id_, "value");
    state_->check_parameter(id_, "value");  // a modified Parameter's storage (or a view's of it) may have moved
    state_->materialize(id_, "value");
    return MatrixView<T>(n.value, n.shape.rows(), n.shape.cols());
  }

  /// The value as a rank-`Rank` tensor (Eigen::TensorMap, row-major), e.g. `v.value<4>()` of an [N,C,H,W] value;
  /// the same buffer as value(), valid as long. Throws shape_error if the value's rank is not `Rank`, and what
  /// value() throws.
  template <int Rank>
  TensorView<T, Rank> value() const {
    const auto dims = detail::tensor_dims<Rank>(node("value").shape, "value");
    return TensorView<T, Rank>(value().data(), dims);
  }

  /// The value of a [1,1] Var as a scalar. Throws shape_error otherwise, shapes_only_error on a shapes-only
  /// tape.
  T item() const {
    const auto& n = node("item");
    state_->check_has_numbers("item", id_, "value");
    state_->check_parameter(id_, "item");  // as value()
    if (n.shape.rows() != 1 || n.shape.cols() != 1)
      throw shape_error("item: the value is " + to_string(n.shape) + ", not [1,1]");
    state_->materialize(id_, "item");
    return n.value[0];
  }

  /// d loss / d this for a variable, same shape as the value: the sum over every Tape::backward since
  /// the variable was recorded (or since zero_grad()); zeros before any. For a variable recorded from a
  /// remat::Parameter this is the Parameter's gradient (Parameter::grad()). Throws tape_error for a
  /// constant or an interior value (use Tape::gradient() for those), shapes_only_error on a shapes-only
  /// tape, std::bad_alloc.
  MatrixView<T> grad() const {
    const auto& n = node("grad");
    if (!n.is_variable)
      throw tape_error("grad: node #" + std::to_string(id_) + " (" + state_->node_name(id_) +
                       ") keeps no gradient; only variables do (use tape.gradient(loss, {v}) for other values)");
    return state_->variable_grad(id_);
  }

  /// The gradient as a rank-`Rank` tensor, e.g. `w.grad<4>()`: the same buffer as grad(). Throws shape_error if
  /// the value's rank is not `Rank`, and what grad() throws.
  template <int Rank>
  TensorView<T, Rank> grad() const {
    const auto dims = detail::tensor_dims<Rank>(node("grad").shape, "grad");
    return TensorView<T, Rank>(grad().data(), dims);
  }

  /// Clears a variable's accumulated gradient (for a Parameter-backed variable, the Parameter's; on a
  /// shapes-only tape the Parameter is left as it is). Throws tape_error for a constant or an interior value.
  void zero_grad() const {
    const auto& n = node("zero_grad");
    if (!n.is_variable)
      throw tape_error("zero_grad: node #" + std::to_string(id_) + " (" + state_->node_name(id_) +
                       ") is not a variable");
    state_->zero_variable_grad(id_);
  }

  /// The value's shape. Throws tape_error for an empty or stale handle, as rows() and cols() do; its message
  /// starts with `op` (an op's public function passes its own name).
  Shape shape(const char* op = "shape") const { return node(op).shape; }
  Index rows() const { return shape().rows(); }  ///< shape().rows(): rows of the matrix view
  Index cols() const { return shape().cols(); }  ///< shape().cols(): the last dimension
  int dim() const { return shape().rank(); }     ///< the number of dimensions (torch.Tensor.dim())
  /// Dimension d (torch.Tensor.size(d)); a negative d counts from the end. Throws index_error outside
  /// [-dim(), dim()).
  Index size(int d) const {
    const Shape s = shape();
    return s[wrap_dim(d, s.rank(), "size")];
  }
  /// True for a variable (a leaf that receives a gradient).
  bool is_variable() const { return node("is_variable").is_variable; }
  /// True when the value depends on a variable.
  bool requires_grad() const { return node("requires_grad").requires_grad; }

  /// Whether both handles refer to the same value (torch.Tensor.is_same): an op that returns its input as it is
  /// (dropout in evaluation, concat of one part) returns a handle for which this is true.
  bool is_same(const Var& other) const {
    return valid() && other.valid() && state_ == other.state_ && id_ == other.id_;
  }

 private:
  friend struct detail::VarAccess;

  /// The node this handle refers to. Throws tape_error for an empty Var or one whose tape was cleared or
  /// destroyed, freed_value_error if its value was freed (an evicted value is not: it is regenerated when
  /// read); `op` names the caller in the message.
  const detail::Node<T>& node(const char* op) const {
    // Every input of every record comes through here: the checks inline, the messages do not.
    if (!state_ || state_->generation() != generation_) throw_invalid(op);
    const auto& n = state_->node(id_);
    if (!n.value && !n.evicted) throw_freed(op);  // an evicted value (a memory budget) is regenerated when read
    return n;
  }

  /// Adopts a node whose handle count already includes this handle (used right after recording).
  static Var adopt(detail::TapeState<T>* state, std::int32_t id) {
    Var v;
    v.state_ = state;
    v.id_ = id;
    v.generation_ = state->generation();
    state->add_ref();
    return v;
  }

  [[noreturn]] void throw_invalid(const char* op) const {
    if (!state_) throw tape_error(std::string(op) + ": empty Var (default-constructed or moved from)");
    throw tape_error(std::string(op) + ": the Var's tape was cleared or destroyed after the Var was recorded");
  }
  [[noreturn]] void throw_freed(const char* op) const {
    throw freed_value_error(std::string(op) + ": the value of node #" + std::to_string(id_) + " was freed");
  }
  void acquire() {
    if (!state_) return;
    state_->add_ref();
    if (state_->generation() == generation_) state_->acquire_handle(id_);
  }
  void release() {
    if (!state_) return;
    if (state_->generation() == generation_) state_->release_handle(id_);
    state_->drop_ref();
    state_ = nullptr;
  }

  detail::TapeState<T>* state_ = nullptr;
  std::int32_t id_ = -1;
  std::uint32_t generation_ = 0;
};

}  // namespace remat
