// nn::Conv2d: a 2-D convolution layer (remat::conv2d) whose weight and bias are remat::Parameters.
#pragma once

#include <cmath>
#include <string>

#include "remat/errors.hpp"
#include "remat/nn/linear.hpp"
#include "remat/ops/conv2d.hpp"
#include "remat/parameter.hpp"
#include "remat/tape.hpp"

namespace remat::nn {

/// The parameters of a convolution layer x [N, in, H, W] → [N, out, Hout, Wout] (remat::conv2d), as
/// torch.nn.Conv2d: weight [out, in/groups, kH, kW] and an optional bias [out], initialised as PyTorch 1.13 does
/// (kaiming_uniform_ with a = √5, which is U(−1/√fan_in, 1/√fan_in) for the weight, and the same bound for the
/// bias, fan_in = in/groups · kH · kW), drawn in row-major order from `generator`.
template <class T>
class Conv2d {
 public:
  /// `in` → `out` channels with a `kernel` (one size for both sides, or {kH, kW}); `options` gives stride,
  /// padding, dilation and groups; `bias` false for a layer without bias (before a batch norm). Throws
  /// shape_error unless in, out and the kernel sizes are ≥ 1 and groups divides in and out; domain_error for
  /// options conv2d refuses.
  Conv2d(Index in, Index out, Size2 kernel, Generator& generator, const Conv2dOptions& options = {}, bool bias = true)
      : options_(options) {
    detail::conv2d_params(options);  // throws domain_error for bad options
    const Index groups = options.groups();
    if (in < 1 || out < 1 || kernel.height < 1 || kernel.width < 1 || in % groups != 0 || out % groups != 0)
      throw shape_error("nn::Conv2d: in " + std::to_string(in) + ", out " + std::to_string(out) + ", kernel [" +
                        std::to_string(kernel.height) + "," + std::to_string(kernel.width) + "], groups " +
                        std::to_string(groups) + "; each must be at least 1 and groups must divide in and out");
    const Index fan_in = in / groups * kernel.height * kernel.width;
    const double bound = 1 / std::sqrt(static_cast<double>(fan_in));
    weight = Parameter<T>(uniform(Tensor<T, 4>(out, in / groups, kernel.height, kernel.width), bound, generator));
    if (bias) this->bias = Parameter<T>(uniform(Tensor<T, 1>(out), bound, generator));
    has_bias_ = bias;
  }

  /// conv2d(x, weight, bias) with the layer's options, the Parameters recorded on `tape`. Throws what conv2d
  /// throws.
  Var<T> forward(Tape<T>& tape, const Var<T>& x) {
    return has_bias_ ? conv2d(x, tape.variable(weight), tape.variable(bias), options_)
                     : conv2d(x, tape.variable(weight), options_);
  }

  bool has_bias() const { return has_bias_; }                ///< whether the layer adds a bias
  const Conv2dOptions& options() const { return options_; }  ///< stride, padding, dilation, groups

  Parameter<T> weight;  ///< [out, in/groups, kH, kW]
  Parameter<T> bias;    ///< [out], or empty without bias

 private:
  template <int Rank>
  static Tensor<T, Rank> uniform(Tensor<T, Rank> t, double bound, Generator& generator) {
    for (Index i = 0; i < t.size(); ++i) t.data()[i] = static_cast<T>((2 * generator.uniform() - 1) * bound);
    return t;
  }

  Conv2dOptions options_;
  bool has_bias_ = true;
};

}  // namespace remat::nn
