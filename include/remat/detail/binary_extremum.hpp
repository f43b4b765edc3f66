// The op struct maximum and minimum share: an elementwise extremum of two broadcast operands whose gradient goes to
// the operand that wins, half to each at a tie (as PyTorch's maximum and minimum).
#pragma once

#include "remat/detail/broadcast.hpp"
#include "remat/op.hpp"

namespace remat::detail {

template <class Derived, bool Max>
struct BinaryExtremumOp : OpBase {
  static constexpr OpKind kind = OpKind::elementwise;
  /// Both gradients compare a with b.
  static unsigned reads(GradInputs g) {
    return wants(g, 0) || wants(g, 1) ? reads_input0 | reads_input1 : reads_nothing;
  }
  static Shape output_shape(const Shape* in, const Params&) { return broadcast_shape(Derived::name, in[0], in[1]); }
  /// Whether x wins against y: it is larger (smaller for minimum) or NaN, which propagates.
  template <class X, class Y>
  static auto wins(const X& x, const Y& y) {
    if constexpr (Max)
      return (x != x) || (x > y);
    else
      return (x != x) || (x < y);
  }
  /// The gradient of operand x against y: g where x wins, g/2 at a tie, 0 where it loses.
  template <class G, class X, class Y>
  static auto share(const G& g, const X& x, const Y& y) {
    using T = typename G::Scalar;
    if constexpr (Max)
      return (x < y).select(T(0), (x == y).select(g * T(0.5), g));
    else
      return (x > y).select(T(0), (x == y).select(g * T(0.5), g));
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    broadcast_apply<T>(c, [](const auto& a, const auto& b) { return wins(a, b).select(a, b); });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!matrix_broadcast_grads(c)) {
      add_broadcast_grad<T>(c, 0, 3u, [](const auto& g, const auto& a, const auto& b) { return share(g, a, b); });
      add_broadcast_grad<T>(c, 1, 3u, [](const auto& g, const auto& a, const auto& b) { return share(g, b, a); });
      return;
    }
    const auto g = c.grad_out();
    const Shape s = c.out_shape();
    if (!c.wants_grad(0) && !c.wants_grad(1)) return;
    const auto a = c.in(0), b = c.in(1);
    if (c.in_shape(0) == s && c.in_shape(1) == s) {
      add_grad_rows(c, 0, 3, [&](Index r0, Index n) {
        return share(g.middleRows(r0, n).array(), a.middleRows(r0, n).array(), b.middleRows(r0, n).array());
      });
      add_grad_rows(c, 1, 3, [&](Index r0, Index n) {
        return share(g.middleRows(r0, n).array(), b.middleRows(r0, n).array(), a.middleRows(r0, n).array());
      });
      return;
    }
    const auto ab = broadcast_view(a, s).array();
    const auto bb = broadcast_view(b, s).array();
    if (c.wants_grad(0)) add_reduced_grad<T>(c, 0, share(g.array(), ab, bb).matrix());
    if (c.wants_grad(1)) add_reduced_grad<T>(c, 1, share(g.array(), bb, ab).matrix());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace remat::detail
