// dropout: inverted dropout whose mask is regenerated from a seed and offset, never stored.
#pragma once

#include <cstdint>
#include <string>

#include "remat/detail/apply.hpp"

namespace remat {
namespace detail {

/// SplitMix64 finaliser (Steele, Lea & Flood 2014): a counter-based generator, so element k of a
/// dropout mask is a pure function of (seed, offset + k) and replay reproduces it exactly.
inline std::uint64_t splitmix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct DropoutOp : OpBase {
  static constexpr const char* name = "dropout";
  static constexpr OpKind kind = OpKind::random;
  /// The mask is a function of (seed, offset + k): nothing else is stored.
  struct Params {
    double p = 0;
    std::uint64_t seed = 0;
    std::uint64_t offset = 0;
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }

  /// Whether element k survives: its uniform draw in [0,1) is ≥ p.
  static bool keeps(const Params& a, std::uint64_t k) {
    const std::uint64_t bits = splitmix64(a.seed ^ splitmix64(a.offset + k));
    return static_cast<double>(bits >> 11) * 0x1.0p-53 >= a.p;
  }
  /// out[k] = mask_k · in[k] / (1 − p), or out[k] += that when `accumulate`, for the [rows, cols] tensors
  /// `in` and `out` by row blocks: element k's draw depends on k alone, not on its block or thread.
  template <class T>
  static void apply_mask(const Params& a, const T* in, T* out, const Shape& s, bool accumulate) {
    const T scale = T(1) / T(1 - a.p);
    for_row_blocks(s.rows(), s.cols(), 10, [&](Index r0, Index n) {
      for (Index k = r0 * s.cols(); k < (r0 + n) * s.cols(); ++k) {
        const T v = keeps(a, static_cast<std::uint64_t>(k)) ? in[k] * scale : T(0);
        out[k] = accumulate ? out[k] + v : v;
      }
    });
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    apply_mask(params_of<Params>(c), c.in(0).data(), c.out().data(), c.out_shape(), false);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    GradTarget<T> d = c.grad_target(0);
    apply_mask(params_of<Params>(c), c.grad_out().data(), d.map.data(), c.out_shape(), d.accumulate);
  }
  static double flops(const Shape*, int, const Shape& out) { return 10.0 * static_cast<double>(out.numel()); }
};

}  // namespace detail

/// Inverted dropout: each element is zeroed with probability p, survivors are scaled by 1/(1−p), so
/// E[y] = x; dy/dx = mask/(1−p). The mask comes from the tape's counter-based generator (seeded by
/// Tape(seed)); the node stores only the seed and offset, so a checkpoint replay regenerates the same
/// mask without storing it. In evaluation mode (Tape::set_training(false)) it records nothing and
/// returns x. x: [m,n] → [m,n]. Throws remat::domain_error unless 0 ≤ p < 1.
template <class T>
Var<T> dropout(const Var<T>& x, double p) {
  if (!(p >= 0 && p < 1)) throw domain_error("dropout: p must be in [0, 1), got " + std::to_string(p));
  x.node("dropout");
  auto* state = x.state();
  if (!state->training()) return x;
  const detail::DropoutOp::Params params{p, state->random_seed(), state->random_offset()};
  Var<T> y = apply_op<detail::DropoutOp>(params, x);
  state->advance_random_offset(static_cast<std::uint64_t>(x.shape().numel()));
  return y;
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::DropoutOp)
