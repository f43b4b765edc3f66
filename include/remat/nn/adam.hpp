// nn::Adam: the Adam optimizer updating remat::Parameters in place; detail::AdamBase, the moments and the
// update that nn::Adam and nn::AdamW share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/nn/optimizer.hpp"
#include "remat/parameter.hpp"

namespace remat::detail {

/// What nn::Adam and nn::AdamW share: the first and second moments m and v of every parameter (zero at
/// construction, of its shape) with their accessors, and the update of one parameter from its gradient.
template <class T, class Derived>
class AdamBase : public Optimizer<T, Derived> {
 public:
  /// m and v of parameter k (same shape as the parameter): part of the state, for saving and restoring.
  /// Throws std::out_of_range unless k < size(). A moment of another shape makes step() throw shape_error.
  Matrix<T>& first_moment(std::size_t k) { return m_.at(k); }
  const Matrix<T>& first_moment(std::size_t k) const { return m_.at(k); }
  Matrix<T>& second_moment(std::size_t k) { return v_.at(k); }
  const Matrix<T>& second_moment(std::size_t k) const { return v_.at(k); }

 protected:
  /// Appends a parameter with zero moments. Throws domain_error for a null pointer.
  void add(Parameter<T>* p) {
    Optimizer<T, Derived>::add(p);
    m_.push_back(Matrix<T>::Zero(p->rows(), p->cols()));
    v_.push_back(Matrix<T>::Zero(p->rows(), p->cols()));
  }

  /// Parameter k from gradient `g` (row-major, of its size) at step t = step_count(), as torch.optim.AdamW
  /// (and, with weight_decay 0, torch.optim.Adam) evaluates it:
  ///   θ ← θ·(1 − α·λ)   (skipped when the factor is 1: the product would be θ exactly)
  ///   m ← β₁·m + (1−β₁)·g,   v ← β₂·v + (1−β₂)·g²,
  ///   θ ← θ − (α/(1−β₁ᵗ)) · (m / (√v / √(1−β₂ᵗ) + ε)),
  /// the ratio first, as the paper writes it (α · m̂/(√v̂ + ε)): step_size times m before the division overflowed
  /// T for an α near the largest finite T times 1 − β₁ and a gradient above 10.
  /// α/(1−β₁ᵗ), √(1−β₂ᵗ), 1 − α·λ, 1 − β₁ and 1 − β₂ are computed in double and rounded to T, and β₁, β₂ and ε
  /// are rounded to T, as torch does. (1 − β computed in float would be 111 ulps off for β₂ = 0.999: the
  /// float nearest 0.999 is 0.99900001287.)
  void adam_update(std::size_t k, const T* g, double learning_rate, double beta1_, double beta2_, double epsilon_,
                   double weight_decay) {
    const double t = static_cast<double>(this->step_count());
    const T beta1 = static_cast<T>(beta1_), beta2 = static_cast<T>(beta2_);
    const T one_minus_beta1 = static_cast<T>(1 - beta1_), one_minus_beta2 = static_cast<T>(1 - beta2_);
    const T step_size = static_cast<T>(learning_rate / (1 - std::pow(beta1_, t)));
    const T correction2 = static_cast<T>(std::sqrt(1 - std::pow(beta2_, t)));
    const T epsilon = static_cast<T>(epsilon_);
    const T decay = static_cast<T>(1 - learning_rate * weight_decay);
    // Blocks of 512 elements, each updated by three vectorised Eigen statements (four with weight decay)
    // while it stays in L1: in effect one pass over memory (memory-bound: 4 arrays read, 3 written).
    T* m = m_[k].data();
    T* v = v_[k].data();
    T* theta = this->storage(k).value.data();
    const Index count = m_[k].size();
    constexpr Index block = 512;
    for (Index i = 0; i < count; i += block) {
      const Index n = std::min(block, count - i);
      using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
      const Eigen::Map<const Array> gi(g + i, n);
      Eigen::Map<Array> mi(m + i, n), vi(v + i, n), thetai(theta + i, n);
      if (decay != T(1)) thetai *= decay;
      mi = beta1 * mi + one_minus_beta1 * gi;
      vi = beta2 * vi + one_minus_beta2 * gi.square();
      thetai -= step_size * (mi / (vi.sqrt() / correction2 + epsilon));
    }
  }

 private:
  friend class Optimizer<T, Derived>;
  void check_state(std::size_t k) const {
    this->check_state_shape(k, m_[k], "first moment");
    this->check_state_shape(k, v_[k], "second moment");
  }

  std::vector<Matrix<T>> m_, v_;
};

}  // namespace remat::detail

