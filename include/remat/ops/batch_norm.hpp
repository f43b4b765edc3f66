// batch_norm: batch normalisation over the channel dimension of [N, C, *] (Ioffe & Szegedy 2015), with running
// statistics updated once per recorded step, never by a checkpoint's replay.
#pragma once

#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "remat/errors.hpp"
#include "remat/op.hpp"
#include "remat/ops/add.hpp"
#include "remat/ops/multiply.hpp"
#include "remat/ops/reshape.hpp"
#include "remat/parameter.hpp"
#include "remat/tape.hpp"

namespace remat {

/// The attributes of batch_norm, as torch::nn::functional::BatchNormFuncOptions: the affine weight and bias
/// (optional Vars of shape [C]), training (batch statistics, default false: running statistics), momentum
/// (default 0.1) and eps (default 1e-5), each a chained setter.
template <class T>
struct BatchNormFuncOptions {
  /// γ, [C]: multiplies the normalised value (none: 1).
  BatchNormFuncOptions& weight(const Var<T>& w) {
    weight_ = w;
    has_weight_ = true;
    return *this;
  }
  /// β, [C]: added after (none: 0).
  BatchNormFuncOptions& bias(const Var<T>& b) {
    bias_ = b;
    has_bias_ = true;
    return *this;
  }
  /// true: normalise by the batch's statistics and update the running ones; false: by the running ones.
  BatchNormFuncOptions& training(bool t) {
    training_ = t;
    return *this;
  }
  /// The running statistics' update weight, in [0, 1]: running = (1 − momentum)·running + momentum·batch.
  BatchNormFuncOptions& momentum(double m) {
    momentum_ = m;
    return *this;
  }
  /// Added to the variance before the square root, ≥ 0.
  BatchNormFuncOptions& eps(double e) {
    eps_ = e;
    return *this;
  }
  const Var<T>& weight() const { return weight_; }  ///< γ (when has_weight())
  const Var<T>& bias() const { return bias_; }      ///< β (when has_bias())
  bool has_weight() const { return has_weight_; }   ///< weight() was set
  bool has_bias() const { return has_bias_; }       ///< bias() was set
  bool training() const { return training_; }       ///< batch statistics (true) or running ones
  double momentum() const { return momentum_; }     ///< the running statistics' update weight
  double eps() const { return eps_; }               ///< added to the variance

 private:
  Var<T> weight_, bias_;
  bool has_weight_ = false, has_bias_ = false;
  bool training_ = false;
  double momentum_ = 0.1;
  double eps_ = 1e-5;
};

namespace detail {

template <class T>
struct NotDeducedType {
  using type = T;
};
/// T in a parameter that does not take part in deduction (so nullptr converts to a null Parameter<T>*).
template <class T>
using NotDeduced = typename NotDeducedType<T>::type;

/// Training-mode batch normalisation: batch statistics per channel, kept as the extra residual [2, C] (mean, 1/σ).
struct BatchNormOp : OpBase {
  static constexpr const char* name = "batch_norm";
  static constexpr OpKind kind = OpKind::normalization;
  /// 40 bytes (max_params_bytes): three pointers and two doubles, the three flags in the low bits of the counter's
  /// address (an std::int64_t is 8-aligned, so they are free).
  struct Params {
    void* running_mean = nullptr;  ///< T[C] updated when the op is recorded (null: none)
    void* running_var = nullptr;   ///< T[C], likewise, with the unbiased variance
    /// The address of the std::int64_t num_batches_tracked incremented when the op is recorded (0: none), or'ed
    /// with has_weight_flag, has_bias_flag and cumulative_flag.
    std::uintptr_t counter_and_flags = 0;
    double momentum = 0.1;
    double eps = 1e-5;

    static constexpr std::uintptr_t has_weight_flag = 1;  ///< input 1 is the weight [C]
    static constexpr std::uintptr_t has_bias_flag = 2;    ///< the next input is the bias [C]
    static constexpr std::uintptr_t cumulative_flag = 4;  ///< momentum None: the update weight is 1/counter
    static constexpr std::uintptr_t flag_bits = 7;
    int has_weight() const { return (counter_and_flags & has_weight_flag) ? 1 : 0; }
    int has_bias() const { return (counter_and_flags & has_bias_flag) ? 1 : 0; }
    bool cumulative() const { return (counter_and_flags & cumulative_flag) != 0; }
    std::int64_t* counter() const { return reinterpret_cast<std::int64_t*>(counter_and_flags & ~flag_bits); }
  };
  static_assert(alignof(std::int64_t) >= 8, "the flags need the counter's three low bits");
  /// Channels and elements per channel and sample of x [N, C, *].
  static Index channels(const Shape& x) { return x[1]; }
  static Index inner(const Shape& x) { return x.numel() / (x[0] * x[1]); }

