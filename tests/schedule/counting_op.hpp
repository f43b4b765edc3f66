// A tanh op for schedule tests that counts its forward evaluations (first pass and replays alike) per layer.
#pragma once

#include <cstddef>
#include <vector>

#include "remat/op.hpp"

namespace remat_test {

/// evaluations[i]: forward evaluations of layer_counting_tanh(x, i) since the vector was last reset.
inline std::vector<int> evaluations;

struct LayerCountingTanhOp : remat::UnaryElementwise<LayerCountingTanhOp> {
  static constexpr const char* name = "layer_counting_tanh";
  static constexpr unsigned residuals = remat::reads_output;
  static constexpr double flops_per_element = 10;
  struct Params {
    int layer = 0;
  };
  template <class X>
  static auto value(const X& x, const Params& a) {
    ++evaluations[static_cast<std::size_t>(a.layer)];
    return x.tanh();
  }
  template <class X, class Y, class G>
  static auto derivative(const X&, const Y& y, const G& g, const Params&) {
    using T = typename X::Scalar;
    return g * (T(1) - y.square());
  }
};

/// tanh x, counted as an evaluation of layer `layer`.
template <class T>
remat::Var<T> layer_counting_tanh(const remat::Var<T>& x, int layer) {
  return remat::apply_op<LayerCountingTanhOp>(LayerCountingTanhOp::Params{layer}, x);
}

}  // namespace remat_test
