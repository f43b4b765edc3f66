// slice_cols: a contiguous range of columns (q, k and v out of a fused projection).
#pragma once

#include <string>

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct SliceColsOp : OpBase {
  static constexpr const char* name = "slice_cols";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    Index begin = 0, count = 0;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) {
    check_rank(name, "x", in[0], 2);
    // begin > cols − count, not begin + count > cols: the sum may overflow (count ≥ 1 here, so the
    // difference cannot).
    if (p.begin < 0 || p.count <= 0 || p.begin > in[0].cols() - p.count) {
      Index end = 0;
      const std::string last = __builtin_add_overflow(p.begin, p.count, &end)
                                   ? std::to_string(p.begin) + " + " + std::to_string(p.count)
                                   : std::to_string(end);
      throw shape_error("slice_cols: columns [" + std::to_string(p.begin) + ", " + last + ") of x " + to_string(in[0]) +
                        "; need 0 <= begin, count >= 1 and begin + count <= " + std::to_string(in[0].cols()));
    }
    return {in[0].rows(), p.count};
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    c.out() = c.in(0).middleCols(p.begin, p.count);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const auto p = params_of<Params>(c);
    GradTarget<T> d = c.grad_target(0);
    if (d.accumulate) {
      d.map.middleCols(p.begin, p.count) += c.grad_out();
      return;
    }
    d.map.leftCols(p.begin).setZero();
    d.map.middleCols(p.begin, p.count) = c.grad_out();
    d.map.rightCols(d.map.cols() - p.begin - p.count).setZero();
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// Columns begin … begin + count − 1 of x. x: [m,n] → [m,count]; dx is dy in those columns, 0 elsewhere.
/// Throws shape_error unless 0 ≤ begin, count ≥ 1 and begin + count ≤ n.
template <class T>
Var<T> slice_cols(const Var<T>& x, Index begin, Index count) {
  return apply_op<detail::SliceColsOp>(detail::SliceColsOp::Params{begin, count}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::SliceColsOp)
