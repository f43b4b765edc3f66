// nn::BatchNorm2d: batch normalisation over the channels of [N, C, H, W] (remat::batch_norm) with its affine
// Parameters, running statistics and num_batches_tracked.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "remat/errors.hpp"
#include "remat/ops/batch_norm.hpp"
#include "remat/parameter.hpp"
#include "remat/tape.hpp"

namespace remat {
namespace detail {
/// nn::BatchNorm2d's num_batches_tracked: an std::int64_t on the heap, so that its address (kept by the ops a tape
/// recorded) moves with its owner as a Parameter's storage does: a copy gets storage of its own with the value; a move
/// takes the storage (the moved-from counter reads 0 and gets new storage when written); an assignment copies the value
/// into this object's storage, which stays where tapes recorded it.
class Counter {
 public:
  Counter() : value_(std::make_unique<std::int64_t>(0)) {}
  Counter(const Counter& other) : value_(std::make_unique<std::int64_t>(other.get())) {}
  Counter(Counter&& other) noexcept = default;
  Counter& operator=(const Counter& other) {
    ref() = other.get();
    return *this;
  }
  Counter& operator=(Counter&& other) {
    ref() = other.get();
    return *this;
  }
  std::int64_t get() const { return value_ ? *value_ : 0; }
  std::int64_t& ref() {
    if (!value_) value_ = std::make_unique<std::int64_t>(0);
    return *value_;
  }

 private:
  std::unique_ptr<std::int64_t> value_;
};
}  // namespace detail

namespace nn {

/// torch.nn.BatchNorm2d(C, eps, momentum): weight (γ) [C] = 1 and bias (β) [C] = 0 as Parameters that learn;
/// running_mean [C] = 0 and running_var [C] = 1 as Parameters that no tape gives a gradient, and
/// num_batches_tracked, a 64-bit count (PyTorch's buffers: keep them out of the optimizer, save and load them with
/// the weights; safetensors::torch_batch_norm2d names all five as PyTorch's state_dict does). forward() follows the
/// tape's mode (Tape::set_training): batch statistics in training, where each recorded forward adds 1 to
/// num_batches_tracked and then updates the running statistics, once (never again when a checkpoint replays it or
/// a memory budget regenerates it; once per run of a CapturedStep); the running statistics in evaluation, which
/// change nothing.
///
/// momentum: the running statistics' update weight, running = (1 − momentum)·running + momentum·batch, or
/// std::nullopt (PyTorch's momentum=None) for the cumulative moving average, whose weight is
/// 1/num_batches_tracked (the count including this batch): after n training forwards from a count of 0 the
/// running statistics are the mean of the n batches' statistics.
///
/// The running statistics and the counter are written, when a recorded op runs, through pointers the op keeps:
/// they follow the layer when it moves (their storage moves with it), but the layer must stay alive while a tape
/// or a CapturedStep that recorded its training forward may run.
template <class T>
class BatchNorm2d {
 public:
  /// C channels. Throws shape_error for C < 1, domain_error for what batch_norm refuses (a momentum outside
  /// [0, 1], eps below 0).
  explicit BatchNorm2d(Index channels, double eps = 1e-5, std::optional<double> momentum = 0.1)
      : eps_(eps), momentum_(momentum) {
    if (channels < 1)
      throw shape_error("nn::BatchNorm2d: " + std::to_string(channels) + " channels; it needs at least one");
    detail::check_batch_norm_options(momentum.value_or(0.1), eps);
    Tensor<T, 1> ones(channels), zeros(channels);
    ones.setConstant(T(1));
    zeros.setZero();
    weight = Parameter<T>(ones);
    bias = Parameter<T>(zeros);
    running_mean = Parameter<T>(zeros);
    running_var = Parameter<T>(ones);
  }

  /// batch_norm(x, running_mean, running_var) with γ and β recorded on `tape`, in the tape's mode, counting the
  /// training forwards in num_batches_tracked. x: [N, C, H, W]. Throws what batch_norm throws (shape_error naming
  /// batch_norm for x's channels other than C); domain_error, in training with momentum None, for a negative
  /// num_batches_tracked; nothing is counted or updated then.
  Var<T> forward(Tape<T>& tape, const Var<T>& x) {
    if (tape.training() && !momentum_ && num_batches_tracked_.get() < 0)
      throw domain_error("nn::BatchNorm2d: num_batches_tracked is " + std::to_string(num_batches_tracked_.get()) +
                         "; the cumulative average (momentum None) needs a count of at least 0");
    const auto options = BatchNormFuncOptions<T>()
                             .weight(tape.variable(weight))
                             .bias(tape.variable(bias))
                             .training(tape.training())
                             .momentum(momentum_.value_or(0.1))
                             .eps(eps_);
    return detail::batch_norm_tracked<T>(x, &running_mean, &running_var, &num_batches_tracked_.ref(), !momentum_,
                                         options);
  }

  Index channels() const { return weight.value().size(); }  ///< C
  double eps() const { return eps_; }                       ///< added to the variance
  /// The running statistics' update weight; std::nullopt: the cumulative moving average (weight
  /// 1/num_batches_tracked).
  std::optional<double> momentum() const { return momentum_; }
  /// The training forwards recorded so far (PyTorch's num_batches_tracked, an int64 buffer); 0 at construction.
  std::int64_t num_batches_tracked() const { return num_batches_tracked_.get(); }
  /// The count, writable (to reset it, or for safetensors::load to read it into); the reference stays valid while
  /// the layer lives, and follows it when it moves.
  std::int64_t& num_batches_tracked() { return num_batches_tracked_.ref(); }

  Parameter<T> weight;        ///< γ [C], learnt
  Parameter<T> bias;          ///< β [C], learnt
  Parameter<T> running_mean;  ///< [C], updated by training steps, never given a gradient
  Parameter<T> running_var;   ///< [C], likewise (unbiased batch variances)

 private:
  double eps_;
  std::optional<double> momentum_;
  detail::Counter num_batches_tracked_;
};

}  // namespace nn
}  // namespace remat
