// The shape of a tensor: its dimensions, row-major and contiguous as PyTorch's default strides.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/errors.hpp"

namespace remat {

using Index = Eigen::Index;

/// The dimensions of a tensor, outermost first (torch.Size's role). Values are row-major and contiguous: the
/// last dimension varies fastest. At most Shape::max_rank dimensions; rank 0 is a scalar with one element
/// (Shape::scalar()). A shape with a zero dimension has no elements: `Shape{}` is [0,0], the empty shape, which an
/// op's extra_shape or scratch_shape returns for "none" (as in remat's 2-D versions).
///
/// Every shape also reads as a matrix: rows() × cols() with cols() the last dimension and rows() the product of
/// the others (1 × n for a vector, 1 × 1 for a scalar). That view is the same buffer, so an op that works on
/// rows (softmax over the last dimension, layer_norm, linear) works on any rank through it.
class Shape {
 public:
  static constexpr int max_rank = 8;  ///< the most dimensions a shape holds

  /// [0,0]: no elements (an op recipe's "none").
  constexpr Shape() = default;
  /// Rank 0: a scalar, one element (torch.Size([])).
  static Shape scalar() {
    Shape s;
    s.rank_ = 0;
    return s;
  }
  /// The given dimensions, e.g. Shape{2, 3, 8, 8}. Throws shape_error for more than max_rank dimensions. Any
  /// value is kept (ops check theirs: a negative dimension throws shape_error when an op is recorded).
  Shape(std::initializer_list<Index> dims) {
    if (dims.size() == 2) {  // most shapes: two stores once inlined, not a call (Shape{rows, cols} on every leaf)
      dims_[0] = dims.begin()[0];
      dims_[1] = dims.begin()[1];
    } else {
      assign(dims.begin(), dims.end());
    }
  }
  /// The dimensions in `dims`; throws as the list constructor does.
  explicit Shape(const std::vector<Index>& dims) { assign(dims.data(), dims.data() + dims.size()); }

  int rank() const { return rank_; }                            ///< the number of dimensions
  Index operator[](int d) const { return dims_[d]; }            ///< dimension d, 0 ≤ d < rank()
  Index& operator[](int d) { return dims_[d]; }                 ///< dimension d, 0 ≤ d < rank()
  const Index* begin() const { return dims_; }                  ///< the first dimension
  const Index* end() const { return dims_ + rank_; }            ///< one past the last dimension
  std::vector<Index> dims() const { return {begin(), end()}; }  ///< the dimensions as a vector

  /// The number of elements: the product of the dimensions (1 for a scalar).
  [[gnu::always_inline]] Index numel() const {
    if (rank_ == 2) return dims_[0] * dims_[1];  // most shapes: a product, not a loop, on every op's paths
    return numel(0, rank_);
  }
  /// The number of elements of dimensions [begin, end): their product, 1 for none (0 ≤ begin ≤ end ≤ rank(),
  /// unchecked, as operator[]). What an op working along dimension d reads x as: x.numel(0, d) outer rows of x[d]
  /// blocks of x.numel(d + 1, x.rank()) elements.
  Index numel(int begin, int end) const { return product(dims_ + begin, dims_ + end); }
  /// The number of elements, as numel() (the name 2-D code used).
  Index size() const { return numel(); }
  /// Rows of the matrix view: the product of every dimension but the last (1 below rank 2).
  [[gnu::always_inline]] Index rows() const {
    if (rank_ == 2) return dims_[0];  // most shapes, read by every kernel's context
    return rank_ == 0 ? 1 : product(dims_, dims_ + rank_ - 1);
  }
  /// Columns of the matrix view: the last dimension (1 for a scalar).
  [[gnu::always_inline]] Index cols() const {
    if (rank_ == 2) return dims_[1];  // most shapes: a load, not an index computed from the rank
    return rank_ == 0 ? 1 : dims_[rank_ - 1];
  }

  /// Same rank and dimensions.
  friend bool operator==(const Shape& a, const Shape& b) {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }
  /// Some dimension or the rank differs.
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  template <class It>
  [[gnu::noinline]] void assign(It first, It last) {
    if (last - first > max_rank) throw_too_many(last - first);
    std::int32_t rank = 0;
    for (It it = first; it != last; ++it) dims_[rank++] = static_cast<Index>(*it);
    rank_ = rank;
  }
  // The loop of numel(), rows() and numel(begin, end) beyond rank 2, out of line, so that numel(), rows() and cols()
  // are a test and a load or two wherever they are inlined (always: every context accessor, allocation and record
  // reads them, and the inliner, left to itself, made some of them calls in W0's step).
  [[gnu::noinline]] static Index product(const Index* first, const Index* last) noexcept {
    Index n = 1;
    for (; first < last; ++first) n *= *first;
    return n;
  }
  [[noreturn]] static void throw_too_many(std::ptrdiff_t rank) {
    throw shape_error("Shape: " + std::to_string(rank) + " dimensions; remat holds at most " +
                      std::to_string(max_rank));
  }

