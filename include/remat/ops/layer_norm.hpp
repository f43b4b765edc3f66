// layer_norm: per-row normalisation with learned gain and bias (Ba, Kiros & Hinton 2016).
#pragma once

#include <cmath>
#include <limits>
#include <string>

#include "remat/detail/apply.hpp"
#include "remat/detail/number_text.hpp"

namespace remat {
namespace detail {

struct LayerNormOp : OpBase {
  static constexpr const char* name = "layer_norm";
  static constexpr OpKind kind = OpKind::normalization;
  struct Params {
    double eps = 1e-5;
  };
  /// dx reads x, gain and the row statistics (extra: μ, 1/σ); dgain reads x and the statistics; dbias
  /// reads nothing.
  static unsigned reads(GradInputs g) {
    return (wants(g, 0) || wants(g, 1) ? reads_input0 | reads_extra : 0u) | (wants(g, 0) ? reads_input1 : 0u);
  }
  static Shape output_shape(const Shape* in, const Params&) {
    for (int k = 1; k <= 2; ++k)
      if (in[k].rows() != 1 || in[k].cols() != in[0].cols())
        throw shape_error(std::string("layer_norm: x is ") + to_string(in[0]) + " but " + (k == 1 ? "gain" : "bias") +
                          " is " + to_string(in[k]) + "; it must be [1," + std::to_string(in[0].cols()) + "]");
    return in[0];
  }
  static Shape extra_shape(const Shape* in, const Params&) { return {in[0].rows(), 2}; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    auto x = c.in(0);
    auto y = c.out();
    auto stats = c.extra();
    const T eps = T(params_of<Params>(c).eps);
    const auto gain = c.in(1).row(0).array();
    const auto bias = c.in(2).row(0).array();
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
    const auto g = c.grad_out();
    if (c.wants_grad(0) || c.wants_grad(1)) {
      const auto x = c.in(0);
      const auto stats = c.extra();
      auto xhat = [&](Index i) { return (x.row(i).array() - stats(i, 0)) * stats(i, 1); };
      if (c.wants_grad(0)) {
        const auto gain = c.in(1).row(0).array();
        GradTarget<T> dx = c.grad_target(0);
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
        GradTarget<T> dgain = c.grad_target(1);
        const auto row = [&](Index i, Index c0, Index n) {
          return g.row(i).segment(c0, n).array() * ((x.row(i).segment(c0, n).array() - stats(i, 0)) * stats(i, 1));
        };
        column_sums(x.rows(), x.cols(), 3, row, dgain.map.data(), dgain.accumulate);
      }
    }
    add_grad_column_sums(c, 2, g);
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
    throw domain_error("layer_norm: eps must be positive and finite in the tape's type, got " +
                       detail::number_text(eps));
  return apply_op<detail::LayerNormOp>(detail::LayerNormOp::Params{eps}, x, gain, bias);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::LayerNormOp)
