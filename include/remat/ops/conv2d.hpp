// conv2d: 2-D convolution (cross-correlation) of an [N,C,H,W] batch with PyTorch's semantics, on oneDNN or im2col.
#pragma once

#include <algorithm>
#include <climits>
#include <new>
#include <string>

#include "remat/backends.hpp"
#include "remat/detail/onednn_conv.hpp"
#include "remat/op.hpp"

namespace remat {

/// A pair of sizes (height, width), built from one value for both or from two: `2` or `{2, 1}`
/// (LibTorch's ExpandingArray<2>).
struct Size2 {
  Index height = 0;  ///< along H
  Index width = 0;   ///< along W
  /// Both sizes `v`.
  Size2(Index v) : height(v), width(v) {}  // NOLINT(google-explicit-constructor): 2 means {2, 2}, as in LibTorch
  /// (height, width).
  Size2(Index h, Index w) : height(h), width(w) {}
};

/// The attributes of conv2d, as torch::nn::functional::Conv2dFuncOptions: stride, padding (zeros on every side),
/// dilation and groups, each a chained setter.
struct Conv2dOptions {
  /// Step between windows, ≥ 1 (default 1).
  Conv2dOptions& stride(Size2 s) {
    stride_ = s;
    return *this;
  }
  /// Implicit zeros added on both sides of H and of W, ≥ 0 (default 0).
  Conv2dOptions& padding(Size2 p) {
    padding_ = p;
    return *this;
  }
  /// Spacing between kernel elements, ≥ 1 (default 1).
  Conv2dOptions& dilation(Size2 d) {
    dilation_ = d;
    return *this;
  }
  /// Channel groups, ≥ 1, dividing the input and output channels (default 1; groups = C is depthwise).
  Conv2dOptions& groups(Index g) {
    groups_ = g;
    return *this;
  }
  Size2 stride() const { return stride_; }      ///< the step between windows
  Size2 padding() const { return padding_; }    ///< the zeros added on each side
  Size2 dilation() const { return dilation_; }  ///< the spacing between kernel elements
  Index groups() const { return groups_; }      ///< the channel groups

 private:
  Size2 stride_{1}, padding_{0}, dilation_{1};
  Index groups_ = 1;
};

namespace detail {

struct Conv2dOp : OpBase {
  static constexpr const char* name = "conv2d";
  static constexpr OpKind kind = OpKind::convolution;
  struct Params {
    std::int32_t stride[2] = {1, 1}, padding[2] = {0, 0}, dilation[2] = {1, 1};
    std::int32_t groups = 1;
    std::int32_t bias = 0;  // 1: input 2 is a bias [O]
    // > 0: the float kernels run on oneDNN, with a scratch sized for this many threads (the count when recorded);
    // 0: im2col and GEMM.
    std::int32_t onednn_threads = 0;
  };

  /// Sizes of one product: per sample and group, out [Og, P] = W_g [Og, K] · col [K, P].
  struct Geometry {
    Index n, c, h, w, o, kh, kw, oh, ow, groups;
    Index cg() const { return c / groups; }  // input channels per group
    Index og() const { return o / groups; }  // output channels per group
    Index k() const { return cg() * kh * kw; }
    Index p() const { return oh * ow; }
  };
  static Geometry geometry(const Shape* in, const Params& a) {
    const Shape &x = in[0], &w = in[1];
    Geometry g{x[0], x[1], x[2], x[3], w[0], w[2], w[3], 0, 0, a.groups};
    // In Index: int32 options whose products would overflow int are valid PyTorch arguments.
    g.oh = (g.h + Index(2) * a.padding[0] - Index(a.dilation[0]) * (g.kh - 1) - 1) / a.stride[0] + 1;
    g.ow = (g.w + Index(2) * a.padding[1] - Index(a.dilation[1]) * (g.kw - 1) - 1) / a.stride[1] + 1;
    return g;
  }

  /// dX needs W, dW needs X, db nothing (dY alone).
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }

  static Shape output_shape(const Shape* in, const Params& a) {
    check_shapes(in, a);
    const Geometry g = geometry(in, a);
    return Shape{g.n, g.o, g.oh, g.ow};
  }
  /// The im2col matrix of one sample and group, [K, P] (as [K, Hout, Wout]); the backward reuses it for W_gᵀ · dY.
  /// On oneDNN: the blocked copies of the tensors and the primitives' scratchpads ([floats]).
  static Shape scratch_shape(const Shape* in, const Params& a) {
    const Geometry g = geometry(in, a);
#ifdef REMAT_USE_ONEDNN
    if (a.onednn_threads > 0) return Shape{std::max<Index>(onednn::plan_again(onednn_key(g, a))->floats(), 1)};
#endif
    return Shape{g.k(), g.oh, g.ow};  // not {K, Hout · Wout}: apply_op's checks refuse sizes whose product overflows
  }

