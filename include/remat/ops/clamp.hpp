// clamp: elementwise y = min(max(x, min), max), either bound optional (torch.clamp).
#pragma once

#include <limits>
#include <optional>
#include <string>

#include "remat/errors.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct ClampOp : UnaryElementwise<ClampOp> {
  static constexpr const char* name = "clamp";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 2;
  struct Params {
    double min = 0, max = 0;
    bool has_min = false, has_max = false;
  };
  template <class X>
  static auto value(const X& x, const Params& p) {
    using T = typename X::Scalar;
    const T lo = p.has_min ? T(p.min) : -std::numeric_limits<T>::infinity();
    const T hi = p.has_max ? T(p.max) : std::numeric_limits<T>::infinity();
    // v < lo and y > hi are false for a NaN v, which stays; lo > hi gives hi, as torch.clamp.
    return x.unaryExpr([lo, hi](T v) {
      const T y = v < lo ? lo : v;
      return y > hi ? hi : y;
    });
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params& p) {
    using T = typename X::Scalar;
    const T lo = p.has_min ? T(p.min) : -std::numeric_limits<T>::infinity();
    const T hi = p.has_max ? T(p.max) : std::numeric_limits<T>::infinity();
    return ((x >= lo) && (x <= hi)).select(g, T(0));
  }
};

}  // namespace detail

/// torch.clamp(x, min, max): y = min(max(x, min), max) elementwise, a missing bound not applied (a NaN x stays
/// NaN; min > max gives max everywhere, as PyTorch). dy/dx = 1 where min ≤ x ≤ max, the bounds included (as
/// PyTorch), 0 elsewhere. x: any shape → x's shape. Keeps x as its residual. Throws remat::domain_error naming
/// clamp if neither bound is given or a bound is NaN.
template <class T>
Var<T> clamp(const Var<T>& x, std::optional<double> min, std::optional<double> max) {
  if (!min && !max) throw domain_error("clamp: at least one of min and max must be given");
  if ((min && *min != *min) || (max && *max != *max))
    throw domain_error("clamp: a bound is NaN (min " + (min ? number_text(*min) : std::string("none")) + ", max " +
                       (max ? number_text(*max) : std::string("none")) + ")");
  detail::ClampOp::Params p;
  p.has_min = min.has_value();
  p.has_max = max.has_value();
  p.min = min.value_or(0);
  p.max = max.value_or(0);
  return apply_op<detail::ClampOp>(p, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ClampOp)
