// Broadcasting for the elementwise binary ops, as NumPy and PyTorch define it: a dimension of 1 stretches to
// match. The common cases (equal shapes, a row or column vector, a scalar) run on the [rows, cols] views.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "remat/detail/parallel.hpp"
#include "remat/errors.hpp"
#include "remat/op_context.hpp"

namespace remat::detail {

/// Output shape of broadcasting a with b as NumPy and PyTorch do: the shapes align at their last dimension,
/// the shorter is padded with 1s in front, and each pair of dimensions must be equal or one of them 1 (which
/// stretches). Throws shape_error naming `op`, both shapes and the dimension.
inline Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  if (a == b) return a;
  const int rank = std::max(a.rank(), b.rank());
  Index dims[Shape::max_rank];
  for (int d = 0; d < rank; ++d) {
    const Index x = d < rank - a.rank() ? 1 : a[d - (rank - a.rank())];
    const Index y = d < rank - b.rank() ? 1 : b[d - (rank - b.rank())];
    if (x != y && x != 1 && y != 1)
      throw shape_error(std::string(op) + ": cannot broadcast a " + to_string(a) + " with b " + to_string(b) +
                        "; dimension " + std::to_string(d - rank) + " (" + std::to_string(x) + " and " +
                        std::to_string(y) + ") must be equal or 1");
    dims[d] = x == 1 ? y : x;
  }
  return make_shape(dims, rank);
}

/// Whether an operand of shape `x` broadcast to `out` is the 2-D broadcast of its matrix view: its leading
/// dimensions (all but the last, padded with 1s) all equal out's or all 1, and its last equal or 1. Then the
/// [rows, cols] kernels, which stretch a row count or column count of 1, compute the N-D broadcast.
inline bool matrix_broadcast(const Shape& x, const Shape& out) {
  if (x == out) return true;
  const int pad = out.rank() - x.rank();
  bool all_equal = true, all_one = true;
  for (int d = 0; d + 1 < out.rank(); ++d) {
    const Index v = d < pad ? 1 : x[d - pad];
    all_equal = all_equal && v == out[d];
    all_one = all_one && v == 1;
  }
  return all_equal || all_one;
}

/// How the rows of a broadcast output's matrix view map to an operand's elements: output row i (its leading
/// multi-index) reads the operand's row at offset(i), all of it when `full_row` (the operand's last dimension
/// equals the output's), else its one element there, stretched along the row.
class BroadcastRows {
 public:
  BroadcastRows(const Shape& x, const Shape& out) : lead_(out.rank() - 1), full_row_(x.cols() == out.cols()) {
    const int pad = out.rank() - x.rank();
    Index stride = x.rank() == 0 ? 1 : x.cols();
    for (int d = lead_ - 1; d >= 0; --d) {
      const Index v = d < pad ? 1 : x[d - pad];
      dims_[d] = out[d];
      stride_[d] = v == 1 ? 0 : stride;
      stride *= v;
    }
  }
  bool full_row() const { return full_row_; }
  /// The operand's element offset of output row i.
  Index offset(Index i) const {
    Index off = 0;
    for (int d = lead_ - 1; d >= 0 && i > 0; --d) {
      off += (i % dims_[d]) * stride_[d];
      i /= dims_[d];
    }
    return off;
  }

 private:
  int lead_;
  bool full_row_;
  Index dims_[Shape::max_rank] = {};
  Index stride_[Shape::max_rank] = {};
};

/// Row i of an operand broadcast to a row of `cols`: its row (stride 1) or one element repeated (stride 0).
template <class T>
using BroadcastRow = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>, 0, Eigen::InnerStride<>>;

template <class T>
BroadcastRow<T> broadcast_row(const T* data, const BroadcastRows& m, Index i, Index cols) {
  return BroadcastRow<T>(data + m.offset(i), cols, Eigen::InnerStride<>(m.full_row() ? 1 : 0));
}

