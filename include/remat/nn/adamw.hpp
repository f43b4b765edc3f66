// nn::AdamW: Adam with decoupled weight decay, updating remat::Parameters in place.
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "remat/errors.hpp"
#include "remat/nn/adam.hpp"
#include "remat/nn/optimizer.hpp"
#include "remat/parameter.hpp"

namespace remat::nn {

/// AdamW (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019, Algorithm 2): Adam
/// whose weight decay shrinks the parameters directly instead of being added to the gradient (where Adam's
/// normalisation would rescale it). For each parameter θ with gradient g and decay λ, at step t = 1, 2, …:
///   θ ← θ·(1 − α·λ),
///   m ← β₁·m + (1−β₁)·g,   v ← β₂·v + (1−β₂)·g²,
///   θ ← θ − (α/(1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε),
/// in this order and evaluated as torch.optim.AdamW (torch 1.13, amsgrad=False) does; the second and third
/// lines are nn::Adam's update, computed by the same code. The paper decays by η_t·λ·θ with a schedule
/// multiplier η_t of its own; torch and this class decay by α·λ·θ, so the decay follows the learning rate
/// (set_learning_rate) and λ = 0.01 with α = 1e-3 shrinks θ by a factor 1 − 1e-5 per step.
/// Defaults α = 1e-3, β₁ = 0.9, β₂ = 0.999, ε = 1e-8, λ = 0.01 (torch's).
///
/// Parameters that should not decay (GPT training: biases, layer-norm gains and, by choice, embeddings)
/// go in a ParameterGroup of their own with weight_decay 0:
///   nn::AdamW<float> optimizer({{matrices}, {biases_and_gains, 0.0}}, options);
///
/// As nn::Adam otherwise: it shares the parameters' storage, steps from their gradients (step()) or from
/// given ones (step(gradients)), skips parameters without a gradient, and counts steps once for all
/// parameters. Its whole state (t, m, v) is reachable through step_count(), first_moment(k) and
/// second_moment(k): an AdamW made with the same parameters and options and given that state continues
/// bitwise as the original would have.
template <class T>
class AdamW : public detail::AdamBase<T, AdamW<T>> {
 public:
  /// torch.optim.AdamW's hyperparameters, with its defaults.
  struct Options {
    double learning_rate = 1e-3;  ///< α
    double beta1 = 0.9;           ///< β₁, decay of the first moment
    double beta2 = 0.999;         ///< β₂, decay of the second moment
    double epsilon = 1e-8;        ///< ε, added to √v̂
    double weight_decay = 0.01;   ///< λ of the parameters whose group does not set its own
  };

  /// Every parameter decays by options.weight_decay. Zero moments, t = 0. Throws domain_error unless
  /// 0 ≤ α < ∞, 0 ≤ β₁, β₂ < 1, 0 < ε < ∞ and 0 ≤ λ < ∞, also once rounded to T (as nn::Adam's, and the
  /// decay factor 1 − α·λ finite), for a null pointer, and for a parameter given twice.
  explicit AdamW(const std::vector<Parameter<T>*>& parameters, Options options = {})
      : AdamW(std::vector<ParameterGroup<T>>{ParameterGroup<T>{parameters}}, options) {}

  /// As above, for a braced list {&a, &b} (which would otherwise also match the groups' std::vector,
  /// as an iterator range).
  explicit AdamW(std::initializer_list<Parameter<T>*> parameters, Options options = {})
      : AdamW(std::vector<Parameter<T>*>(parameters), options) {}

  /// The parameters of every group, in order (parameter k of value(k), first_moment(k), … counts through
  /// the groups), each decaying by its group's weight_decay, or by options.weight_decay if the group sets
  /// none. Throws as the other constructor, and domain_error for a group's weight_decay outside [0, ∞).
  explicit AdamW(const std::vector<ParameterGroup<T>>& groups, Options options = {}) : options_(options) {
    const auto& o = options;
    if (!(o.learning_rate >= 0 && std::isfinite(o.learning_rate)) || !(o.beta1 >= 0 && o.beta1 < 1) ||
        !(o.beta2 >= 0 && o.beta2 < 1) || !(o.epsilon > 0 && std::isfinite(o.epsilon)) ||
        !(o.weight_decay >= 0 && std::isfinite(o.weight_decay)))
      throw domain_error(
          "nn::AdamW: need 0 <= learning_rate < inf, 0 <= beta1, beta2 < 1, 0 < epsilon < inf and "
          "0 <= weight_decay < inf; got learning_rate " +
          number_text(o.learning_rate) + ", beta1 " + number_text(o.beta1) + ", beta2 " + number_text(o.beta2) +
          ", epsilon " + number_text(o.epsilon) + ", weight_decay " + number_text(o.weight_decay));
    detail::check_adam_settings_in<T>(name, o.learning_rate, o.beta1, o.beta2, o.epsilon);
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const double decay = groups[i].weight_decay.value_or(o.weight_decay);
      if (!(decay >= 0 && std::isfinite(decay)))
        throw domain_error("nn::AdamW: group " + std::to_string(i) + " has weight_decay " + number_text(decay) +
                           "; it must be >= 0 and finite");
      check_decay_factor(o.learning_rate, decay);
      for (Parameter<T>* p : groups[i].parameters) {
        this->add(p);
        weight_decay_.push_back(decay);
      }
    }
    this->reject_duplicates();
  }

  // step(), step(gradients), zero_grad(), size(), step_count(), value(k): detail::Optimizer;
  // first_moment(k), second_moment(k): detail::AdamBase.

  const Options& options() const { return options_; }  ///< the hyperparameters (learning rate as last set)
  /// λ of parameter k. Throws std::out_of_range unless k < size().
  double weight_decay(std::size_t k) const { return weight_decay_.at(k); }
  /// Sets α for the following steps (a learning-rate schedule; the decay θ·(1 − α·λ) follows it too).
  /// Throws domain_error, changing nothing, unless 0 ≤ α < ∞, and α/(1 − β₁) and every 1 − α·λ are finite in T.
  void set_learning_rate(double learning_rate) {
    if (!(learning_rate >= 0 && std::isfinite(learning_rate)))
      throw domain_error("nn::AdamW: learning_rate must be >= 0 and finite, got " + number_text(learning_rate));
    detail::check_adam_step_size_in<T>(name, learning_rate, options_.beta1);
    for (const double decay : weight_decay_) check_decay_factor(learning_rate, decay);
    options_.learning_rate = learning_rate;
  }

 private:
  friend class detail::Optimizer<T, AdamW<T>>;
  static constexpr const char* name = "nn::AdamW";
  /// Throws domain_error unless the decay factor 1 − α·λ, computed in double, is finite in T.
  static void check_decay_factor(double learning_rate, double decay) {
    const double factor = 1 - learning_rate * decay;
    if (!(std::abs(factor) <= detail::largest_finite<T>))
      detail::throw_setting_in_type(name,
                                    "learning_rate " + number_text(learning_rate) + " and weight_decay " +
                                        number_text(decay) +
                                        " make the decay factor 1 - learning_rate * "
                                        "weight_decay = " +
                                        number_text(factor) + " infinite",
                                    detail::type_name<T>());
  }
  void update(std::size_t k, const T* g) {
    this->adam_update(k, g, options_.learning_rate, options_.beta1, options_.beta2, options_.epsilon, weight_decay_[k]);
  }

  Options options_;
  std::vector<double> weight_decay_;
};

}  // namespace remat::nn