  template <class T>
  using RowMajorMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
  template <class T>
  using ConstRowMajorMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

  /// The output columns ox whose input column ox·s + offset lies in [0, width): [first, last).
  static void valid_columns(Index out, Index width, Index stride, Index offset, Index& first, Index& last) {
    first = offset >= 0 ? 0 : std::min(out, (-offset + stride - 1) / stride);
    last = width - offset <= 0 ? 0 : std::min(out, (width - offset + stride - 1) / stride);
    last = std::max(first, last);
  }

  /// col[(ci·kh + i)·kw + j, oy·ow + ox] = x[ci, oy·sh − ph + i·dh, ox·sw − pw + j·dw] (0 outside) for the Cg
  /// channels of one sample and group starting at `x`, by row blocks on remat's team (each row is one (ci, i, j):
  /// a copy of runs of input rows, the padding's zeros filled around them).
  template <class T>
  static void im2col(const Geometry& g, const Params& a, const T* x, T* col) {
    for_row_blocks(g.k(), g.p(), 1, [&](Index r0, Index count) {
      for (Index r = r0; r < r0 + count; ++r) {
        const Index ci = r / (g.kh * g.kw), i = r / g.kw % g.kh, j = r % g.kw;
        const Index dy = i * a.dilation[0] - a.padding[0], dx = j * a.dilation[1] - a.padding[1];
        Index first, last;
        valid_columns(g.ow, g.w, a.stride[1], dx, first, last);
        const T* plane = x + ci * g.h * g.w;
        for (Index oy = 0; oy < g.oh; ++oy) {
          T* dst = col + r * g.p() + oy * g.ow;
          const Index y = oy * a.stride[0] + dy;
          if (y < 0 || y >= g.h) {
            std::fill(dst, dst + g.ow, T(0));
            continue;
          }
          std::fill(dst, dst + first, T(0));
          const T* src = plane + y * g.w;  // input column ox·sw + dx, inside for ox in [first, last)
          if (a.stride[1] == 1)
            std::copy(src + first + dx, src + last + dx, dst + first);
          else
            for (Index ox = first; ox < last; ++ox) dst[ox] = src[ox * a.stride[1] + dx];
          std::fill(dst + last, dst + g.ow, T(0));
        }
      }
    });
  }
  /// The adjoint of im2col: dx[ci, y, x] += col[…] over every window position that read it, by blocks of input
  /// channels on remat's team (a channel's plane is written by its own rows only, in the same order at every
  /// thread count).
  template <class T>
  static void col2im_add(const Geometry& g, const Params& a, const T* col, T* dx) {
    for_row_blocks(g.cg(), g.kh * g.kw * g.p(), 1, [&](Index c0, Index count) {
      for (Index ci = c0; ci < c0 + count; ++ci)
        for (Index i = 0; i < g.kh; ++i)
          for (Index j = 0; j < g.kw; ++j) {
            const T* row = col + ((ci * g.kh + i) * g.kw + j) * g.p();
            const Index dy = i * a.dilation[0] - a.padding[0], dxo = j * a.dilation[1] - a.padding[1];
            Index first, last;
            valid_columns(g.ow, g.w, a.stride[1], dxo, first, last);
            T* plane = dx + ci * g.h * g.w;
            for (Index oy = 0; oy < g.oh; ++oy) {
              const Index y = oy * a.stride[0] + dy;
              if (y < 0 || y >= g.h) continue;
              T* dst = plane + y * g.w;
              const T* src = row + oy * g.ow;
              for (Index ox = first; ox < last; ++ox) dst[ox * a.stride[1] + dxo] += src[ox];
            }
          }
    });
  }

#ifdef REMAT_USE_ONEDNN
  static onednn::ConvKey onednn_key(const Geometry& g, const Params& a) {
    return {g.n,
            g.c,
            g.h,
            g.w,
            g.o,
            g.kh,
            g.kw,
            a.groups,
            {a.stride[0], a.stride[1]},
            {a.padding[0], a.padding[1]},
            {a.dilation[0], a.dilation[1]},
            a.bias,
            a.onednn_threads};
  }
#endif

  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Params a = params_of<Params>(c);
    const Shape in[2] = {c.in_shape(0), c.in_shape(1)};
    const Geometry g = geometry(in, a);
#ifdef REMAT_USE_ONEDNN
    if constexpr (std::is_same_v<T, float>)
      if (a.onednn_threads > 0) {
        onednn::forward(onednn_key(g, a), c.scratch().size(), c.in(0).data(), c.in(1).data(),
                        a.bias ? c.in(2).data() : nullptr, c.out().data(), c.scratch().data());
        return;
      }
#endif
    const T* x = c.in(0).data();
    const T* w = c.in(1).data();
    T* y = c.out().data();
    T* col = c.scratch().data();
    for (Index n = 0; n < g.n; ++n)
      for (Index gr = 0; gr < g.groups; ++gr) {
        im2col(g, a, x + (n * g.c + gr * g.cg()) * g.h * g.w, col);
        RowMajorMap<T> out(y + (n * g.o + gr * g.og()) * g.p(), g.og(), g.p());
        out.noalias() =
            ConstRowMajorMap<T>(w + gr * g.og() * g.k(), g.og(), g.k()) * ConstRowMajorMap<T>(col, g.k(), g.p());
        if (a.bias)
          out.colwise() += Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>(c.in(2).data() + gr * g.og(), g.og());
      }
  }

  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Params a = params_of<Params>(c);
    const Shape in[2] = {c.in_shape(0), c.in_shape(1)};
    const Geometry g = geometry(in, a);
    const T* dy = c.grad_out().data();
    T* col = c.scratch().data();
    if (a.bias && c.wants_grad(2)) {  // db[o] = Σ_{n, p} dY[n, o, p], summed in that order
      GradTarget<T> db = c.grad_target(2);
      for (Index o = 0; o < g.o; ++o) {
        T sum = db.accumulate ? db.map.data()[o] : T(0);
        for (Index n = 0; n < g.n; ++n) sum += ConstRowMajorMap<T>(dy + (n * g.o + o) * g.p(), 1, g.p()).sum();
        db.map.data()[o] = sum;
      }
    }
#ifdef REMAT_USE_ONEDNN
    if constexpr (std::is_same_v<T, float>)
      if (a.onednn_threads > 0) {
        float *dx = nullptr, *dw = nullptr;
        bool accumulate_dx = false, accumulate_dw = false;
        if (c.wants_grad(0)) {
          GradTarget<T> t = c.grad_target(0);
          dx = t.map.data();
          accumulate_dx = t.accumulate;
        }
        if (c.wants_grad(1)) {
          GradTarget<T> t = c.grad_target(1);
          dw = t.map.data();
          accumulate_dw = t.accumulate;
        }
        if (dx)
          onednn::backward_data(onednn_key(g, a), c.scratch().size(), c.in(1).data(), dy, dx, accumulate_dx,
                                c.scratch().data());
        if (dw)
          onednn::backward_weights(onednn_key(g, a), c.scratch().size(), c.in(0).data(), dy, dw, accumulate_dw,
                                   dx != nullptr, c.scratch().data());
        return;
      }
#endif
    if (c.wants_grad(1)) {  // dW_g = Σ_n dY_ng · col_ngᵀ
      GradTarget<T> dw = c.grad_target(1);
      if (!dw.accumulate) dw.map.setZero();
      const T* x = c.in(0).data();
      for (Index n = 0; n < g.n; ++n)
        for (Index gr = 0; gr < g.groups; ++gr) {
          im2col(g, a, x + (n * g.c + gr * g.cg()) * g.h * g.w, col);
          RowMajorMap<T>(dw.map.data() + gr * g.og() * g.k(), g.og(), g.k()).noalias() +=
              ConstRowMajorMap<T>(dy + (n * g.o + gr * g.og()) * g.p(), g.og(), g.p()) *
              ConstRowMajorMap<T>(col, g.k(), g.p()).transpose();
        }
    }
    if (c.wants_grad(0)) {  // dX: col2im(W_gᵀ · dY_ng)
      GradTarget<T> dx = c.grad_target(0);
      if (!dx.accumulate) dx.map.setZero();
      const T* w = c.in(1).data();
      for (Index n = 0; n < g.n; ++n)
        for (Index gr = 0; gr < g.groups; ++gr) {
          RowMajorMap<T>(col, g.k(), g.p()).noalias() =
              ConstRowMajorMap<T>(w + gr * g.og() * g.k(), g.og(), g.k()).transpose() *
              ConstRowMajorMap<T>(dy + (n * g.o + gr * g.og()) * g.p(), g.og(), g.p());
          col2im_add(g, a, col, dx.map.data() + (n * g.c + gr * g.cg()) * g.h * g.w);
        }
    }
  }

  /// 2 · N · O · P · K multiply-adds.
  static double flops(const Shape* in, int, const Shape&, const Params& a) {
    const Geometry g = geometry(in, a);
    return 2.0 * static_cast<double>(g.n) * static_cast<double>(g.o) * static_cast<double>(g.p()) *
           static_cast<double>(g.k());
  }

  [[noreturn]] static void fail(const Shape* in, const std::string& why) {
    throw shape_error("conv2d: input is " + to_string(in[0]) + " and weight " + to_string(in[1]) + "; " + why);
  }
  static void check_shapes(const Shape* in, const Params& a) {
    const Shape &x = in[0], &w = in[1];
    if (x.rank() != 4) fail(in, "the input must be [N,C,H,W] (unsqueeze(x, 0) makes one sample a batch of one)");
    if (w.rank() != 4) fail(in, "the weight must be [out_channels, in_channels/groups, kH, kW]");
    if (x[1] % a.groups != 0 || w[0] % a.groups != 0)
      fail(in, "groups (" + std::to_string(a.groups) + ") must divide the input channels and the output channels");
    if (a.bias && (in[2].rank() != 1 || in[2][0] != w[0]))
      fail(in, "the bias is " + to_string(in[2]) + "; it must be [out_channels] = [" + std::to_string(w[0]) + "]");
    if (w[1] * a.groups != x[1])
      fail(in, "the weight's dim 1 (" + std::to_string(w[1]) + ") times groups (" + std::to_string(a.groups) +
                   ") must equal the input's channels (" + std::to_string(x[1]) + ")");
    for (int d = 0; d < 2; ++d) {
      const Index extent = x[2 + d] + Index(2) * a.padding[d], window = Index(a.dilation[d]) * (w[2 + d] - 1) + 1;
      if (extent < window)
        fail(in, std::string("the padded input is ") + std::to_string(extent) + (d == 0 ? " high" : " wide") +
                     ", smaller than the dilated kernel (" + std::to_string(window) + ")");
    }
  }
};

