// A three-input user op for tests of the custom-op recipe (remat/op.hpp): y = a ⊙ b + c.
#pragma once

#include <string>

#include "remat/op.hpp"
#include "remat/remat.hpp"

namespace remat_test {

/// y = a ⊙ b + c, three inputs of one shape: da = dy ⊙ b (reads b), db = dy ⊙ a (reads a), dc = dy (reads
/// nothing). Throws shape_error naming "fma" for inputs of different shapes.
struct FmaOp : remat::OpBase {
  static constexpr const char* name = "fma";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs g) {
    return (remat::wants(g, 0) ? remat::reads_input1 : 0u) | (remat::wants(g, 1) ? remat::reads_input0 : 0u);
  }
  static remat::Shape output_shape(const remat::Shape* in, const Params&) {
    if (in[0] != in[1] || in[0] != in[2])
      throw remat::shape_error("fma: a " + remat::to_string(in[0]) + ", b " + remat::to_string(in[1]) + ", c " +
                               remat::to_string(in[2]));
    return in[0];
  }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out().array() = c.in(0).array() * c.in(1).array() + c.in(2).array();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto g = c.grad_out().array();
    if (c.wants_grad(0)) c.add_grad(0, g * c.in(1).array());
    if (c.wants_grad(1)) c.add_grad(1, g * c.in(0).array());
    if (c.wants_grad(2)) c.add_grad(2, g);
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) {
    return 2.0 * static_cast<double>(out.size());
  }
};

/// fma(a, b, c) = a ⊙ b + c on the tape of its inputs.
template <class T>
remat::Var<T> fma(const remat::Var<T>& a, const remat::Var<T>& b, const remat::Var<T>& c) {
  return remat::apply_op<FmaOp>(a, b, c);
}

}  // namespace remat_test
