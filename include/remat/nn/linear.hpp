// nn::Linear: a fully connected layer y = x·W + b whose weights are remat::Parameters.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "remat/errors.hpp"
#include "remat/parameter.hpp"

namespace remat::nn {

/// A small, portable, counter-based random generator (SplitMix64, Steele, Lea & Flood 2014): its whole
/// state is one 64-bit word, so it can be saved and restored exactly (training checkpoints), and its
/// output is the same on every platform (unlike std::normal_distribution).
class Generator {
 public:
  /// A generator whose state is `seed`.
  explicit Generator(std::uint64_t seed = 0) : state_(seed) {}
  /// The next 64 random bits.
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Uniform integer in [0, n) without modulo bias (rejection sampling). Throws domain_error for n = 0 (an
  /// empty range has no member).
  std::uint64_t below(std::uint64_t n) {
    if (n == 0) throw domain_error("nn::Generator::below: n is 0; the range [0, n) must not be empty");
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t r;
    do r = next();
    while (r >= limit);
    return r % n;
  }
  std::uint64_t state() const { return state_; }           ///< the whole state, to save
  void set_state(std::uint64_t state) { state_ = state; }  ///< restores a saved state()

 private:
  std::uint64_t state_;
};

/// How Linear initialises W (b starts at zero). Both draw from a uniform distribution whose variance
/// keeps activations (and gradients) at a constant scale through the layers:
/// - he_uniform: U(−√(6/fan_in), √(6/fan_in)), variance 2/fan_in, for ReLU (He, Zhang, Ren & Sun,
///   "Delving Deep into Rectifiers", ICCV 2015; torch.nn.init.kaiming_uniform_ with a = 0).
/// - glorot_uniform: U(−√(6/(fan_in+fan_out)), +…), variance 2/(fan_in+fan_out), for tanh and other
///   activations symmetric around 0 (Glorot & Bengio, AISTATS 2010; torch.nn.init.xavier_uniform_).
enum class Init { he_uniform, glorot_uniform };

/// The parameters of a fully connected layer x [m, in] → x·W + b [m, out] (remat::linear), with W [in, out]
/// and b [1, out] held as remat::Parameters: record them with tape.variable(layer.weight) so the tape
/// references them without copying, and let an optimizer update them in place through mutable_value().
template <class T>
class Linear {
 public:
  /// W drawn as `init` says from `generator` (row-major order), b = 0. Throws shape_error unless
  /// inputs ≥ 1 and outputs ≥ 1.
  Linear(Index inputs, Index outputs, Generator& generator, Init init = Init::he_uniform) {
    if (inputs < 1 || outputs < 1)
      throw shape_error("nn::Linear: needs at least one input and one output, got " + std::to_string(inputs) + " → " +
                        std::to_string(outputs));
    const double bound = init == Init::he_uniform
                             ? std::sqrt(6.0 / static_cast<double>(inputs))
                             : std::sqrt(6.0 / (static_cast<double>(inputs) + static_cast<double>(outputs)));
    Matrix<T> w(inputs, outputs);
    for (Index i = 0; i < w.size(); ++i) w.data()[i] = static_cast<T>((2 * generator.uniform() - 1) * bound);
    weight = Parameter<T>(std::move(w));
    bias = Parameter<T>(Matrix<T>::Zero(1, outputs));
  }

  Index inputs() const { return weight.rows(); }   ///< in, the input features
  Index outputs() const { return weight.cols(); }  ///< out, the output features

  Parameter<T> weight;  ///< W [in, out]
  Parameter<T> bias;    ///< b [1, out]
};

}  // namespace remat::nn