  // The rank first: what rows(), cols() and numel() read is then the shape's first bytes, one cache line with
  // the outer dimensions (after the eight dimensions it was a line of its own for a node's shape).
  std::int32_t rank_ = 2;
  Index dims_[max_rank] = {};
};

/// A read-only view of a contiguous list of E (c10::ArrayRef's role): what the ops taking a list of sizes or dims
/// (reshape, view, permute, sum, mean, max) take, so that `reshape(x, {4, -1})` or a list kept by the caller reads
/// the elements where they are, with no copy and no allocation. It converts from a std::vector, a std::array and
/// a braced list; it refers to them and must not outlive them (as a parameter, the list lives until the call
/// returns).
template <class E>
class ArrayRef {
 public:
  /// An empty list.
  constexpr ArrayRef() = default;
  /// `size` elements from `data`.
  constexpr ArrayRef(const E* data, std::size_t size) : data_(data), size_(size) {}
  /// The elements of a braced list, e.g. {4, -1}. The list's array lives until the end of the full expression
  /// that wrote it, which covers the call it is an argument of (GCC warns of the reference all the same; as
  /// c10::ArrayRef does, the warning is silenced for this constructor only).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
  constexpr ArrayRef(std::initializer_list<E> list) : data_(list.begin()), size_(list.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  /// The elements of a vector.
  ArrayRef(const std::vector<E>& v) : data_(v.data()), size_(v.size()) {}
  /// The elements of an array.
  template <std::size_t N>
  constexpr ArrayRef(const std::array<E, N>& a) : data_(a.data()), size_(N) {}

  constexpr const E* data() const {
    return data_;
  }  ///< the first element
  constexpr std::size_t size() const {
    return size_;
  }  ///< the number of elements
  constexpr bool empty() const {
    return size_ == 0;
  }  ///< no elements
  constexpr const E* begin() const {
    return data_;
  }  ///< the first element
  constexpr const E* end() const {
    return data_ + size_;
  }  ///< one past the last element
  constexpr const E& operator[](std::size_t i) const {
    return data_[i];
  }  ///< element i, i < size()

 private:
  const E* data_ = nullptr;
  std::size_t size_ = 0;
};

/// "[2,3,8,8]" ("[]" for a scalar, "[0,0]" for Shape{}), the form every error message uses.
inline std::string to_string(const Shape& s) {
  std::string text = "[";
  for (int d = 0; d < s.rank(); ++d) text += (d ? "," : "") + std::to_string(s[d]);
  return text + "]";
}

/// Dimension `dim` of a rank-`rank` shape as an index in [0, rank): a negative `dim` counts from the end, as in
/// PyTorch (-1 is the last). Throws index_error naming `op` for a dim outside [-rank, rank).
inline int wrap_dim(int dim, int rank, const char* op) {
  if (dim < -rank || dim >= rank)
    throw index_error(std::string(op) + ": dim " + std::to_string(dim) + " is out of range for a rank-" +
                      std::to_string(rank) + " tensor; it must be in [" + std::to_string(-rank) + ", " +
                      std::to_string(rank - 1) + "]");
  return dim < 0 ? dim + rank : dim;
}

/// The shape of the `rank` dimensions d[0 … rank), without allocating (as Shape{d[0], …} would write them):
/// what an op's output_shape builds from dimensions it computed. Any value is kept, as Shape's constructors keep
/// it. Throws shape_error for a rank outside [0, Shape::max_rank].
inline Shape make_shape(const Index* d, int rank) {
  switch (rank) {
    case 0:
      return Shape::scalar();
    case 1:
      return Shape{d[0]};
    case 2:
      return Shape{d[0], d[1]};
    case 3:
      return Shape{d[0], d[1], d[2]};
    case 4:
      return Shape{d[0], d[1], d[2], d[3]};
    case 5:
      return Shape{d[0], d[1], d[2], d[3], d[4]};
    case 6:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5]};
    case 7:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5], d[6]};
    case 8:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]};
    default:
      throw shape_error("make_shape: rank " + std::to_string(rank) + "; a remat shape has 0 to " +
                        std::to_string(Shape::max_rank) + " dimensions");
  }
}
static_assert(Shape::max_rank == 8, "make_shape lists every rank");