  /// dx and dweight read x and the statistics; dx also the weight (input 1: the bias when there is no weight,
  /// which costs nothing, a leaf); dbias reads nothing.
  static unsigned reads(GradInputs g) {
    return (wants(g, 0) || wants(g, 1) ? reads_input0 | reads_extra : 0u) | (wants(g, 0) ? reads_input1 : 0u);
  }
  static Shape output_shape(const Shape* in, const Params& p) {
    const Shape& x = in[0];
    if (x.rank() < 2) throw shape_error("batch_norm: x is " + to_string(x) + "; it must be [N, C, *] (rank 2 or more)");
    for (int k = 1; k <= p.has_weight() + p.has_bias(); ++k)
      if (in[k].rank() != 1 || in[k][0] != x[1])
        throw shape_error(std::string("batch_norm: x is ") + to_string(x) + " but " +
                          (k == 1 && p.has_weight() ? "weight" : "bias") + " is " + to_string(in[k]) +
                          "; it must be [" + std::to_string(x[1]) + "], one per channel");
    if (x.numel() / x[1] < 2)
      throw shape_error("batch_norm: x is " + to_string(x) +
                        "; training needs more than one value per channel (as PyTorch: a batch of one sample "
                        "without spatial dims has no variance); use training(false) or a larger batch");
    return x;
  }
  static Shape extra_shape(const Shape* in, const Params&) { return {2, in[0][1]}; }

  template <class T>
  using Segment = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Params p = params_of<Params>(c);
    const Shape s = c.in_shape(0);
    const Index N = s[0], C = channels(s), S = inner(s);
    const double M = static_cast<double>(N * S);
    const T* x = c.in(0).data();
    T* y = c.out().data();
    auto stats = c.extra();
    const T* w = p.has_weight() ? c.in(1).data() : nullptr;
    const T* b = p.has_bias() ? c.in(1 + p.has_weight()).data() : nullptr;
    T* running_mean = c.recording() ? static_cast<T*>(p.running_mean) : nullptr;
    T* running_var = c.recording() ? static_cast<T*>(p.running_var) : nullptr;
    // The effects outside the tape, only on the record (never on a replay or a regeneration): the counter first,
    // since a cumulative average weighs this batch by 1/(the count including it), as PyTorch does.
    double momentum = p.momentum;
    if (std::int64_t* counter = c.recording() ? p.counter() : nullptr) {
      ++*counter;
      if (p.cumulative()) momentum = 1.0 / static_cast<double>(*counter);
    }
    const T m = T(momentum);
    for_row_blocks(C, N * S, 8, [&](Index c0, Index count) {
      for (Index ch = c0; ch < c0 + count; ++ch) {
        T sum = 0;
        for (Index n = 0; n < N; ++n) sum += Segment<T>(x + (n * C + ch) * S, S).sum();
        const T mean = sum / T(M);
        T squares = 0;
        for (Index n = 0; n < N; ++n) squares += (Segment<T>(x + (n * C + ch) * S, S) - mean).square().sum();
        const T var = squares / T(M);
        const T rstd = T(1) / std::sqrt(var + T(p.eps));
        stats(0, ch) = mean;
        stats(1, ch) = rstd;
        const T scale = w ? rstd * w[ch] : rstd;
        const T shift = b ? b[ch] : T(0);
        for (Index n = 0; n < N; ++n) {
          Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(y + (n * C + ch) * S, S) =
              (Segment<T>(x + (n * C + ch) * S, S) - mean) * scale + shift;
        }
        if (running_mean) running_mean[ch] = (T(1) - m) * running_mean[ch] + m * mean;
        if (running_var) running_var[ch] = (T(1) - m) * running_var[ch] + m * T(squares / T(M - 1));
      }
    });
  }