/// out = f(a, b) with a and b broadcast to out's shape; f maps two equally shaped arrays to an array. Row
/// blocks of out (detail/parallel.hpp).
template <class T, class Context, class F>
void broadcast_apply(const Context& c, F f) {
  const Shape os = c.out_shape(), as = c.in_shape(0), bs = c.in_shape(1);
  AlignedMap<T> out = c.out();
  const auto a = c.in(0), b = c.in(1);
  const Index rows = out.rows(), cols = out.cols();
  if (!matrix_broadcast(as, os) || !matrix_broadcast(bs, os)) {  // general N-D broadcasting: row by row
    const BroadcastRows ma(as, os), mb(bs, os);
    for_row_blocks(rows, cols, 1, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i)
        out.row(i).array() = f(broadcast_row(a.data(), ma, i, cols), broadcast_row(b.data(), mb, i, cols));
    });
    return;
  }
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

/// Whether the backward of a broadcast binary op can use the [rows, cols] kernels (matrix_broadcast for both).
template <class Context>
bool matrix_broadcast_grads(const Context& c) {
  return matrix_broadcast(c.in_shape(0), c.out_shape()) && matrix_broadcast(c.in_shape(1), c.out_shape());
}

/// For general N-D broadcasting: adds to input k's gradient, for every output row i, h(g_i, a_i, b_i) (an array
/// expression of a row: the output gradient's row and the operands broadcast to it) summed over the output rows
/// and columns that read each of input k's elements. `operands` says which operand values h reads (bit 0: a,
/// bit 1: b; only those its reads() declared); h gets the gradient's row in place of the others. Serial, in
/// output order: the same sums at every thread count.
template <class T, class Context, class H>
void add_broadcast_grad(const Context& c, int k, unsigned operands, H h) {
  if (!c.wants_grad(k)) return;
  const Shape os = c.out_shape();
  const auto g = c.grad_out();
  const bool read_a = (operands & 1u) != 0, read_b = (operands & 2u) != 0;
  const BroadcastRows mg(os, os), mk(c.in_shape(k), os);
  const BroadcastRows ma = read_a ? BroadcastRows(c.in_shape(0), os) : mg;
  const BroadcastRows mb = read_b ? BroadcastRows(c.in_shape(1), os) : mg;
  const T* a = read_a ? c.in(0).data() : g.data();
  const T* b = read_b ? c.in(1).data() : g.data();
  GradTarget<T> t = c.grad_target(k);
  if (!t.accumulate) t.map.setZero();
  T* dst = t.map.data();
  const Index cols = g.cols();
  for (Index i = 0; i < g.rows(); ++i) {
    const auto gi = g.row(i).array();
    const BroadcastRow<T> ai = broadcast_row(a, ma, i, cols), bi = broadcast_row(b, mb, i, cols);
    const auto v = h(gi, ai, bi);
    const Index off = mk.offset(i);
    if (mk.full_row())
      Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>(dst + off, cols) += v;
    else
      dst[off] += v.sum();
  }
}

/// b broadcast to `shape`, as an Eigen expression (no temporary; for gradients of broadcast operands).
template <class B>
auto broadcast_view(const B& b, const Shape& shape) {
  return b.replicate(shape.rows() / b.rows(), shape.cols() / b.cols());
}

/// Adds gradient `g` (an Eigen matrix expression of the broadcast output's shape, no matrix product) to input
/// k, summing over broadcast dimensions: row blocks of g, or column_sums for a sum over rows; a sum over
/// everything adds its row blocks' partial sums in block order.
template <class T, class Context, class G>
void add_reduced_grad(const Context& c, int k, const G& g) {
  if (!c.wants_grad(k)) return;
  const Shape s = c.in_shape(k);
  const Index rows = g.rows(), cols = g.cols();
  if (s.rows() == rows && s.cols() == cols) {
    add_grad_rows(c, k, 1, [&](Index r0, Index n) { return g.middleRows(r0, n); });
  } else if (s.rows() == 1 && s.cols() == 1) {
    const T total = sum_row_blocks<T>(rows, cols, 1, [&](Index r0, Index n) { return T(g.middleRows(r0, n).sum()); });
    c.add_grad(k, Matrix<T>::Constant(1, 1, total));
  } else if (s.rows() == 1) {
    add_grad_column_sums(c, k, g);
  } else {
    GradTarget<T> t = c.grad_target(k);
    for_row_blocks(rows, cols, 1, [&](Index r0, Index n) {
      assign_or_add(t.map.middleRows(r0, n), g.middleRows(r0, n).rowwise().sum(), t.accumulate);
    });
  }
}

}  // namespace remat::detail
