// affine: y = scale·x + shift with scalar constants; behind x + c, c − x, x * c, x / c, -x style forms.
#pragma once

#include <cmath>
#include <type_traits>

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

struct AffineOp : OpBase {
  static constexpr const char* name = "affine";
  static constexpr OpKind kind = OpKind::elementwise;
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Attributes&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto& a = c.attributes();
    c.out().array() = T(a.scalar) * c.in(0).array() + T(a.scalar2);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (c.wants_grad(0)) c.add_grad(0, T(c.attributes().scalar) * c.grad_out().array());
  }
  static double flops(const Shape*, int, const Shape& out) { return 2.0 * static_cast<double>(out.size()); }
};

template <class S>
using if_scalar = std::enable_if_t<std::is_arithmetic_v<S>, int>;

}  // namespace detail

/// y = scale·x + shift for scalar constants; dy/dx = scale. x: [m,n] → [m,n].
/// Throws remat::domain_error if scale or shift is not finite.
template <class T>
Var<T> affine(const Var<T>& x, double scale, double shift) {
  if (!std::isfinite(scale) || !std::isfinite(shift))
    throw domain_error("affine: scale and shift must be finite, got " + std::to_string(scale) + " and " +
                       std::to_string(shift));
  detail::Attributes a;
  a.scalar = scale;
  a.scalar2 = shift;
  return detail::apply<detail::AffineOp>(a, x);
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
/// x / c. Throws remat::domain_error for c = 0.
template <class T, class S, detail::if_scalar<S> = 0>
Var<T> operator/(const Var<T>& x, S c) {
  if (c == S(0)) throw domain_error("divide: division of a Var by the scalar 0");
  return affine(x, 1.0 / static_cast<double>(c), 0.0);
}

}  // namespace remat