  /// With x̂ = (x − μ)/σ, g = dy: dβ = Σ g, dγ = Σ g·x̂, dx = γ/σ · (g − Σg/M − x̂·Σ(g·x̂)/M) per channel.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Params p = params_of<Params>(c);
    const Shape s = c.out_shape();
    const Index N = s[0], C = channels(s), S = inner(s);
    const T M = T(N * S);
    const T* g = c.grad_out().data();
    const int kw = p.has_weight() ? 1 : -1, kb = p.has_bias() ? 1 + p.has_weight() : -1;
    const bool want_x = c.wants_grad(0), want_w = kw > 0 && c.wants_grad(kw), want_b = kb > 0 && c.wants_grad(kb);
    GradTarget<T> dx = want_x ? c.grad_target(0) : GradTarget<T>{AlignedMap<T>(nullptr, 0, 0), false};
    GradTarget<T> dw = want_w ? c.grad_target(kw) : GradTarget<T>{AlignedMap<T>(nullptr, 0, 0), false};
    GradTarget<T> db = want_b ? c.grad_target(kb) : GradTarget<T>{AlignedMap<T>(nullptr, 0, 0), false};
    const T* x = want_x || want_w ? c.in(0).data() : nullptr;
    const T* w = want_x && p.has_weight() ? c.in(1).data() : nullptr;
    const auto stats = c.extra();
    for_row_blocks(C, N * S, 12, [&](Index c0, Index count) {
      for (Index ch = c0; ch < c0 + count; ++ch) {
        T sum_g = 0;
        for (Index n = 0; n < N; ++n) sum_g += Segment<T>(g + (n * C + ch) * S, S).sum();
        if (want_b) db.map.data()[ch] = db.accumulate ? db.map.data()[ch] + sum_g : sum_g;
        if (!want_x && !want_w) continue;
        const T mean = stats(0, ch), rstd = stats(1, ch);
        T sum_gx = 0;  // Σ g·(x − μ)
        for (Index n = 0; n < N; ++n)
          sum_gx += (Segment<T>(g + (n * C + ch) * S, S) * (Segment<T>(x + (n * C + ch) * S, S) - mean)).sum();
        if (want_w) dw.map.data()[ch] = dw.accumulate ? dw.map.data()[ch] + sum_gx * rstd : sum_gx * rstd;
        if (!want_x) continue;
        const T scale = w ? w[ch] * rstd : rstd;
        const T mean_g = sum_g / M, k = sum_gx * rstd * rstd / M;
        for (Index n = 0; n < N; ++n) {
          const auto gx = Segment<T>(g + (n * C + ch) * S, S);
          const auto xx = Segment<T>(x + (n * C + ch) * S, S);
          Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> d(dx.map.data() + (n * C + ch) * S, S);
          assign_or_add(d, scale * (gx - mean_g - (xx - mean) * k), dx.accumulate);
        }
      }
    });
  }
  static double flops(const Shape* in, int, const Shape&) { return 8.0 * static_cast<double>(in[0].numel()); }
};

/// y[n, c, …] = x[n, c, …]·a[c] + b[c] for x [N, C, *] and a, b of C elements (batch_norm in evaluation, once a and
/// b are folded from the running statistics, weight and bias): da[c] = Σ dy·x, db[c] = Σ dy, dx = dy·a[c].
struct ChannelAffineOp : OpBase {
  static constexpr const char* name = "batch_norm";
  static constexpr OpKind kind = OpKind::normalization;
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const Shape s = c.in_shape(0);
    const Index N = s[0], C = s[1], S = s.numel() / (N * C);
    const T *x = c.in(0).data(), *a = c.in(1).data(), *b = c.in(2).data();
    T* y = c.out().data();
    for_row_blocks(N * C, S, 2, [&](Index r0, Index count) {
      for (Index r = r0; r < r0 + count; ++r)
        Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(y + r * S, S) =
            Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x + r * S, S) * a[r % C] + b[r % C];
    });
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const Shape s = c.out_shape();
    const Index N = s[0], C = s[1], S = s.numel() / (N * C);
    using Segment = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
    const T* g = c.grad_out().data();
    if (c.wants_grad(0)) {
      const T* a = c.in(1).data();
      GradTarget<T> dx = c.grad_target(0);
      for_row_blocks(N * C, S, 1, [&](Index r0, Index count) {
        for (Index r = r0; r < r0 + count; ++r)
          assign_or_add(Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(dx.map.data() + r * S, S),
                        Segment(g + r * S, S) * a[r % C], dx.accumulate);
      });
    }
    for (int k = 1; k <= 2; ++k) {  // per channel, sums over n in order: the same at every thread count
      if (!c.wants_grad(k)) continue;
      GradTarget<T> d = c.grad_target(k);
      const T* x = k == 1 ? c.in(0).data() : nullptr;
      for_row_blocks(C, N * S, 2, [&](Index c0, Index count) {
        for (Index ch = c0; ch < c0 + count; ++ch) {
          T sum = 0;
          for (Index n = 0; n < N; ++n)
            sum += x ? (Segment(g + (n * C + ch) * S, S) * Segment(x + (n * C + ch) * S, S)).sum()
                     : Segment(g + (n * C + ch) * S, S).sum();
          d.map.data()[ch] = d.accumulate ? d.map.data()[ch] + sum : sum;
        }
      });
    }
  }
  static double flops(const Shape* in, int, const Shape&) { return 2.0 * static_cast<double>(in[0].numel()); }
};

