// A trainable matrix that tapes reference without copying: value, version counter and gradient.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"

namespace remat {
namespace detail {

/// What a Parameter owns. Tape nodes and optimizers share it (std::shared_ptr), so a Parameter that is
/// destroyed or moved (a std::vector<Parameter> reallocating) never leaves them a dangling pointer.
template <class T>
struct ParameterStorage {
  Matrix<T> value;
  std::uint64_t version = 0;
  // Assignments to the owning Parameter and moves out of it. After one, the object that holds this storage
  // no longer holds the value a tape recorded, so a gradient for that value has no right place to go.
  std::uint64_t assignments = 0;
  T* grad = nullptr;  // grad_size elements, Eigen-aligned (interchangeable with tape pool buffers), or null
  Index grad_size = 0;
  bool grad_defined = false;          // false: the gradient is zero (nothing added since zero_grad or creation)
  std::uint64_t simulated_sweep = 0;  // a tape's dry run of a backward: the serial of the run that defined grad
  // Backward sweeps running now that may still read `value`: a sweep that calls gradient-ready callbacks
  // (the user code it calls between ops) counts itself here until the Parameter's gradient is complete (its
  // leaves' gradients delivered), after which nothing in it reads the value. While it is not zero the value must not
  // change.
  std::atomic<std::uint32_t> sweeps_reading{0};
  // The N-D dimensions the value was given as (Parameter(const Tensor&)); `value` holds their matrix view. Stale,
  // and shape() then [rows, cols], once the value is resized to another matrix view (mutable_value()). Last: a
  // Shape is 72 bytes, and in the middle it put what every record and backward reads on three cache lines.
  Shape dims;

  ParameterStorage() = default;
  ParameterStorage(const ParameterStorage&) = delete;
  ParameterStorage& operator=(const ParameterStorage&) = delete;
  ~ParameterStorage() { Eigen::internal::aligned_free(grad); }

  /// Makes `grad` hold value.size() elements (contents unspecified). Throws std::bad_alloc.
  void reserve_grad() {
    if (grad && grad_size == value.size()) return;
    T* p = static_cast<T*>(Eigen::internal::aligned_malloc(static_cast<std::size_t>(value.size()) * sizeof(T)));
    Eigen::internal::aligned_free(grad);
    grad = p;
    grad_size = value.size();
    grad_defined = false;
  }
  /// Throws shape_error naming `op` if the gradient is defined but not of the value's size: the value was
  /// resized (mutable_value()) after a backward or mutable_grad() wrote the gradient, which then holds too
  /// few or too many elements to be read as the value's shape.
  void check_grad_size(const char* op) const {
    if (grad_defined && grad_size != value.size())
      throw shape_error(std::string(op) + ": the Parameter's gradient has " + std::to_string(grad_size) +
                        " elements but its value is " + to_string(Shape{value.rows(), value.cols()}) +
                        " (resized after the gradient was written); call zero_grad() after resizing a parameter");
  }
  /// The value's shape: its N-D dimensions when it was made from a tensor and still has their matrix view,
  /// else [rows, cols].
  Shape shape() const {
    if (dims.rank() != 2 && dims.rows() == value.rows() && dims.cols() == value.cols()) return dims;
    return Shape{value.rows(), value.cols()};
  }
  bool being_read() const { return sweeps_reading.load(std::memory_order_relaxed) != 0; }
  /// Throws tape_error naming `op` if a backward still reads the value (sweeps_reading): changing it there
  /// would give the sweep a value other than the recorded one, or free the buffer it reads.
  void check_not_read(const char* op) const {
    if (being_read())
      throw tape_error(std::string(op) +
                       ": a backward still reads this Parameter's value (a gradient-ready callback may change a " +
                       "Parameter from its own call on, once that Parameter's gradient is ready, or after " +
                       "backward() returns); nothing was changed");
  }
  /// The gradient as a matrix of the value's shape; zero-filled (still "undefined") if nothing was added.
  /// Throws shape_error if the value was resized since the gradient was written (check_grad_size).
  Eigen::Map<Matrix<T>> grad_matrix() {
    check_grad_size("Parameter::grad");
    if (!grad_defined) {
      reserve_grad();
      std::fill(grad, grad + grad_size, T(0));
    }
    return Eigen::Map<Matrix<T>>(grad, value.rows(), value.cols());
  }
  void copy_grad_from(const ParameterStorage& other) {
    other.check_grad_size("Parameter: copy");
    grad_defined = false;
    if (!other.grad_defined) return;
    reserve_grad();
    std::copy(other.grad, other.grad + grad_size, grad);
    grad_defined = true;
  }
};

struct ParameterAccess;

/// Frees an Eigen::internal::aligned_malloc'ed buffer (a gradient being copied, before it is committed).
struct AlignedFree {
  void operator()(void* p) const noexcept { Eigen::internal::aligned_free(p); }
};

}  // namespace detail

/// A trainable weight matrix owned by the user (or a layer) across training steps, with its gradient.
///
/// Tape::variable(Parameter&) records a reference, not a copy, together with the current version.
/// Every call of mutable_value() (and every assignment) increments the version; if a backward pass or
/// a checkpoint replay would read a parameter whose version changed since it was recorded, the tape
/// throws remat::stale_value_error instead of computing a gradient from the modified value (the
/// mechanism PyTorch calls a version counter). Write through mutable_value() only.
///
/// Gradients accumulate as in PyTorch: every Tape::backward adds d loss / d parameter into grad();
/// zero_grad() clears it. So micro-batch accumulation is: for each micro-batch, record on a tape and
/// backward; then the optimizer step; then zero_grad.
///
/// The value, version and gradient live in storage shared with the tapes and optimizers that reference
/// the parameter: moving a Parameter (or a std::vector of them reallocating) keeps those references
/// valid, and a Parameter destroyed before backward still receives its gradient in the shared storage.
/// Copying makes an independent parameter (value, version and gradient copied).
///
/// Assignment replaces the value but keeps the object's storage, so an optimizer that references the
/// object goes on updating it (`layer.W = Parameter(loaded)` after building the optimizer works). A tape
/// that recorded either side of an assignment (the assigned-to object, or the moved-from one) before it
/// refuses to backward into them: Tape::backward throws remat::stale_value_error rather than give the
/// recorded value's gradient to the value that replaced it (std::swap, std::vector::erase, std::sort of
/// recorded Parameters between forward and backward all assign).
template <class T>
class Parameter {
 public:
  /// An empty [0,0] parameter.
  Parameter() : storage_(std::make_shared<detail::ParameterStorage<T>>()) {}
  /// A parameter holding `value`, version 0, gradient zero.
  explicit Parameter(Matrix<T> value) : Parameter() { storage_->value = std::move(value); }
  /// A parameter of the N-D `value` (row-major, any rank up to Shape::max_rank), e.g. a convolution's weight
  /// [out, in, kh, kw]; value() is its matrix view [product of the leading dimensions, last dimension].
  template <int Rank>
  explicit Parameter(const Tensor<T, Rank>& value) : Parameter() {
    const Shape s = shape_of(value);
    storage_->value = Eigen::Map<const Matrix<T>>(value.data(), s.rows(), s.cols());
    storage_->dims = s;
  }
  /// An independent copy: value, version and gradient copied into new storage.
  Parameter(const Parameter& other) : Parameter() {
    storage_->value = other.value();
    storage_->dims = other.shape();
    storage_->version = other.version();
    if (other.storage_) storage_->copy_grad_from(*other.storage_);
  }
  /// The storage moves with the object: tapes and optimizers that referenced `other` now reference this.
  /// `other` is left empty (0×0) and may be assigned to or destroyed.
  Parameter(Parameter&& other) noexcept = default;

