// Two user ops written against the public op recipe (remat/op.hpp) for tests that need an op with
// recorded indices or a temporary: gather_cols (GatherColsOp, y column j = x column idx[j]) and ScratchOp
// (y = 2x through a temporary larger than x). tests/ops/custom_op_contract_test.cpp tests them;
// tests/checkpoint/transformer_regions_test.cpp uses them in regions under every policy.
#pragma once

#include <string_view>
#include <vector>

#include "remat/op.hpp"
#include "remat/remat.hpp"

namespace remat_test {

using remat::Index;
using remat::Shape;
using remat::Var;

/// y column j = x column idx[j] (indices recorded with the op); the gradient scatters back.
struct GatherColsOp : remat::OpBase {
  static constexpr const char* name = "gather_cols";
  static constexpr remat::OpKind kind = remat::OpKind::data_movement;
  struct Params {
    Index count = 0;
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) { return {in[0].rows(), p.count}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    auto y = c.out();
    for (Index j = 0; j < y.cols(); ++j) y.col(j) = c.in(0).col(c.indices()[j]);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    remat::GradTarget<T> d = c.grad_target(0);
    if (!d.accumulate) d.map.setZero();
    const auto g = c.grad_out();
    for (Index j = 0; j < g.cols(); ++j) d.map.col(c.indices()[j]) += g.col(j);
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.size()); }
};

template <class T>
Var<T> gather_cols(const Var<T>& x, const std::vector<int>& idx, std::string_view tag = {}) {
  remat::OpCall<GatherColsOp> call;
  call.params.count = static_cast<Index>(idx.size());
  call.indices = idx.data();
  call.index_count = idx.size();
  call.tag = tag;
  return remat::apply_op<GatherColsOp>(call, x);
}

/// y = 2x computed through a temporary one row and two columns larger than x (forward and backward both
/// fill and read it).
struct ScratchOp : remat::OpBase {
  static constexpr const char* name = "scratch_op";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape scratch_shape(const Shape* in, const Params&) { return {in[0].rows() + 1, in[0].cols() + 2}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    auto s = c.scratch();
    s.setConstant(T(2));
    const Shape o = c.out_shape();
    c.out().array() = c.in(0).array() * s.topLeftCorner(o.rows(), o.cols()).array();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    auto s = c.scratch();
    s.setConstant(T(2));
    const Shape o = c.out_shape();
    c.add_grad(0, c.grad_out().array() * s.topLeftCorner(o.rows(), o.cols()).array());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.size()); }
};

}  // namespace remat_test
