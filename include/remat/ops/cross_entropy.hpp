// cross_entropy: softmax cross-entropy from logits and integer class labels, mean over rows.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct CrossEntropyOp : OpBase {
  static constexpr const char* name = "cross_entropy";
  static constexpr OpKind kind = OpKind::loss;
  /// Its only residual is softmax(x), kept in its extra.
  static unsigned reads(GradInputs g) { return wants(g, 0) ? reads_extra : reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    check_rank(name, "logits", in[0], 2);
    return {1, 1};
  }
  /// One label per row of the logits, each in [0, columns): shape_error, index_error.
  static void check_indices(const Shape* in, const int* labels, std::size_t count) {
    const Shape s = in[0];
    if (static_cast<Index>(count) != s.rows())
      throw shape_error("cross_entropy: logits are " + to_string(s) + " but there are " + std::to_string(count) +
                        " labels; there must be one label per row");
    for (std::size_t i = 0; i < count; ++i)
      if (labels[i] < 0 || labels[i] >= s.cols())
        throw index_error("cross_entropy: label " + std::to_string(labels[i]) + " at row " + std::to_string(i) +
                          " is outside [0, " + std::to_string(s.cols()) + ") for logits " + to_string(s));
  }
  static Shape extra_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    auto x = c.in(0);
    auto p = c.extra();
    const int* labels = c.indices();
    // Each row block's losses are summed in row order, the blocks' sums in block order.
    const T total = sum_row_blocks<T>(x.rows(), x.cols(), 15, [&](Index r0, Index n) {
      T part = 0;
      for (Index i = r0; i < r0 + n; ++i) {
        const T m = x.row(i).maxCoeff();
        p.row(i).array() = (x.row(i).array() - m).exp();
        const T z = p.row(i).sum();
        p.row(i) /= z;
        part += m + std::log(z) - x(i, labels[i]);
      }
      return part;
    });
    c.out()(0, 0) = total / static_cast<T>(x.rows());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto p = c.extra();
    const int* labels = c.indices();
    const T scale = c.grad_out()(0, 0) / static_cast<T>(p.rows());
    GradTarget<T> d = c.grad_target(0);
    for_row_blocks(p.rows(), p.cols(), 2, [&](Index r0, Index n) {
      assign_or_add(d.map.middleRows(r0, n), scale * p.middleRows(r0, n), d.accumulate);
      for (Index i = r0; i < r0 + n; ++i) d.map(i, labels[i]) -= scale;
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return 15.0 * static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Mean softmax cross-entropy of logits x: [m,n] against class ids `labels` (m entries in [0, n)):
/// L = (1/m) Σᵢ (log Σⱼ exp(xᵢⱼ) − xᵢ,labelᵢ), evaluated stably; dL/dx = (softmax(x) − onehot(labels)) / m.
/// → [1,1]. Keeps softmax(x) ([m,n]) as its residual. Throws shape_error if labels.size() ≠ m and
/// index_error for a label outside [0, n).
template <class T>
Var<T> cross_entropy(const Var<T>& logits, const std::vector<int>& labels) {
  const Shape s = logits.shape();
  detail::CrossEntropyOp::check_indices(&s, labels.data(), labels.size());
  OpCall<detail::CrossEntropyOp> call;
  call.indices = labels.data();
  call.index_count = labels.size();
  return apply_op<detail::CrossEntropyOp>(call, logits);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::CrossEntropyOp)