/// Throws domain_error naming batch_norm for a momentum outside [0, 1] or an eps below 0 or not finite.
inline void check_batch_norm_options(double momentum, double eps) {
  if (!(momentum >= 0 && momentum <= 1))
    throw domain_error("batch_norm: momentum is " + number_text(momentum) + "; it must be in [0, 1]");
  if (!(eps >= 0 && eps < std::numeric_limits<double>::infinity()))
    throw domain_error("batch_norm: eps is " + number_text(eps) + "; it must be finite and at least 0");
}

/// Throws shape_error naming batch_norm unless the running statistic `p` (named `what`) holds one value per
/// channel of x.
template <class T>
void check_running_statistic(const Parameter<T>* p, const char* what, const Shape& x) {
  if (p && p->value().size() != x[1])
    throw shape_error(std::string("batch_norm: x is ") + to_string(x) + " but " + what + " has " +
                      std::to_string(p->value().size()) + " elements; it must have " + std::to_string(x[1]) +
                      ", one per channel");
}

/// [1, C, 1, …] (rank r) for a per-channel value broadcast against x of rank r.
inline Shape channel_shape(const Shape& x) {
  Shape s = x;
  s[0] = 1;
  for (int d = 2; d < x.rank(); ++d) s[d] = 1;
  return s;
}

/// Evaluation: y = x·a + c per channel (ChannelAffineOp) with a = γ/√(running_var + eps) and c = β − running_mean·a,
/// where running_mean and 1/√(running_var + eps) are constants recorded on the tape (so a replay reads the values of
/// the record) and γ, β carry their gradients through the ops.
template <class T>
Var<T> batch_norm_evaluation(const Var<T>& x, const Parameter<T>& running_mean, const Parameter<T>& running_var,
                             const BatchNormFuncOptions<T>& o) {
  const Shape xs = x.shape("batch_norm"), cs = channel_shape(xs);
  const Index C = xs[1];
  Matrix<T> host(2, C);  // row 0: 1/σ, row 1: −μ/σ
  for (Index ch = 0; ch < C; ++ch) {
    host(0, ch) = T(1) / std::sqrt(running_var.value().data()[ch] + T(o.eps()));
    host(1, ch) = -running_mean.value().data()[ch] * host(0, ch);
  }
  Var<T> scale = new_tensor(x, cs, host.row(0).eval().data());
  Var<T> shift = new_tensor(x, cs, host.row(1).eval().data());
  if (o.has_weight()) {
    const ArrayRef<Index> dims(cs.begin(), static_cast<std::size_t>(cs.rank()));
    const Var<T> w = reshape(o.weight(), dims);
    scale = multiply(scale, w);
    shift = multiply(shift, w);
  }
  if (o.has_bias())
    shift = add(shift, reshape(o.bias(), ArrayRef<Index>(cs.begin(), static_cast<std::size_t>(cs.rank()))));
  return apply_op<ChannelAffineOp>(x, scale, shift);
}

