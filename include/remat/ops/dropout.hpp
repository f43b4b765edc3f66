// dropout: inverted dropout whose mask is regenerated from the op's random stream, never stored.
#pragma once

#include <cstdint>
#include <string>

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct DropoutOp : OpBase {
  static constexpr const char* name = "dropout";
  static constexpr OpKind kind = OpKind::random;
  static constexpr bool training_only = true;
  /// The mask is a function of the op's RandomStream (seed and offset): nothing else is stored.
  struct Params {
    double p = 0;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }

  /// out[k] = mask_k · in[k] / (1 − p), or out[k] += that when `accumulate`, for the [rows, cols] tensors `in` and
  /// `out` by row blocks: element k survives when its uniform draw is ≥ p, which depends on k alone, not on its
  /// block or thread.
  template <class T>
  static void apply_mask(double p, const RandomStream& random, const T* in, T* out, const Shape& s, bool accumulate) {
    const T scale = T(1) / T(1 - p);
    for_row_blocks(s.rows(), s.cols(), 10, [&](Index r0, Index n) {
      for (Index k = r0 * s.cols(); k < (r0 + n) * s.cols(); ++k) {
        const T v = random.uniform(static_cast<std::uint64_t>(k)) >= p ? in[k] * scale : T(0);
        out[k] = accumulate ? out[k] + v : v;
      }
    });
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    apply_mask(params_of<Params>(c).p, c.random(), c.in(0).data(), c.out().data(), c.out_shape(), false);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    GradTarget<T> d = c.grad_target(0);
    apply_mask(params_of<Params>(c).p, c.random(), c.grad_out().data(), d.map.data(), c.out_shape(), d.accumulate);
  }
  static double flops(const Shape*, int, const Shape& out) { return 10.0 * static_cast<double>(out.numel()); }
};

}  // namespace detail

/// Inverted dropout: each element is zeroed with probability p, survivors are scaled by 1/(1−p), so E[y] = x;
/// dy/dx = mask/(1−p). The mask comes from the tape's counter-based generator (seeded by Tape(seed); the op's
/// RandomStream, remat/op_context.hpp): the node stores only the seed and offset, so a checkpoint replay
/// regenerates the same mask without storing it. In evaluation mode (Tape::set_training(false)) it records
/// nothing and returns x. x: any shape, unchanged. Throws remat::domain_error unless 0 ≤ p < 1, tape_error for
/// an empty or stale x.
template <class T>
Var<T> dropout(const Var<T>& x, double p) {
  if (!(p >= 0 && p < 1)) throw domain_error("dropout: p must be in [0, 1), got " + std::to_string(p));
  return apply_op<detail::DropoutOp>(detail::DropoutOp::Params{p}, x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::DropoutOp)