namespace remat::nn {

/// Adam (Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015, Algorithm 1). For each
/// parameter θ with gradient g, at step t = 1, 2, …:
///   m ← β₁·m + (1−β₁)·g,   v ← β₂·v + (1−β₂)·g²,
///   θ ← θ − α · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε),
/// evaluated as torch.optim.Adam arranges it: θ ← θ − (α/(1−β₁ᵗ)) · (m / (√v / √(1−β₂ᵗ) + ε)).
/// Defaults α = 1e-3, β₁ = 0.9, β₂ = 0.999, ε = 1e-8 (the paper's). No weight decay.
///
/// The optimizer shares each parameter's storage (as a tape does), so a Parameter moved or destroyed after
/// construction is still updated safely; it writes the value as Parameter::mutable_value() does, so a tape
/// that recorded a parameter before the update reports a stale value instead of using the new one. Its
/// whole state (step count t, first and second moments m and v) is reachable through step_count(),
/// first_moment() and second_moment(), for saving and restoring: an optimizer made on the same parameters
/// and given that state continues bitwise as the original would have.
///
/// t counts the optimizer's steps, so a parameter that had no gradient at some step gets a bias correction
/// of a later t than torch.optim's, which counts steps per parameter (the same when every parameter has a
/// gradient at every step). Decoupled weight decay: nn::AdamW (include/remat/nn/adamw.hpp).
///
/// Training step, as with torch.optim: zero_grad(); record; tape.backward(loss); step(). Gradients of
/// several backward passes (micro-batches) accumulate in the parameters between zero_grad() and step().
template <class T>
class Adam : public detail::AdamBase<T, Adam<T>> {
 public:
  /// torch.optim.Adam's hyperparameters, with its defaults.
  struct Options {
    double learning_rate = 1e-3;  ///< α
    double beta1 = 0.9;           ///< β₁, decay of the first moment
    double beta2 = 0.999;         ///< β₂, decay of the second moment
    double epsilon = 1e-8;        ///< ε, added to √v̂
  };

  /// Zero moments, t = 0. Throws domain_error unless 0 < α < ∞, 0 ≤ β₁, β₂ < 1 and 0 < ε < ∞ (finite, as
  /// nn::AdamW and nn::SGD require: an infinite α turns a zero gradient's update into NaN; unlike them, α = 0
  /// is refused), also once rounded to T, where the update computes (β₁, β₂ below 1, ε above 0, the first
  /// step's size α/(1 − β₁) finite: detail::check_adam_settings_in), for a null pointer and for a parameter
  /// given twice (it would be updated twice a step).
  explicit Adam(const std::vector<Parameter<T>*>& parameters, Options options = {}) : options_(options) {
    const auto& o = options;
    if (!(o.learning_rate > 0 && std::isfinite(o.learning_rate)) || !(o.beta1 >= 0 && o.beta1 < 1) ||
        !(o.beta2 >= 0 && o.beta2 < 1) || !(o.epsilon > 0 && std::isfinite(o.epsilon)))
      throw domain_error(
          "nn::Adam: need 0 < learning_rate < inf, 0 <= beta1, beta2 < 1 and 0 < epsilon < inf; got learning_rate " +
          number_text(o.learning_rate) + ", beta1 " + number_text(o.beta1) + ", beta2 " + number_text(o.beta2) +
          ", epsilon " + number_text(o.epsilon));
    detail::check_adam_settings_in<T>(name, o.learning_rate, o.beta1, o.beta2, o.epsilon);
    for (Parameter<T>* p : parameters) this->add(p);
    this->reject_duplicates();
  }

  // step(), step(gradients), zero_grad(), size(), step_count(), value(k): detail::Optimizer;
  // first_moment(k), second_moment(k): detail::AdamBase.

  const Options& options() const { return options_; }  ///< the hyperparameters (learning rate as last set)
  /// Sets α for the following steps (a learning-rate schedule). Throws domain_error, changing nothing,
  /// unless 0 < α < ∞ and the first step's size α/(1 − β₁) is finite in T.
  void set_learning_rate(double learning_rate) {
    if (!(learning_rate > 0 && std::isfinite(learning_rate)))
      throw domain_error("nn::Adam: learning_rate must be > 0 and finite, got " + number_text(learning_rate));
    detail::check_adam_step_size_in<T>(name, learning_rate, options_.beta1);
    options_.learning_rate = learning_rate;
  }

 private:
  friend class detail::Optimizer<T, Adam<T>>;
  static constexpr const char* name = "nn::Adam";
  void update(std::size_t k, const T* g) {
    this->adam_update(k, g, options_.learning_rate, options_.beta1, options_.beta2, options_.epsilon, 0);
  }

  Options options_;
};

}  // namespace remat::nn
