// affine: y = scale·x + shift with scalar constants; behind x + c, c − x, x * c, x / c, -x style forms.
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "remat/errors.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

struct AffineOp : OpBase {
  static constexpr const char* name = "affine";
  static constexpr OpKind kind = OpKind::elementwise;
  struct Params {
    double scale = 1, shift = 0;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto a = params_of<Params>(c);
    const auto x = c.in(0);
    auto y = c.out();
    for_row_blocks(y.rows(), y.cols(), 2, [&](Index r0, Index n) {
      y.middleRows(r0, n).array() = T(a.scale) * x.middleRows(r0, n).array() + T(a.shift);
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const T scale = T(params_of<Params>(c).scale);
    const auto g = c.grad_out();
    add_grad_rows(c, 0, 1, [&](Index r0, Index n) { return scale * g.middleRows(r0, n).array(); });
  }
  static double flops(const Shape*, int, const Shape& out) { return 2.0 * static_cast<double>(out.numel()); }
};

template <class S>
using if_scalar = std::enable_if_t<std::is_arithmetic_v<S>, int>;

}  // namespace detail

/// y = scale·x + shift for scalar constants; dy/dx = scale. x: [m,n] → [m,n].
/// Throws remat::domain_error if scale or shift is not finite in T (the type the kernel computes in: 1e39 is
/// inf as a float).
template <class T>
Var<T> affine(const Var<T>& x, double scale, double shift) {
  constexpr double largest = static_cast<double>(std::numeric_limits<T>::max());
  if (!(std::abs(scale) <= largest) || !(std::abs(shift) <= largest))
    throw domain_error("affine: scale and shift must be finite in the tape's type, got " + number_text(scale) +
                       " and " + number_text(shift));
  return apply_op<detail::AffineOp>(detail::AffineOp::Params{scale, shift}, x);
}

template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator+(const Var<T>& x, S c) {
  return affine(x, 1.0, static_cast<double>(c));
}
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator+(S c, const Var<T>& x) {
  return affine(x, 1.0, static_cast<double>(c));
}
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator-(const Var<T>& x, S c) {
  return affine(x, 1.0, -static_cast<double>(c));
}
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator-(S c, const Var<T>& x) {
  return affine(x, -1.0, static_cast<double>(c));
}
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator*(const Var<T>& x, S c) {
  return affine(x, static_cast<double>(c), 0.0);
}
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator*(S c, const Var<T>& x) {
  return affine(x, static_cast<double>(c), 0.0);
}
/// x / c, computed as affine(x, 1/c, 0). Throws remat::domain_error for c = 0, a c that is not finite, and a
/// c so small that 1/c is not finite in T.
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator/(const Var<T>& x, S c) {
  if (c == S(0)) throw domain_error("divide: division of a Var by the scalar 0");
  const double reciprocal = 1.0 / static_cast<double>(c);
  if (!std::isfinite(static_cast<double>(c)) ||
      !(std::abs(reciprocal) <= static_cast<double>(std::numeric_limits<T>::max())))
    throw domain_error("divide: division of a Var by the scalar " + number_text(static_cast<double>(c)) +
                       (std::isfinite(static_cast<double>(c)) ? ", whose reciprocal is not finite in the tape's type"
                                                              : ", which is not finite"));
  return affine(x, reciprocal, 0.0);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::AffineOp)
