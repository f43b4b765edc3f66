// upsample_nearest2d: nearest-neighbour resizing of an [N,C,H,W] batch, with PyTorch's legacy "nearest" index rule
// (torch.nn.functional.interpolate(mode="nearest"), PyTorch 1.13).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>

#include "remat/op.hpp"
#include "remat/ops/conv2d.hpp"

namespace remat {

/// Two scale factors, along H and W: one value for both, or {height, width} (as remat::Size2 for sizes).
struct Scale2 {
  double height = 1;  ///< along H
  double width = 1;   ///< along W
  /// Both factors `v`.
  Scale2(double v) : height(v), width(v) {}  // NOLINT(google-explicit-constructor): 2 means {2, 2}, as in LibTorch
  /// (height, width).
  Scale2(double h, double w) : height(h), width(w) {}
};

/// The attributes of upsample_nearest2d, as torch::nn::functional::InterpolateFuncOptions with mode kNearest:
/// exactly one of size (the output's H and W) and scale_factor (Hout = ⌊H · scale⌋, Wout likewise), and
/// recompute_scale_factor (default false; only with scale_factor): whether the index rule uses in/out from the
/// computed output size instead of 1/scale_factor.
struct UpsampleNearest2dOptions {
  /// The output's [Hout, Wout], each ≥ 1.
  UpsampleNearest2dOptions& size(Size2 s) {
    size_ = s;
    return *this;
  }
  /// Hout = ⌊H · height⌋, Wout = ⌊W · width⌋; each factor finite and > 0.
  UpsampleNearest2dOptions& scale_factor(Scale2 s) {
    scale_factor_ = s;
    return *this;
  }
  /// Whether the source index uses in/out (true) or 1/scale_factor (false, PyTorch's default).
  UpsampleNearest2dOptions& recompute_scale_factor(bool r) {
    recompute_scale_factor_ = r;
    return *this;
  }
  const std::optional<Size2>& size() const { return size_; }                   ///< the output size, if given
  const std::optional<Scale2>& scale_factor() const { return scale_factor_; }  ///< the scale factors, if given
  bool recompute_scale_factor() const { return recompute_scale_factor_; }      ///< see the setter

 private:
  std::optional<Size2> size_;
  std::optional<Scale2> scale_factor_;
  bool recompute_scale_factor_ = false;
};

namespace detail {

struct UpsampleNearest2dOp : OpBase {
  static constexpr const char* name = "upsample_nearest2d";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    Index size[2] = {0, 0};           // the output's H and W; 0: ⌊in · scale_factor⌋
    double scale_factor[2] = {0, 0};  // > 0 when given
    bool scale_in_index = false;      // the index rule uses 1/scale_factor (not recomputed from the sizes)
  };
  static unsigned reads(GradInputs) { return reads_nothing; }

  /// ⌊size · scale⌋ as PyTorch computes it (in double), clamped to 2^53 so that the conversion is defined (the
  /// tape then refuses the output as more than 2^48 bytes).
  static Index scaled_size(Index size, double scale) {
    const double v = std::floor(static_cast<double>(size) * scale);
    return v >= 9007199254740992.0 ? Index(1) << 53 : static_cast<Index>(v);
  }
  static Shape output_shape(const Shape* in, const Params& a) {
    const Shape& x = in[0];
    if (x.rank() != 4)
      throw shape_error(std::string(name) + ": the input is " + to_string(x) +
                        "; it must be [N,C,H,W] (unsqueeze(x, 0) makes one sample a batch of one)");
    Shape y{x[0], x[1], a.size[0], a.size[1]};
    for (int d = 0; d < 2; ++d) {
      if (a.size[d] > 0) continue;
      y[2 + d] = scaled_size(x[2 + d], a.scale_factor[d]);
      if (y[2 + d] < 1) {
        std::ostringstream scale;
        scale.precision(17);
        scale << a.scale_factor[d];
        throw shape_error(std::string(name) + ": the input is " + to_string(x) + " and the scale factor along " +
                          (d == 0 ? "H" : "W") + " is " + scale.str() + ", which gives an output " +
                          std::to_string(y[2 + d]) + (d == 0 ? " high" : " wide") +
                          "; it must be at least 1 (a factor of at least 1/" + std::to_string(x[2 + d]) +
                          ", or an explicit size)");
      }
    }
    return y;
  }

