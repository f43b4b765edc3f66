// layer_norm: per-row normalisation with learned gain and bias (Ba, Kiros & Hinton 2016).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "remat/errors.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct LayerNormOp : OpBase {
  static constexpr const char* name = "layer_norm";
  static constexpr OpKind kind = OpKind::normalization;
  struct Params {
    double eps = 1e-5;
    /// 0: over the last dim, gain and bias of one row (layer_norm(x, gain, bias)); k > 0: over x's last k dims,
    /// weight and bias of their shape (layer_norm(x, normalized_shape, weight, bias)).
    std::int32_t normalized_rank = 0;
  };
  /// The elements each normalised group has: x's last dim, or the product of its last normalized_rank dims.
  static Index width(const Shape& x, const Params& p) {
    if (p.normalized_rank == 0) return x.cols();
    Index n = 1;
    for (int d = x.rank() - p.normalized_rank; d < x.rank(); ++d) n *= x[d];
    return n;
  }
  /// dx reads x, gain and the row statistics (extra: μ, 1/σ); dgain reads x and the statistics; dbias
  /// reads nothing.
  static unsigned reads(GradInputs g) {
    return (wants(g, 0) || wants(g, 1) ? reads_input0 | reads_extra : 0u) | (wants(g, 0) ? reads_input1 : 0u);
  }
  static Shape output_shape(const Shape* in, const Params& p) {
    if (p.normalized_rank > 0) {
      for (int k = 1; k <= 2; ++k)
        if (in[k].rank() != p.normalized_rank ||
            !std::equal(in[k].begin(), in[k].end(), in[0].end() - p.normalized_rank))
          throw shape_error(std::string("layer_norm: x is ") + to_string(in[0]) + ", normalised over its last " +
                            std::to_string(p.normalized_rank) + " dims, but " + (k == 1 ? "weight" : "bias") + " is " +
                            to_string(in[k]) + "; it must be the normalized_shape");
      return in[0];
    }
    for (int k = 1; k <= 2; ++k)
      if (in[k].rows() != 1 || in[k].cols() != in[0].cols())
        throw shape_error(std::string("layer_norm: x is ") + to_string(in[0]) + " but " + (k == 1 ? "gain" : "bias") +
                          " is " + to_string(in[k]) + "; it must be [1," + std::to_string(in[0].cols()) + "]");
    return in[0];
  }
  static Shape extra_shape(const Shape* in, const Params& p) { return {in[0].numel() / width(in[0], p), 2}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Params p = params_of<Params>(c);
    const Index w = width(c.in_shape(0), p), m = c.in_shape(0).numel() / w;
    const ConstAlignedMap<T> x(c.in(0).data(), m, w);
    AlignedMap<T> y(c.out().data(), m, w);
    auto stats = c.extra();
    const T eps = T(p.eps);
    const auto gain = ConstAlignedMap<T>(c.in(1).data(), 1, w).row(0).array();
    const auto bias = ConstAlignedMap<T>(c.in(2).data(), 1, w).row(0).array();
    for_row_blocks(x.rows(), x.cols(), 8, [&](Index r0, Index n) {
      for (Index i = r0; i < r0 + n; ++i) {
        const T mu = x.row(i).mean();
        const T var = (x.row(i).array() - mu).square().mean();
        const T rstd = T(1) / std::sqrt(var + eps);
        stats(i, 0) = mu;
        stats(i, 1) = rstd;
        y.row(i).array() = (x.row(i).array() - mu) * rstd * gain + bias;
      }
    });
  }
  /// Backward: dx by row blocks; dgain and dbias, sums over rows, by column_sums.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Params p = params_of<Params>(c);
    const Index w = width(c.out_shape(), p), m = c.out_shape().numel() / w;
    const ConstAlignedMap<T> g(c.grad_out().data(), m, w);
    if (c.wants_grad(0) || c.wants_grad(1)) {
      const ConstAlignedMap<T> x(c.in(0).data(), m, w);
      const auto stats = c.extra();
      auto xhat = [&](Index i) { return (x.row(i).array() - stats(i, 0)) * stats(i, 1); };
      if (c.wants_grad(0)) {
        const auto gain = ConstAlignedMap<T>(c.in(1).data(), 1, w).row(0).array();
        GradTarget<T> t = c.grad_target(0);
        GradTarget<T> dx{AlignedMap<T>(t.map.data(), m, w), t.accumulate};
        for_row_blocks(x.rows(), x.cols(), 12, [&](Index r0, Index n) {
          for (Index i = r0; i < r0 + n; ++i) {
            const auto dxhat = g.row(i).array() * gain;
            const T mean_d = dxhat.mean();
            const T mean_dx = (dxhat * xhat(i)).mean();
            assign_or_add(dx.map.row(i).array(), stats(i, 1) * (dxhat - mean_d - xhat(i) * mean_dx), dx.accumulate);
          }
        });
      }
      if (c.wants_grad(1)) {
        GradTarget<T> dgain = c.grad_target(1);  // of n elements, as a row
        const auto row = [&](Index i, Index c0, Index n) {
          return g.row(i).segment(c0, n).array() * ((x.row(i).segment(c0, n).array() - stats(i, 0)) * stats(i, 1));
        };
        column_sums(x.rows(), x.cols(), 3, row, dgain.map.data(), dgain.accumulate);
      }
    }
    if (c.wants_grad(2)) {
      GradTarget<T> t = c.grad_target(2);
      assign_column_sums<T>(AlignedMap<T>(t.map.data(), 1, w), g, t.accumulate, 1);
    }
  }
  static double flops(const Shape* in, int, const Shape&) { return 8.0 * static_cast<double>(in[0].numel()); }
};

}  // namespace detail