  /// Replaces the value (and gradient): a modification, so the version moves past both operands' versions
  /// and a tape that recorded this parameter becomes stale. Tapes and optimizers keep referencing this
  /// object's storage. Assigning a handle of the same storage (itself, or the Parameter a gradient-ready
  /// callback receives) changes nothing. Throws shape_error if `other`'s gradient no longer fits its value
  /// (resized after the gradient was written), tape_error as mutable_value() does (inside a gradient-ready
  /// callback, while a backward still reads this value), std::bad_alloc; this parameter is unchanged then.
  Parameter& operator=(const Parameter& other) {
    if (other.storage_ && other.storage_ == storage_) return *this;
    auto& s = storage();
    s.check_not_read("Parameter: assignment");
    const detail::ParameterStorage<T>* o = other.storage_.get();
    if (o) o->check_grad_size("Parameter: copy");
    // Copies made first, so that a std::bad_alloc leaves this parameter as it was. A value of the same
    // shape is copied in place below (no allocation), so its buffer stays where tapes recorded it.
    const bool same_shape = s.value.rows() == other.rows() && s.value.cols() == other.cols();
    Matrix<T> value;
    if (!same_shape) value = other.value();
    const bool copy_grad = o && o->grad_defined;
    std::unique_ptr<T, detail::AlignedFree> grad;  // a new buffer, unless this one's has the size already
    if (copy_grad && !(s.grad && s.grad_size == o->grad_size))
      grad.reset(static_cast<T*>(Eigen::internal::aligned_malloc(static_cast<std::size_t>(o->grad_size) * sizeof(T))));
    // Nothing below throws.
    const std::uint64_t next = std::max(s.version, other.version()) + 1;
    if (same_shape)
      s.value = other.value();  // same shape: Eigen copies into the existing buffer
    else
      s.value.swap(value);
    if (grad) {
      Eigen::internal::aligned_free(s.grad);
      s.grad = grad.release();
      s.grad_size = o->grad_size;
    }
    if (copy_grad) std::copy(o->grad, o->grad + o->grad_size, s.grad);
    s.dims = other.shape();
    s.grad_defined = copy_grad;
    s.version = next;
    ++s.assignments;
    return *this;
  }
  /// As copy assignment; `other`'s value moves out, which also makes `other` stale for tapes that
  /// recorded it. Moving a handle of the same storage changes nothing. Throws tape_error, changing neither,
  /// while a backward still reads either value (inside a gradient-ready callback).
  Parameter& operator=(Parameter&& other) {
    if (this == &other || (other.storage_ && other.storage_ == storage_)) return *this;
    if (!other.storage_) return *this = Parameter();
    auto& s = storage();
    auto& o = *other.storage_;
    s.check_not_read("Parameter: move assignment");
    o.check_not_read("Parameter: move assignment (the moved-from Parameter)");
    const std::uint64_t next = std::max(s.version, o.version) + 1;
    s.value = std::move(o.value);
    s.dims = o.dims;
    std::swap(s.grad, o.grad);
    std::swap(s.grad_size, o.grad_size);
    s.grad_defined = o.grad_defined;
    o.grad_defined = false;
    s.version = next;
    o.value = Matrix<T>();
    ++o.version;
    ++s.assignments;
    ++o.assignments;
    return *this;
  }