  /// The source of output index `dst` along a dimension `in` → `out` long, as PyTorch 1.13's CPU forward picks it
  /// for a contiguous [N,C,H,W] tensor (aten/native/cpu/UpSampleKernel.cpp). Such a tensor is also channels-last
  /// contiguous when C = 1 or H·W = 1, and then (`legacy`) nearest_idx applies: the same size copies, twice the size
  /// halves, otherwise min(⌊dst · s⌋, in − 1) in float. Otherwise HelperInterpNearest applies: min(⌊float(dst · s)⌋,
  /// in − 1) with s and the product in T (double for double, rounded to float before the floor), and no shortcut.
  /// s = 1 / scale_factor when the factor is used (sf > 0), in / out otherwise.
  template <class T>
  static Index source(Index dst, Index in, Index out, double sf, bool legacy) {
    if (!legacy) return scaled_source<T>(dst, in, out, sf);
    if (out == in) return dst;
    if (out == 2 * in) return dst >> 1;
    return scaled_source<float>(dst, in, out, sf);
  }
  template <class S>
  static Index scaled_source(Index dst, Index in, Index out, double sf) {
    const S scale = sf > 0 ? static_cast<S>(1.0 / sf) : static_cast<S>(in) / static_cast<S>(out);
    return std::min(static_cast<Index>(std::floor(static_cast<float>(scale * static_cast<S>(dst)))), in - 1);
  }
  /// Whether PyTorch 1.13 takes its channels-last kernel (nearest_idx) for the contiguous input x.
  static bool legacy_rule(const Shape& x) { return x[1] == 1 || x[2] * x[3] == 1; }
  static double index_scale(const Params& a, int d) { return a.scale_in_index ? a.scale_factor[d] : 0.0; }

  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const T* in = c.in(0).data();
    T* out = c.out().data();
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    const double sh = index_scale(a, 0), sw = index_scale(a, 1);
    const bool legacy = legacy_rule(x);
    for_row_blocks(planes, oh * ow, 1, [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p)
        for (Index oy = 0; oy < oh; ++oy) {
          const T* row = in + (p * h + source<T>(oy, h, oh, sh, legacy)) * w;
          T* o = out + (p * oh + oy) * ow;
          for (Index ox = 0; ox < ow; ++ox) o[ox] = row[source<T>(ox, w, ow, sw, legacy)];
        }
    });
  }

  /// dx[source] += dy in row-major output order (PyTorch's order), plane by plane: every plane's sum is the same
  /// at every thread count. The sources are the forward's, so this is the forward's derivative (PyTorch 1.13's
  /// backward always uses nearest_idx and so, in a few cases, is not its forward's derivative: see below).
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const Shape x = c.in_shape(0), y = c.out_shape();
    const Params a = params_of<Params>(c);
    const T* g = c.grad_out().data();
    GradTarget<T> d = c.grad_target(0);
    const Index planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
    const double sh = index_scale(a, 0), sw = index_scale(a, 1);
    const bool legacy = legacy_rule(x);
    for_row_blocks(planes, oh * ow, 1, [&](Index p0, Index count) {
      for (Index p = p0; p < p0 + count; ++p) {
        T* dx = d.map.data() + p * h * w;
        if (!d.accumulate) std::fill(dx, dx + h * w, T(0));
        for (Index oy = 0; oy < oh; ++oy) {
          T* row = dx + source<T>(oy, h, oh, sh, legacy) * w;
          const T* go = g + (p * oh + oy) * ow;
          for (Index ox = 0; ox < ow; ++ox) row[source<T>(ox, w, ow, sw, legacy)] += go[ox];
        }
      }
    });
  }

  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