/// Layer normalisation over each row (Ba, Kiros & Hinton 2016): with μᵢ, σᵢ² the row's mean and
/// (biased) variance and x̂ = (x − μᵢ)/√(σᵢ² + eps), y = x̂ ⊙ gain + bias.
/// dx = (1/√(σᵢ²+eps)) (d̂ − mean(d̂) − x̂ mean(d̂ ⊙ x̂)) with d̂ = dy ⊙ gain; dgain = Σ_rows dy ⊙ x̂;
/// dbias = Σ_rows dy. x: [m,n], gain: [1,n], bias: [1,n] → [m,n]. Keeps x, gain and the per-row
/// (μ, 1/σ) ([m,2]) as residuals. Throws shape_error for mismatched shapes, remat::domain_error for an eps that
/// is not positive and finite in T (1e-50 is 0 as a float).
template <class T>
Var<T> layer_norm(const Var<T>& x, const Var<T>& gain, const Var<T>& bias, double eps = 1e-5) {
  // Checked in T, the type the kernel adds it in: 1e-50 is positive as a double but 0 as a float, and 1e300
  // is inf (compared in double: converting it to float would be undefined).
  if (!(eps > 0) || !(eps <= static_cast<double>(std::numeric_limits<T>::max())) || !(T(eps) > T(0)))
    throw domain_error("layer_norm: eps must be positive and finite in the tape's type, got " + number_text(eps));
  return apply_op<detail::LayerNormOp>(detail::LayerNormOp::Params{eps}, x, gain, bias);
}

/// F.layer_norm(x, normalized_shape, weight, bias, eps): layer normalisation over x's trailing dims given by
/// `normalized_shape` (k dims): with μ, σ² the mean and (biased) variance of each group of x's last k dims and
/// x̂ = (x − μ)/√(σ² + eps), y = x̂ ⊙ weight + bias. dx = (1/√(σ²+eps)) (d̂ − mean(d̂) − x̂ mean(d̂ ⊙ x̂)) per group
/// with d̂ = dy ⊙ weight; dweight = Σ_groups dy ⊙ x̂; dbias = Σ_groups dy. x: [..., normalized_shape], weight and
/// bias: normalized_shape → x's shape. Over one dim it is layer_norm(x, weight, bias, eps), bitwise. Keeps x,
/// weight and each group's (μ, 1/σ) as residuals. Throws shape_error naming layer_norm if normalized_shape has
/// no dims, more than x, or is not x's trailing dims, or weight or bias is not of normalized_shape;
/// remat::domain_error for an eps that is not positive and finite in T.
template <class T>
Var<T> layer_norm(const Var<T>& x, const Shape& normalized_shape, const Var<T>& weight, const Var<T>& bias,
                  double eps = 1e-5) {
  const Shape xs = x.shape("layer_norm");
  const int k = normalized_shape.rank();
  if (k == 0 || k > xs.rank() || !std::equal(normalized_shape.begin(), normalized_shape.end(), xs.end() - k))
    throw shape_error("layer_norm: normalized_shape " + to_string(normalized_shape) +
                      " is not the trailing dims of x " + to_string(xs));
  if (!(eps > 0) || !(eps <= static_cast<double>(std::numeric_limits<T>::max())) || !(T(eps) > T(0)))
    throw domain_error("layer_norm: eps must be positive and finite in the tape's type, got " + number_text(eps));
  detail::LayerNormOp::Params p;
  p.eps = eps;
  p.normalized_rank = k;
  return apply_op<detail::LayerNormOp>(p, x, weight, bias);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::LayerNormOp)
