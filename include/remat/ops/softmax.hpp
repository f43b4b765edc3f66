// softmax: softmax over one dimension (the last by default), stabilised by subtracting the maximum.
#pragma once

#include "remat/detail/reduce_dims.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SoftmaxOp : OpBase {
  static constexpr const char* name = "softmax";
  static constexpr OpKind kind = OpKind::normalization;
  struct Params {
    std::int32_t dim = -1;  ///< the dimension, in [0, rank); -1: the last
  };
  /// Whether the op runs along the last dimension (the rows of the matrix view).
  static bool along_rows(const Shape& s, const Params& p) { return p.dim < 0 || p.dim >= s.rank() - 1; }
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_output : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Params p = params_of<Params>(c);
    if (!along_rows(c.in_shape(0), p)) return forward_along_dim(c, p.dim);
    auto x = c.in(0);
    auto y = c.out();
    for_row_blocks(x.rows(), x.cols(), 15, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) {
        y.row(i).array() = (x.row(i).array() - x.row(i).maxCoeff()).exp();
        y.row(i) /= y.row(i).sum();
      }
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Params p = params_of<Params>(c);
    if (!along_rows(c.out_shape(), p)) return backward_along_dim(c, p.dim);
    const auto y = c.out();
    const auto g = c.grad_out();
    GradTarget<T> dx = c.grad_target(0);
    for_row_blocks(y.rows(), y.cols(), 4, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) {
        const T dot = (g.row(i).array() * y.row(i).array()).sum();
        assign_or_add(dx.map.row(i).array(), y.row(i).array() * (g.row(i).array() - dot), dx.accumulate);
      }
    });
  }
  /// Along a dimension other than the last: lines of `inner` stride, a chunk of columns at a time, the maximum
  /// and the sum taken down the dimension in order.
  template <class T>
  static void forward_along_dim(const ForwardContext<T>& c, int dim) {
    using Row = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;
    using ConstRow = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>;
    const AlongDim a(c.in_shape(0), dim);
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for_dim_chunks(a, 15, [&](Index off, Index w) {
      alignas(64) T buffer[column_chunk];
      Row acc(buffer, w);
      acc = ConstRow(x + off, w);
      for (Index k = 1; k < a.n; ++k) acc = acc.max(ConstRow(x + off + k * a.inner, w));
      for (Index k = 0; k < a.n; ++k) Row(y + off + k * a.inner, w) = (ConstRow(x + off + k * a.inner, w) - acc).exp();
      acc = ConstRow(y + off, w);
      for (Index k = 1; k < a.n; ++k) acc += ConstRow(y + off + k * a.inner, w);
      for (Index k = 0; k < a.n; ++k) Row(y + off + k * a.inner, w) /= acc;
    });
  }
  template <class T>
  static void backward_along_dim(const BackwardContext<T>& c, int dim) {
    using Row = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;
    using ConstRow = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>;
    const AlongDim a(c.out_shape(), dim);
    const T* y = c.out().data();
    const T* g = c.grad_out().data();
    GradTarget<T> t = c.grad_target(0);
    T* dx = t.map.data();
    for_dim_chunks(a, 4, [&](Index off, Index w) {
      alignas(64) T buffer[column_chunk];
      Row dot(buffer, w);
      dot = ConstRow(g + off, w) * ConstRow(y + off, w);
      for (Index k = 1; k < a.n; ++k) dot += ConstRow(g + off + k * a.inner, w) * ConstRow(y + off + k * a.inner, w);
      for (Index k = 0; k < a.n; ++k) {
        const Index o = off + k * a.inner;
        assign_or_add(Row(dx + o, w), ConstRow(y + o, w) * (ConstRow(g + o, w) - dot), t.accumulate);
      }
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return 15.0 * static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Row-wise softmax: yᵢⱼ = exp(xᵢⱼ − maxⱼ xᵢ) / Σₖ exp(xᵢₖ − maxⱼ xᵢ).
/// dx = y ⊙ (dy − Σⱼ dyⱼ yⱼ) per row. x: [m,n] → [m,n].
template <class T>
Var<T> softmax(const Var<T>& x) {
  return apply_op<detail::SoftmaxOp>(x);
}

/// torch.softmax(x, dim): yᵢ = exp(xᵢ − m) / Σₖ exp(xₖ − m) along dimension `dim` (negative counts from the
/// end; m the maximum along it). dx = y ⊙ (dy − Σₖ dyₖ yₖ) along the dim. x: any shape → x's shape. Over the
/// last dim it is softmax(x), bitwise. Keeps y as its residual. Throws index_error naming softmax for a dim
/// outside [−rank, rank) (a rank-0 x takes 0 or −1).
template <class T>
Var<T> softmax(const Var<T>& x, int dim) {
  const int rank = x.shape("softmax").rank();
  const int d = wrap_dim(dim, rank == 0 ? 1 : rank, "softmax");
  return apply_op<detail::SoftmaxOp>(detail::SoftmaxOp::Params{d}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SoftmaxOp)