/// Conv2dOptions → the op's Params; throws domain_error naming conv2d for a stride or dilation below 1, a negative
/// padding, groups below 1, or a value beyond 2^31 − 1.
inline Conv2dOp::Params conv2d_params(const Conv2dOptions& o) {
  auto fit = [](Index v, Index least, const char* what) {
    if (v < least || v > INT_MAX)
      throw domain_error(std::string("conv2d: ") + what + " is " + std::to_string(v) + "; it must be at least " +
                         std::to_string(least) + " (and below 2^31)");
    return static_cast<std::int32_t>(v);
  };
  Conv2dOp::Params p;
  p.stride[0] = fit(o.stride().height, 1, "stride");
  p.stride[1] = fit(o.stride().width, 1, "stride");
  p.padding[0] = fit(o.padding().height, 0, "padding");
  p.padding[1] = fit(o.padding().width, 0, "padding");
  p.dilation[0] = fit(o.dilation().height, 1, "dilation");
  p.dilation[1] = fit(o.dilation().width, 1, "dilation");
  p.groups = fit(o.groups(), 1, "groups");
  return p;
}

/// Sets p.onednn_threads when T is float, oneDNN is enabled (backends::onednn) and oneDNN can run this
/// convolution: then its kernels, scratch and plan follow remat's current thread count. Throws what conv2d
/// throws for bad shapes (before oneDNN sees them).
template <class T>
void choose_conv2d_kernel(Conv2dOp::Params& p, const Shape* in) {
#ifdef REMAT_USE_ONEDNN
  if constexpr (std::is_same_v<T, float>) {
    if (!backends::onednn::enabled()) return;
    Conv2dOp::check_shapes(in, p);
    p.onednn_threads = num_threads();
    try {
      if (!onednn::plan(Conv2dOp::onednn_key(Conv2dOp::geometry(in, p), p))->usable) p.onednn_threads = 0;
    } catch (const dnnl::error& e) {
      if (e.status == dnnl_out_of_memory) throw std::bad_alloc();
      p.onednn_threads = 0;  // a convolution oneDNN does not run: im2col
    }
  }
#else
  static_cast<void>(p);
  static_cast<void>(in);
#endif
}

}  // namespace detail

