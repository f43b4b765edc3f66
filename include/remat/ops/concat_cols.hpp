// concat_cols: matrices side by side (the inverse of slice_cols).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "remat/op.hpp"

namespace remat {
namespace detail {

/// Two matrices side by side; concat_cols of more is a balanced tree of these.
struct ConcatColsOp : OpBase {
  static constexpr const char* name = "concat_cols";
  static constexpr OpKind kind = OpKind::data_movement;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "a", in[0], 2);
    check_rank(name, "b", in[1], 2);
    if (in[0].rows() != in[1].rows())
      throw shape_error("concat_cols: " + to_string(in[0]) + " and " + to_string(in[1]) +
                        " have different numbers of rows");
    Index cols;
    if (__builtin_add_overflow(in[0].cols(), in[1].cols(), &cols))
      throw shape_error("concat_cols: " + to_string(in[0]) + " and " + to_string(in[1]) +
                        " have more columns together than an Index holds");
    return {in[0].rows(), cols};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    auto y = c.out();
    y.leftCols(c.in_shape(0).cols()) = c.in(0);
    y.rightCols(c.in_shape(1).cols()) = c.in(1);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const auto g = c.grad_out();
    if (c.wants_grad(0)) c.add_grad(0, g.leftCols(c.in_shape(0).cols()));
    if (c.wants_grad(1)) c.add_grad(1, g.rightCols(c.in_shape(1).cols()));
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

/// The output shapes of the two-part records concat_range(parts, begin, end) makes, appended to `out`;
/// returns the shape of the whole range.
template <class T>
Shape concat_shapes(const std::vector<Var<T>>& parts, std::size_t begin, std::size_t end, std::vector<Shape>& out) {
  if (end - begin == 1) return parts[begin].shape();
  const std::size_t middle = begin + (end - begin) / 2;
  const Shape left = concat_shapes(parts, begin, middle, out), right = concat_shapes(parts, middle, end, out);
  out.push_back(Shape{left.rows(), left.cols() + right.cols()});
  return out.back();
}

template <class T>
Var<T> concat_range(const std::vector<Var<T>>& parts, std::size_t begin, std::size_t end) {
  if (end - begin == 1) return parts[begin];
  const std::size_t middle = begin + (end - begin) / 2;
  return apply_op<ConcatColsOp>(concat_range(parts, begin, middle), concat_range(parts, middle, end));
}

}  // namespace detail

/// [a | b | …]: the parts side by side, in order. Each part: [m, nᵢ] → [m, Σ nᵢ]; each part's gradient is
/// its columns of dy. Records ⌈log₂ k⌉ levels of two-part concatenations for k parts (intermediates no
/// backward reads are freed at once); one part is returned as it is. Throws shape_error for no parts,
/// parts with different numbers of rows, a concatenation of more than 2^48 bytes, tape_error for an empty or stale
/// part, parts of different tapes or a part computed inside a checkpointed function that did not return it,
/// stale_value_error for a modified Parameter, std::bad_alloc: all before recording anything, so the tape is unchanged
/// then (the tree's records reserve their buffers and nodes together first). A policy that throws on one of the
/// records leaves the records before it on the tape, and so, under a memory budget, does a memory_budget_error
/// or stale_value_error from one record's eviction trial (each record makes its own).
template <class T>
Var<T> concat_cols(const std::vector<Var<T>>& parts) {
  if (parts.empty()) throw shape_error("concat_cols: no parts; pass at least one");
  // Every check the two-part records would make, made first: a bad part must not leave the partial
  // concatenations recorded before it on the tape.
  Index columns = 0;  // every partial sum of the tree is at most this one
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Shape s = parts[i].shape("concat_cols");
    if (__builtin_add_overflow(columns, s.cols(), &columns))
      throw shape_error("concat_cols: parts 0 to " + std::to_string(i) + " (part " + std::to_string(i) + " is " +
                        to_string(s) + ") have more columns together than an Index holds");
    if (!same_tape(parts[i], parts[0]))
      throw tape_error("concat_cols: part " + std::to_string(i) + " belongs to another tape than part 0");
    if (s.rows() != parts[0].rows())
      throw shape_error("concat_cols: part " + std::to_string(i) + " is " + to_string(s) + " but part 0 is " +
                        to_string(parts[0].shape()) + "; every part needs the same number of rows");
    check_input("concat_cols", parts[i]);
  }
  // The whole concatenation must be a valid tensor: every partial one of the tree is then valid too, so no
  // record of it throws a shape_error after the first was recorded.
  if (!valid_output_shape<T>(Shape{parts[0].rows(), columns}))
    throw shape_error("concat_cols: the parts make a [" + std::to_string(parts[0].rows()) + "," +
                      std::to_string(columns) + "] tensor, more than the 2^48 bytes a tensor may have");
  // Room for every record of the tree first: a std::bad_alloc must not leave the pairs recorded before it.
  std::vector<Shape> shapes;
  shapes.reserve(parts.size());
  detail::concat_shapes(parts, 0, parts.size(), shapes);
  reserve_records("concat_cols", parts[0], shapes.data(), shapes.size());
  return detail::concat_range(parts, 0, parts.size());
}

/// concat_cols({a, b, …}).
template <class T>
Var<T> concat_cols(std::initializer_list<Var<T>> parts) {
  return concat_cols(std::vector<Var<T>>(parts));
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ConcatColsOp)
