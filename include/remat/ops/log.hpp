// log: elementwise y = ln x (NaN for x < 0 and −inf at 0, as std::log).
#pragma once

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct LogOp : UnaryElementwise<LogOp> {
  static constexpr const char* name = "log";
  static constexpr unsigned residuals = reads_input0;
  static constexpr double flops_per_element = 10;
  template <class X>
  static auto value(const X& x, const Params&) {
    return x.log();
  }
  template <class X, class Y, class G>
  static auto derivative(const X& x, const Y&, const G& g, const Params&) {
    return g / x;
  }
};

}  // namespace detail

/// Elementwise y = ln x (NaN for x < 0 and −inf at 0, as std::log); dy/dx = 1/x.
/// x: [m,n] → [m,n]. Throws tape_error for an empty or stale Var.
template <class T>
Var<T> log(const Var<T>& x) {
  return apply_op<detail::LogOp>(x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::LogOp)