/// 2-D convolution, torch.nn.functional.conv2d without bias: y[n, o, i, j] = Σ_{c, a, b} w[o, c, a, b] ·
/// x[n, g·C/G + c, i·sh − ph + a·dh, j·sw − pw + b·dw] over the C/G input channels of o's group g (zero outside
/// the input). x: [N, C, H, W]; weight: [O, C/G, kH, kW] → [N, O, Hout, Wout] with
/// Hout = ⌊(H + 2·ph − dh·(kH − 1) − 1) / sh⌋ + 1 (Wout likewise). dx is the transposed convolution of dy with w,
/// dw the correlation of x with dy. FLOPs 2·N·O·Hout·Wout·(C/G)·kH·kW.
///
/// Kernels. In float, when remat was built with oneDNN and backends::onednn::enabled() when the op is recorded,
/// oneDNN's direct convolution kernels (forward, backward data, backward weights), in the blocked layouts oneDNN
/// chooses: the op's temporary then holds the reordered copies of the tensors and oneDNN's scratchpad. The op
/// runs every call — forward, replay, backward — on the thread count remat::num_threads() had when it was
/// recorded, so a replay reproduces its value bitwise whatever the setting is then (a CapturedStep keeps the
/// thread count of its capture for its convolutions). oneDNN's value and dx came out bitwise the same at every
/// thread count on its direct kernels (tests/ops/conv2d_onednn_test.cpp); its dw is summed over the batch in
/// per-thread parts, so it may differ in the last bits between thread counts, as OpenBLAS's threaded products do
/// (bitwise reproducible at a fixed count). Shapes oneDNN would run on its GEMM-based convolution, whose value
/// rounds differently by thread count, and shapes whose blocked copies would exceed 4× the tensors (few channels,
/// padded to oneDNN's 16-channel blocks) run on im2col. oneDNN allocates small objects at each call: an
/// allocation failure there while the op is recorded throws (nothing is recorded), but in a backward sweep it ends
/// the program, as any exception from a backward does (and oneDNN 2.6 itself crashed when malloc returned null
/// inside it in a fault-injection run); backends::onednn::set_enabled(false) gives im2col, whose kernels allocate
/// nothing. A plan (oneDNN's primitives and the temporary's layout, about 200 KB) is made per distinct shape and
/// thread count and kept in a least-recently-used cache of backends::onednn::plan_cache_capacity() plans (64 by
/// default): a plan evicted and made again is the same plan, with the same values bitwise and the same temporary
/// bytes, so an op recorded before its plan's eviction runs its backward and replays as if it had stayed.
/// Otherwise (double, or without oneDNN): im2col (Chellapilla, Puri & Simard, "High Performance Convolutional
/// Neural Networks for Document Processing", 2006) of one sample and group into the op's temporary
/// ([C/G·kH·kW, Hout·Wout] elements) and one GEMM, bitwise the same at every thread count. Either temporary counts
/// in the peak, never in the saved bytes. Its OpInfo kind is
/// convolution: dots_saveable keeps its output, dots_with_no_batch_dims_saveable does not (as JAX's policies treat
/// conv_general_dilated). Throws shape_error naming conv2d for shapes that do not fit, domain_error for bad
/// options, tape_error for an empty or stale Var.
template <class T>
Var<T> conv2d(const Var<T>& x, const Var<T>& weight, const Conv2dOptions& options = {}) {
  detail::Conv2dOp::Params p = detail::conv2d_params(options);
  const Shape in[2] = {x.shape("conv2d"), weight.shape("conv2d")};
  detail::choose_conv2d_kernel<T>(p, in);
  return apply_op<detail::Conv2dOp>(p, x, weight);
}

/// conv2d plus a bias [O] added to every output channel (fused: no other node): y[n, o, i, j] += bias[o];
/// dbias[o] = Σ_{n,i,j} dy[n,o,i,j]. Throws what conv2d throws, and shape_error naming conv2d unless bias is [O].
template <class T>
Var<T> conv2d(const Var<T>& x, const Var<T>& weight, const Var<T>& bias, const Conv2dOptions& options = {}) {
  detail::Conv2dOp::Params p = detail::conv2d_params(options);
  p.bias = 1;
  const Shape in[3] = {x.shape("conv2d"), weight.shape("conv2d"), bias.shape("conv2d")};
  detail::choose_conv2d_kernel<T>(p, in);
  return apply_op<detail::Conv2dOp>(p, x, weight, bias);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::Conv2dOp)