/// The Params of upsample_nearest2d; throws domain_error naming the op for options PyTorch refuses.
inline UpsampleNearest2dOp::Params upsample_nearest2d_params(const UpsampleNearest2dOptions& o) {
  const std::string op = UpsampleNearest2dOp::name;
  if (o.size().has_value() == o.scale_factor().has_value())
    throw domain_error(op + ": " + (o.size() ? "both size and scale_factor are" : "neither size nor scale_factor is") +
                       " given; give exactly one (UpsampleNearest2dOptions().size({H, W}) or .scale_factor(2))");
  UpsampleNearest2dOp::Params a;
  if (o.size()) {
    if (o.recompute_scale_factor())
      throw domain_error(op +
                         ": recompute_scale_factor is not meaningful with an explicit size; give "
                         "scale_factor instead, or leave recompute_scale_factor false");
    const Size2 s = *o.size();
    if (s.height < 1 || s.width < 1)
      throw domain_error(op + ": the output size is [" + std::to_string(s.height) + "," + std::to_string(s.width) +
                         "]; both must be at least 1");
    a.size[0] = s.height;
    a.size[1] = s.width;
    return a;
  }
  const Scale2 s = *o.scale_factor();
  const double factors[2] = {s.height, s.width};
  for (int d = 0; d < 2; ++d) {
    if (!(std::isfinite(factors[d]) && factors[d] > 0)) {
      std::ostringstream text;
      text.precision(17);
      text << factors[d];
      throw domain_error(op + ": the scale factor along " + (d == 0 ? "H" : "W") + " is " + text.str() +
                         "; it must be finite and above 0");
    }
    a.scale_factor[d] = factors[d];
  }
  a.scale_in_index = !o.recompute_scale_factor();
  return a;
}

}  // namespace detail

/// Nearest-neighbour upsampling (or downsampling), torch.nn.functional.interpolate(x, size | scale_factor,
/// mode="nearest") of PyTorch 1.13 on a contiguous tensor: y[n,c,i,j] = x[n, c, src(i, H, Hout), src(j, W, Wout)].
/// x: [N, C, H, W] → [N, C, Hout, Wout], with [Hout, Wout] the options' size, or ⌊H · scale_h⌋ × ⌊W · scale_w⌋
/// (in double). src is PyTorch's legacy "nearest" rule (not "nearest-exact"): min(⌊i · s⌋, H − 1) with
/// s = 1 / scale_h when a scale factor is given (unless recompute_scale_factor), else H / Hout; the product is
/// rounded to float before the floor, and s and the product are in T when C > 1 and H·W > 1 (PyTorch's generic
/// kernel), in float with the shortcuts src = i for Hout = H and ⌊i / 2⌋ for Hout = 2H when C = 1 or H·W = 1 (its
/// channels-last kernel, which such a tensor takes). The same along W.
/// Derivative: dx[n,c,a,b] = Σ dy[n,c,i,j] over the outputs (i, j) whose source is (a, b) (zero for an input pixel
/// no output reads, when downsampling). PyTorch 1.13's backward always uses the channels-last rule, so where the two
/// rules differ (C > 1 with a scale factor that keeps a size, as 1.1 on 5; some products within a float rounding of
/// an integer, as [6] → [74] at 37 in double) its gradient is not its forward's derivative; remat's is.
/// Reads no residual (the indices follow from the shapes).
/// Throws domain_error naming upsample_nearest2d when neither or both of size and scale_factor are given, for a size
/// below 1, a scale factor that is not finite and above 0, or recompute_scale_factor with a size; shape_error for an
/// input that is not [N,C,H,W], or a scale factor that makes an output side 0 (or the output more than 2^48 bytes);
/// tape_error for an empty or stale Var. The tape is unchanged after any of them.
template <class T>
Var<T> upsample_nearest2d(const Var<T>& x, const UpsampleNearest2dOptions& options) {
  return apply_op<detail::UpsampleNearest2dOp>(detail::upsample_nearest2d_params(options), x);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::UpsampleNearest2dOp)
