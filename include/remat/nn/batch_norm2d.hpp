// nn::BatchNorm2d: batch normalisation over the channels of [N, C, H, W] (remat::batch_norm) with its affine
// Parameters and running statistics.
#pragma once

#include <string>
#include <vector>

#include "remat/errors.hpp"
#include "remat/ops/batch_norm.hpp"
#include "remat/parameter.hpp"
#include "remat/tape.hpp"

namespace remat::nn {

/// torch.nn.BatchNorm2d(C, eps, momentum): weight (γ) [C] = 1 and bias (β) [C] = 0 as Parameters that learn;
/// running_mean [C] = 0 and running_var [C] = 1 as Parameters that no tape gives a gradient (PyTorch's buffers:
/// keep them out of the optimizer, save and load them with the weights). forward() follows the tape's mode
/// (Tape::set_training): batch statistics, updating the running ones once per recorded step, in training; the
/// running ones in evaluation.
template <class T>
class BatchNorm2d {
 public:
  /// C channels. Throws shape_error for C < 1, domain_error for what batch_norm refuses (momentum outside
  /// [0, 1], eps below 0).
  explicit BatchNorm2d(Index channels, double eps = 1e-5, double momentum = 0.1) : eps_(eps), momentum_(momentum) {
    if (channels < 1)
      throw shape_error("nn::BatchNorm2d: " + std::to_string(channels) + " channels; it needs at least one");
    detail::check_batch_norm_options(momentum, eps);
    Tensor<T, 1> ones(channels), zeros(channels);
    ones.setConstant(T(1));
    zeros.setZero();
    weight = Parameter<T>(ones);
    bias = Parameter<T>(zeros);
    running_mean = Parameter<T>(zeros);
    running_var = Parameter<T>(ones);
  }

  /// batch_norm(x, running_mean, running_var) with γ and β recorded on `tape`, in the tape's mode. x: [N, C, H, W].
  /// Throws what batch_norm throws (shape_error naming batch_norm for x's channels other than C).
  Var<T> forward(Tape<T>& tape, const Var<T>& x) {
    const auto options = BatchNormFuncOptions<T>()
                             .weight(tape.variable(weight))
                             .bias(tape.variable(bias))
                             .training(tape.training())
                             .momentum(momentum_)
                             .eps(eps_);
    return batch_norm(x, &running_mean, &running_var, options);
  }

  Index channels() const { return weight.value().size(); }  ///< C
  double eps() const { return eps_; }                       ///< added to the variance
  double momentum() const { return momentum_; }             ///< the running statistics' update weight

  Parameter<T> weight;        ///< γ [C], learnt
  Parameter<T> bias;          ///< β [C], learnt
  Parameter<T> running_mean;  ///< [C], updated by training steps, never given a gradient
  Parameter<T> running_var;   ///< [C], likewise (unbiased batch variances)

 private:
  double eps_, momentum_;
};

}  // namespace remat::nn