  /// The value (read only; write through mutable_value()).
  const Matrix<T>& value() const { return storage_ ? storage_->value : empty(); }
  /// Write access; marks the parameter modified (any tape that recorded it becomes stale). Throws tape_error,
  /// changing nothing, inside a gradient-ready callback for a Parameter whose gradient is not ready yet (the
  /// backward still reads its value; Tape::on_gradient_ready).
  Matrix<T>& mutable_value() {
    auto& s = storage();
    s.check_not_read("Parameter::mutable_value");
    ++s.version;
    return s.value;
  }
  /// How many times the value was modified (mutable_value(), assignment): the version counter.
  std::uint64_t version() const { return storage_ ? storage_->version : 0; }
  Index rows() const { return value().rows(); }  ///< rows of the value (of its matrix view)
  Index cols() const { return value().cols(); }  ///< columns of the value (its last dimension)
  /// The value's shape: the N-D dimensions it was made from (Parameter(const Tensor&)) while the value keeps
  /// their matrix view, else [rows, cols].
  Shape shape() const { return storage_ ? storage_->shape() : Shape{}; }
  /// The value as a rank-`Rank` tensor view, e.g. `weight.value<4>()`. Throws shape_error for another rank.
  template <int Rank>
  TensorView<T, Rank> value() const {
    return TensorView<T, Rank>(value().data(), detail::tensor_dims<Rank>(shape(), "value"));
  }
  /// The gradient as a rank-`Rank` tensor view. Throws shape_error for another rank, and what grad() throws.
  template <int Rank>
  TensorView<T, Rank> grad() const {
    return TensorView<T, Rank>(grad().data(), detail::tensor_dims<Rank>(shape(), "grad"));
  }

  /// d loss / d parameter summed over the backward passes since the last zero_grad(), of the value's
  /// shape (zeros if none). Throws std::bad_alloc, and shape_error if the value was resized after the
  /// gradient was written (call zero_grad() after resizing).
  MatrixView<T> grad() const {
    if (!storage_ || value().size() == 0) return MatrixView<T>(nullptr, rows(), cols());
    auto g = storage_->grad_matrix();
    return MatrixView<T>(g.data(), g.rows(), g.cols());
  }
  /// Write access to the gradient (e.g. for clipping or to set it by hand); marks it defined. Throws as
  /// grad().
  Eigen::Map<Matrix<T>> mutable_grad() {
    auto& s = storage();
    auto g = s.grad_matrix();
    s.grad_defined = true;
    return g;
  }
  /// True when some backward (or mutable_grad) wrote the gradient since the last zero_grad().
  bool has_grad() const { return storage_ && storage_->grad_defined; }
  /// Clears the gradient (the next backward assigns instead of adding); keeps its buffer for reuse.
  void zero_grad() {
    if (storage_) storage_->grad_defined = false;
  }

 private:
  friend struct detail::ParameterAccess;
  /// Another handle on `storage` (detail::ParameterAccess::share).
  explicit Parameter(std::shared_ptr<detail::ParameterStorage<T>> storage) noexcept : storage_(std::move(storage)) {}
  static const Matrix<T>& empty() {
    static const Matrix<T> e;
    return e;
  }
  detail::ParameterStorage<T>& storage() {
    if (!storage_) storage_ = std::make_shared<detail::ParameterStorage<T>>();
    return *storage_;
  }

  std::shared_ptr<detail::ParameterStorage<T>> storage_;
};

namespace detail {
/// The tape's and the optimizers' access to a Parameter's shared storage.
struct ParameterAccess {
  template <class T>
  static std::shared_ptr<ParameterStorage<T>> storage(Parameter<T>& p) {
    p.storage();
    return p.storage_;
  }
  /// A Parameter object sharing `storage` with the Parameter it belongs to (value, version, gradient): what
  /// a gradient-ready callback receives, since a tape holds the storage, not the user's object.
  template <class T>
  static Parameter<T> share(std::shared_ptr<ParameterStorage<T>> storage) noexcept {
    return Parameter<T>(std::move(storage));
  }
  /// The identity of `p`'s storage (stable across moves of `p`); null for an empty moved-from Parameter.
  template <class T>
  static const ParameterStorage<T>* identity(const Parameter<T>& p) noexcept {
    return p.storage_.get();
  }
};
}  // namespace detail

}  // namespace remat
