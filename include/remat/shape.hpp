// The shape of a tensor: its dimensions, row-major and contiguous as PyTorch's default strides.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
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
  Shape(std::initializer_list<Index> dims) { assign(dims.begin(), dims.end()); }
  /// The dimensions in `dims`; throws as the list constructor does.
  explicit Shape(const std::vector<Index>& dims) { assign(dims.data(), dims.data() + dims.size()); }

  int rank() const { return rank_; }                            ///< the number of dimensions
  Index operator[](int d) const { return dims_[d]; }            ///< dimension d, 0 ≤ d < rank()
  Index& operator[](int d) { return dims_[d]; }                 ///< dimension d, 0 ≤ d < rank()
  const Index* begin() const { return dims_; }                  ///< the first dimension
  const Index* end() const { return dims_ + rank_; }            ///< one past the last dimension
  std::vector<Index> dims() const { return {begin(), end()}; }  ///< the dimensions as a vector

  /// The number of elements: the product of the dimensions (1 for a scalar).
  Index numel() const {
    if (rank_ == 2) return dims_[0] * dims_[1];  // most shapes: a product, not a loop, on every op's paths
    Index n = 1;
    for (int d = 0; d < rank_; ++d) n *= dims_[d];
    return n;
  }
  /// The number of elements, as numel() (the name 2-D code used).
  Index size() const { return numel(); }
  /// Rows of the matrix view: the product of every dimension but the last (1 below rank 2).
  Index rows() const {
    if (rank_ == 2) return dims_[0];  // most shapes, read by every kernel's context
    Index n = 1;
    for (int d = 0; d + 1 < rank_; ++d) n *= dims_[d];
    return n;
  }
  /// Columns of the matrix view: the last dimension (1 for a scalar).
  Index cols() const {
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
  void assign(It first, It last) {
    if (last - first > max_rank) throw_too_many(last - first);
    std::int32_t rank = 0;
    for (It it = first; it != last; ++it) dims_[rank++] = static_cast<Index>(*it);
    rank_ = rank;
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

namespace detail {
/// The shape of `rank` dimensions `d` (0 ≤ rank ≤ Shape::max_rank), without allocating.
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
    default:
      return Shape{d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]};
  }
}

/// Throws shape_error naming `op` and its operand `what` unless `s` has rank `rank`: for the ops whose
/// arguments are matrices (or vectors) by definition.
inline void require_rank(const char* op, const char* what, const Shape& s, int rank) {
  if (s.rank() != rank)
    throw shape_error(std::string(op) + ": " + what + " is " + to_string(s) + ", of rank " + std::to_string(s.rank()) +
                      "; " + op + " takes a rank-" + std::to_string(rank) + " " + what);
}
}  // namespace detail

}  // namespace remat