/// batch_norm, with nn::BatchNorm2d's counter: in training, a recorded op also adds 1 to *num_batches_tracked
/// (when not null) before updating the running statistics, and `cumulative` (momentum None, which needs the
/// counter) weighs the batch by 1/(*num_batches_tracked) instead of options.momentum(): PyTorch's cumulative moving
/// average. The counter is written through a pointer kept with the op, like the running statistics.
template <class T>
Var<T> batch_norm_tracked(const Var<T>& x, Parameter<T>* running_mean, Parameter<T>* running_var,
                          std::int64_t* num_batches_tracked, bool cumulative, const BatchNormFuncOptions<T>& options) {
  check_batch_norm_options(options.momentum(), options.eps());
  const Shape xs = x.shape("batch_norm");
  if (xs.rank() >= 2) {
    check_running_statistic(running_mean, "running_mean", xs);
    check_running_statistic(running_var, "running_var", xs);
  }
  if (!options.training()) {
    if (!running_mean || !running_var)
      throw domain_error(
          "batch_norm: evaluation (training(false)) normalises by the running statistics, but running_mean or "
          "running_var is null; pass both, or training(true) for the batch's statistics");
    if (xs.rank() < 2)
      throw shape_error("batch_norm: x is " + to_string(xs) + "; it must be [N, C, *] (rank 2 or more)");
    for (int k = 0; k < 2; ++k) {
      if (!(k == 0 ? options.has_weight() : options.has_bias())) continue;
      const Shape s = (k == 0 ? options.weight() : options.bias()).shape("batch_norm");
      if (s.rank() != 1 || s[0] != xs[1])
        throw shape_error("batch_norm: x is " + to_string(xs) + " but " + (k == 0 ? "weight" : "bias") + " is " +
                          to_string(s) + "; it must be [" + std::to_string(xs[1]) + "], one per channel");
    }
    return batch_norm_evaluation(x, *running_mean, *running_var, options);
  }
  BatchNormOp::Params p;
  p.momentum = options.momentum();
  p.eps = options.eps();
  const auto address = reinterpret_cast<std::uintptr_t>(num_batches_tracked);
  assert((address & BatchNormOp::Params::flag_bits) == 0);  // an std::int64_t is 8-aligned (static_assert above)
  p.counter_and_flags = address | (options.has_weight() ? BatchNormOp::Params::has_weight_flag : 0) |
                        (options.has_bias() ? BatchNormOp::Params::has_bias_flag : 0) |
                        (cumulative ? BatchNormOp::Params::cumulative_flag : 0);
  // Written only by the op's forward when recorded (not through mutable_value(), which a shapes-only tape, that
  // changes no Parameter, must not call): state without gradient, like PyTorch's buffers. So is the counter.
  if (running_mean) p.running_mean = const_cast<T*>(running_mean->value().data());
  if (running_var) p.running_var = const_cast<T*>(running_var->value().data());
  if (p.has_weight() && p.has_bias()) return apply_op<BatchNormOp>(p, x, options.weight(), options.bias());
  if (p.has_weight()) return apply_op<BatchNormOp>(p, x, options.weight());
  if (p.has_bias()) return apply_op<BatchNormOp>(p, x, options.bias());
  return apply_op<BatchNormOp>(p, x);
}

}  // namespace detail

/// Batch normalisation, torch.nn.functional.batch_norm (Ioffe & Szegedy, "Batch Normalization", ICML 2015):
/// per channel c of x [N, C, *], y = (x − μ_c)/√(σ²_c + eps)·γ_c + β_c.
///
/// Training (options.training(true)): μ and σ² are the batch's mean and biased variance over N and the spatial
/// dims; the derivative, with x̂ = (x − μ)/σ and M = N·∏spatial, is dx = γ/σ·(dy − Σdy/M − x̂·Σ(dy·x̂)/M),
/// dγ = Σ dy·x̂, dβ = Σ dy. Keeps x and the statistics [2, C] (μ, 1/σ) as residuals; its OpInfo kind is
/// normalization, so dots_saveable recomputes it. When the tape records the op, each non-null running statistic
/// is updated as PyTorch does, running = (1 − momentum)·running + momentum·batch with the unbiased variance
/// σ²·M/(M − 1) for running_var: once per recorded step (and per run of a CapturedStep), never when a checkpoint
/// replays the op or a memory budget regenerates it (ForwardContext::recording), so the running statistics after
/// a step are the same, bitwise, under every policy — unlike PyTorch's reentrant torch.utils.checkpoint, which
/// updates them again in its recomputation. A shapes-only tape (estimate_memory) updates nothing; under anomaly
/// detection, an output that is refused (anomaly_error) has already updated them. The running
/// statistics' buffers are written through pointers kept with the op: they must stay alive and unresized while the
/// tape (or a CapturedStep of it) may record or run it.
///
/// Evaluation (the default, training(false)): μ and σ² are running_mean and running_var, both required; it is
/// recorded as x·a + c with a = γ/√(running_var + eps), c = β − μ·a (one pass over x, and small ops on
/// [1, C, 1, …] that fold a and c); the running statistics are copied to the tape, so changing them later changes
/// nothing recorded.
///
/// x: [N, C, *] (rank ≥ 2); weight, bias: [C]; running_mean, running_var: Parameters of C elements, or null.
/// Returns x's shape. Throws shape_error naming batch_norm for other shapes or, in training, a single value per
/// channel (as PyTorch); domain_error for a momentum outside [0, 1], a negative eps, or evaluation without running
/// statistics; tape_error for an empty or stale Var; the tape and the running statistics are unchanged then.
template <class T>
Var<T> batch_norm(const Var<T>& x, detail::NotDeduced<Parameter<T>>* running_mean,
                  detail::NotDeduced<Parameter<T>>* running_var, const BatchNormFuncOptions<T>& options = {}) {
  return detail::batch_norm_tracked<T>(x, running_mean, running_var, nullptr, false, options);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::BatchNormOp)
REMAT_OP_KERNELS(remat::detail::ChannelAffineOp)
