// Two-dimensional broadcasting for the elementwise binary ops: a dimension of 1 stretches to match.
#pragma once

#include <string>

#include "remat/detail/contexts.hpp"
#include "remat/detail/parallel.hpp"
#include "remat/errors.hpp"

namespace remat::detail {

/// Output shape of broadcasting a with b; each dimension must be equal or 1. Throws shape_error.
inline Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  auto dim = [&](Index x, Index y, const char* what) {
    if (x == y || y == 1) return x;
    if (x == 1) return y;
    throw shape_error(std::string(op) + ": cannot broadcast a " + to_string(a) + " with b " + to_string(b) + "; " +
                      what + " must be equal or 1");
  };
  return Shape{dim(a.rows, b.rows, "rows"), dim(a.cols, b.cols, "cols")};
}

/// out = f(a, b) with a and b broadcast to out's shape; f maps two equally shaped arrays to an array. Row
/// blocks of out (detail/parallel.hpp).
template <class T, class A, class B, class F>
void broadcast_apply(const A& a, const B& b, AlignedMap<T>& out, F f) {
  const Index rows = out.rows(), cols = out.cols();
  if (a.rows() == rows && a.cols() == cols && b.rows() == rows && b.cols() == cols) {
    for_row_blocks(rows, cols, 1, [&](Index r0, Index n) {
      out.middleRows(r0, n).array() = f(a.middleRows(r0, n).array(), b.middleRows(r0, n).array());
    });
    return;
  }
  using Row = Eigen::Array<T, 1, Eigen::Dynamic>;
  const bool fa = a.cols() == cols, fb = b.cols() == cols;
  for_row_blocks(rows, cols, 1, [&](Index r0, Index n) {
    for (Index i = r0; i < r0 + n; ++i) {
      const Index ia = a.rows() == 1 ? 0 : i, ib = b.rows() == 1 ? 0 : i;
      auto o = out.row(i).array();
      if (fa && fb)
        o = f(a.row(ia).array(), b.row(ib).array());
      else if (fa)
        o = f(a.row(ia).array(), Row::Constant(cols, b(ib, 0)));
      else if (fb)
        o = f(Row::Constant(cols, a(ia, 0)), b.row(ib).array());
      else
        o = f(Row::Constant(cols, a(ia, 0)), Row::Constant(cols, b(ib, 0)));
    }
  });
}

/// b broadcast to `shape`, as an Eigen expression (no temporary; for gradients of broadcast operands).
template <class B>
auto broadcast_view(const B& b, const Shape& shape) {
  return b.replicate(shape.rows / b.rows(), shape.cols / b.cols());
}

/// Adds gradient `g` (an Eigen matrix expression of the broadcast output's shape, no matrix product) to input
/// k, summing over broadcast dimensions: row blocks of g, or column_sums for a sum over rows; a sum over
/// everything adds its row blocks' partial sums in block order.
template <class T, class Context, class G>
void add_reduced_grad(const Context& c, int k, const G& g) {
  if (!c.wants_grad(k)) return;
  const Shape s = c.in_shape(k);
  const Index rows = g.rows(), cols = g.cols();
  if (s.rows == rows && s.cols == cols) {
    add_grad_rows(c, k, 1, [&](Index r0, Index n) { return g.middleRows(r0, n); });
  } else if (s.rows == 1 && s.cols == 1) {
    const T total = sum_row_blocks<T>(rows, cols, 1, [&](Index r0, Index n) { return T(g.middleRows(r0, n).sum()); });
    c.add_grad(k, Matrix<T>::Constant(1, 1, total));
  } else if (s.rows == 1) {
    add_grad_column_sums(c, k, g);
  } else {
    GradTarget<T> t = c.grad_target(k);
    for_row_blocks(rows, cols, 1, [&](Index r0, Index n) {
      assign_or_add(t.map.middleRows(r0, n), g.middleRows(r0, n).rowwise().sum(), t.accumulate);
    });
  }
}

}  // namespace remat::detail