/// `s` with a dimension of size `size` inserted at `dim`, in [-rank-1, rank] for s's rank (negative counts from
/// the end of the result, as torch.unsqueeze's dim: -1 appends): the output shape of an op that adds a dimension
/// (stack, unsqueeze). `size` is kept as it is. Throws index_error for a dim out of that range, shape_error when
/// s already has Shape::max_rank dimensions.
inline Shape insert_dim(const Shape& s, int dim, Index size) {
  const int d = wrap_dim(dim, s.rank() + 1, "insert_dim");
  if (s.rank() == Shape::max_rank)
    throw shape_error("insert_dim: " + to_string(s) + " already has " + std::to_string(s.rank()) +
                      " dimensions, the most a remat shape holds");
  Index dims[Shape::max_rank];
  for (int e = 0, k = 0; e <= s.rank(); ++e) dims[e] = e == d ? size : s[k++];
  return make_shape(dims, s.rank() + 1);
}

namespace detail {
[[noreturn]] inline void throw_rank_error(const char* op, const char* what, const Shape& s, int rank) {
  throw shape_error(std::string(op) + ": " + what + " is " + to_string(s) + ", of rank " + std::to_string(s.rank()) +
                    "; " + op + " takes a rank-" + std::to_string(rank) + " " + what);
}
}  // namespace detail

/// Throws shape_error naming `op` and its operand `what` (e.g. "A") unless `s` has rank `rank`: for an op whose
/// arguments are matrices (or vectors) by definition, as matmul's and cross_entropy's are.
inline void check_rank(const char* op, const char* what, const Shape& s, int rank) {
  if (s.rank() != rank) detail::throw_rank_error(op, what, s, rank);  // the test inlines, the message does not
}

/// A Shape in 36 bytes (a Shape takes 72), small enough for an op's Params, which are at most max_params_bytes =
/// 40 bytes (remat/op.hpp): how an N-D op carries a shape it was given, such as reshape's target shape or
/// gather's index shape. It keeps the low 32 bits of every dimension and bits 32 to 47 of the one dimension that
/// may reach 2^32, so it holds exactly the shapes packable() accepts: every dimension in [1, 2^48) and at most one
/// of 2^32 or more. Every shape of a tensor apply_op accepts is one (a tensor holds at most 2^48 bytes, so at
/// most one of its dimensions reaches 2^32). Trivially copyable, as Params must be; packing and unpacking allocate
/// nothing. A default PackedShape is the scalar shape [] (rank 0).
///
///     struct Params { remat::PackedShape shape; };               // 36 bytes: 4 left for an int
///     Params p{remat::PackedShape(target)};                     // throws shape_error unless packable(target)
///     remat::Shape out = p.shape.unpack();                      // == target
class PackedShape {
 public:
  /// The scalar shape [] (rank 0).
  constexpr PackedShape() = default;
  /// `s` packed. Throws shape_error naming PackedShape and `s` unless packable(s).
  explicit PackedShape(const Shape& s) {
    if (!packable(s))
      throw shape_error("PackedShape: " + to_string(s) +
                        " cannot be packed: every dimension must be in [1, 2^48), at most one of them 2^32 or more");
    rank_ = static_cast<std::int8_t>(s.rank());
    for (int d = 0; d < s.rank(); ++d) {
      const auto value = static_cast<std::uint64_t>(s[d]);
      low_[d] = static_cast<std::uint32_t>(value);
      if (value >> 32) {
        high_ = static_cast<std::uint16_t>(value >> 32);
        high_dim_ = static_cast<std::int8_t>(d);
      }
    }
  }
  /// Whether PackedShape(s) keeps every dimension of s: each in [1, 2^48), at most one of 2^32 or more (any rank
  /// from 0 to Shape::max_rank). Shape{} ([0,0]) and a shape with a negative dimension are not.
  static bool packable(const Shape& s) {
    int large = 0;
    for (Index d : s) {
      if (d < 1 || d >= (Index{1} << 48)) return false;
      if (d >= (Index{1} << 32)) ++large;
    }
    return large <= 1;
  }
  /// The shape packed, equal to the one given to the constructor.
  Shape unpack() const {
    Index dims[Shape::max_rank] = {};  // initialised: GCC cannot see that a rank-0 shape reads none
    for (int d = 0; d < rank_; ++d)
      dims[d] = static_cast<Index>(low_[d]) + (d == high_dim_ ? static_cast<Index>(high_) << 32 : Index{0});
    return make_shape(dims, rank_);
  }
  /// The number of dimensions of the shape packed.
  int rank() const { return rank_; }

 private:
  std::uint32_t low_[Shape::max_rank] = {};  // bits 0–31 of every dimension
  std::uint16_t high_ = 0;                   // bits 32–47 of dimension high_dim_
  std::int8_t high_dim_ = -1;                // the dimension of 2^32 or more, -1 for none
  std::int8_t rank_ = 0;
};
static_assert(sizeof(PackedShape) == 36, "PackedShape leaves 4 bytes of an op's 40 bytes of Params");
static_assert(std::is_trivially_copyable<PackedShape>::value, "an op's Params must be trivially copyable");

}  // namespace remat
