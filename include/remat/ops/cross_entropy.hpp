// cross_entropy: softmax cross-entropy from logits and integer class labels, mean over rows.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct CrossEntropyOp : OpBase {
  static constexpr const char* name = "cross_entropy";
  static constexpr OpKind kind = OpKind::loss;
  static constexpr unsigned needs = needs_nothing;  // its residual is the softmax, kept in extra
  static Shape output_shape(const Shape*, const Attributes&) { return {1, 1}; }
  static Shape extra_shape(const Shape* in, const Attributes&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    auto x = c.in(0);
    auto p = c.extra();
    const auto& labels = c.labels();
    T total = 0;
    for (Index i = 0; i < x.rows(); ++i) {
      const T m = x.row(i).maxCoeff();
      p.row(i).array() = (x.row(i).array() - m).exp();
      const T z = p.row(i).sum();
      p.row(i) /= z;
      total += m + std::log(z) - x(i, labels[static_cast<std::size_t>(i)]);
    }
    c.out()(0, 0) = total / static_cast<T>(x.rows());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto p = c.extra();
    const auto& labels = c.labels();
    const T scale = c.grad_out()(0, 0) / static_cast<T>(p.rows());
    Matrix<T> d = scale * p;
    for (Index i = 0; i < p.rows(); ++i) d(i, labels[static_cast<std::size_t>(i)]) -= scale;
    c.add_grad(0, d);
  }
  static double flops(const Shape* in, int, const Shape&) { return 15.0 * static_cast<double>(in[0].size()); }
};

}  // namespace detail

/// Mean softmax cross-entropy of logits x: [m,n] against class ids `labels` (m entries in [0, n)):
/// L = (1/m) Σᵢ (log Σⱼ exp(xᵢⱼ) − xᵢ,labelᵢ), evaluated stably; dL/dx = (softmax(x) − onehot(labels)) / m.
/// → [1,1]. Keeps softmax(x) ([m,n]) as its residual. Throws shape_error if labels.size() ≠ m and
/// index_error for a label outside [0, n).
template <class T>
Var<T> cross_entropy(const Var<T>& logits, const std::vector<int>& labels) {
  const Shape s = logits.shape();
  if (static_cast<Index>(labels.size()) != s.rows)
    throw shape_error("cross_entropy: logits are " + to_string(s) + " but there are " + std::to_string(labels.size()) +
                      " labels; there must be one label per row");
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= s.cols)
      throw index_error("cross_entropy: label " + std::to_string(labels[i]) + " at row " + std::to_string(i) +
                        " is outside [0, " + std::to_string(s.cols) + ") for logits " + to_string(s));
  auto* state = logits.state();
  state->labels_.push_back(labels);
  detail::Attributes a;
  a.labels = static_cast<std::int32_t>(state->labels_.size() - 1);
  try {
    return detail::apply<detail::CrossEntropyOp>(a, logits);
  } catch (...) {
    state->labels_.pop_back();
    throw;
  }
}

}  // namespace remat
