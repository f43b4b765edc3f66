// nn::SGD: stochastic gradient descent with momentum (optionally Nesterov's) and weight decay, updating
// remat::Parameters in place.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/nn/optimizer.hpp"
#include "remat/parameter.hpp"

namespace remat::nn {

/// Stochastic gradient descent with momentum (Polyak's heavy ball; the Nesterov form of Sutskever, Martens,
/// Dahl & Hinton, "On the importance of initialization and momentum in deep learning", ICML 2013), as
/// torch.optim.SGD (torch 1.13) with dampening 0. For each parameter θ with gradient g, learning rate α,
/// momentum μ, weight decay λ and momentum buffer b, at each step, in this order:
///   g ← g + λ·θ                   (L2 weight decay, added to the gradient; skipped when λ = 0)
///   b ← μ·b + g                   (b = g at the parameter's first step)       } skipped when μ = 0:
///   g ← nesterov ? g + μ·b : b                                                 } then g is used as it is
///   θ ← θ − α·g.
/// b starts at zero, so the first step's μ·0 + g is torch's b = g. Defaults α = 1e-3 (torch 1.13 has no
/// default; torch 2 has this one), μ = 0, λ = 0, nesterov off.
///
/// Parameters that should not decay go in a ParameterGroup of their own with weight_decay 0, as for
/// nn::AdamW. As nn::Adam otherwise: it shares the parameters' storage, steps from their gradients (step())
/// or from given ones (step(gradients)), and leaves a parameter without a gradient unchanged (its buffer
/// too). Its whole state (the buffers b; t, which the update does not use) is reachable through
/// momentum_buffer(k) and step_count(): an SGD made with the same parameters and options and given that
/// state continues bitwise as the original would have.
template <class T>
class SGD : public detail::Optimizer<T, SGD<T>> {
 public:
  /// torch.optim.SGD's hyperparameters (its default learning rate is required; 1e-3 here).
  struct Options {
    double learning_rate = 1e-3;  ///< α
    double momentum = 0;          ///< μ (0: plain SGD, no buffers)
    double weight_decay = 0;      ///< λ of the parameters whose group does not set its own
    bool nesterov = false;        ///< Nesterov momentum: step along g + μ·b instead of b (needs μ > 0)
  };

  /// Every parameter decays by options.weight_decay; zero buffers. Throws domain_error unless
  /// 0 ≤ α < ∞, 0 ≤ μ < ∞, 0 ≤ λ < ∞ (also once rounded to T, where the update computes: 1e39 is inf in
  /// float; a non-zero α at least T's smallest normal number) and (nesterov ⇒ μ > 0), for a null pointer, and
  /// for a parameter given twice.
  explicit SGD(const std::vector<Parameter<T>*>& parameters, Options options = {})
      : SGD(std::vector<ParameterGroup<T>>{ParameterGroup<T>{parameters}}, options) {}

  /// As above, for a braced list {&a, &b} (which would otherwise also match the groups' std::vector,
  /// as an iterator range).
  explicit SGD(std::initializer_list<Parameter<T>*> parameters, Options options = {})
      : SGD(std::vector<Parameter<T>*>(parameters), options) {}

  /// The parameters of every group, in order (parameter k of value(k) and momentum_buffer(k) counts
  /// through the groups), each decaying by its group's weight_decay, or by options.weight_decay if the
  /// group sets none. Throws as the other constructor, and domain_error for a group's weight_decay outside
  /// [0, ∞).
  explicit SGD(const std::vector<ParameterGroup<T>>& groups, Options options = {}) : options_(options) {
    const auto& o = options;
    if (!(o.learning_rate >= 0 && std::isfinite(o.learning_rate)) || !(o.momentum >= 0 && std::isfinite(o.momentum)) ||
        !(o.weight_decay >= 0 && std::isfinite(o.weight_decay)) || (o.nesterov && !(o.momentum > 0)))
      throw domain_error(
          "nn::SGD: need 0 <= learning_rate < inf, 0 <= momentum < inf, 0 <= weight_decay < inf and momentum > 0 "
          "for nesterov; got learning_rate " +
          number_text(o.learning_rate) + ", momentum " + number_text(o.momentum) + ", weight_decay " +
          number_text(o.weight_decay) + ", nesterov " + (o.nesterov ? "true" : "false"));
    detail::check_finite_in<T>(name, "learning_rate", o.learning_rate);
    if (o.learning_rate != 0) detail::check_normal_in<T>(name, "learning_rate", o.learning_rate);
    detail::check_finite_in<T>(name, "momentum", o.momentum);
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const double decay = groups[i].weight_decay.value_or(o.weight_decay);
      if (!(decay >= 0 && std::isfinite(decay)))
        throw domain_error("nn::SGD: group " + std::to_string(i) + " has weight_decay " + number_text(decay) +
                           "; it must be >= 0 and finite");
      detail::check_finite_in<T>(name, "weight_decay", decay);
      for (Parameter<T>* p : groups[i].parameters) {
        this->add(p);
        weight_decay_.push_back(decay);
        buffers_.push_back(o.momentum != 0 ? Matrix<T>::Zero(p->rows(), p->cols()) : Matrix<T>());
      }
    }
    this->reject_duplicates();
  }

  // step(), step(gradients), zero_grad(), size(), step_count(), value(k): detail::Optimizer.

  const Options& options() const { return options_; }  ///< the hyperparameters (learning rate as last set)
  /// λ of parameter k. Throws std::out_of_range unless k < size().
  double weight_decay(std::size_t k) const { return weight_decay_.at(k); }
  /// b of parameter k, of its shape (empty, 0×0, when μ = 0: plain SGD keeps no state): part of the
  /// state, for saving and restoring. Throws std::out_of_range unless k < size(). A buffer of another shape
  /// makes step() throw shape_error.
  Matrix<T>& momentum_buffer(std::size_t k) { return buffers_.at(k); }
  /// The same, read only.
  const Matrix<T>& momentum_buffer(std::size_t k) const { return buffers_.at(k); }
  /// Sets α for the following steps (a learning-rate schedule). Throws domain_error, changing nothing,
  /// unless 0 ≤ α < ∞, also in T.
  void set_learning_rate(double learning_rate) {
    if (!(learning_rate >= 0 && std::isfinite(learning_rate)))
      throw domain_error("nn::SGD: learning_rate must be >= 0 and finite, got " + number_text(learning_rate));
    detail::check_finite_in<T>(name, "learning_rate", learning_rate);
    if (learning_rate != 0) detail::check_normal_in<T>(name, "learning_rate", learning_rate);
    options_.learning_rate = learning_rate;
  }
  /// Sets μ for the following steps (a momentum schedule: OneCycleSchedule::momentum_at). The momentum buffers
  /// are kept. Throws domain_error, changing nothing, unless 0 < μ < ∞ for an optimizer made with μ > 0 (μ = 0
  /// keeps no buffers, so it cannot start or stop momentum later).
  void set_momentum(double momentum) {
    if (!(momentum > 0 && std::isfinite(momentum)) || options_.momentum == 0)
      throw domain_error("nn::SGD: set_momentum needs 0 < momentum < inf on an optimizer made with momentum > 0; got " +
                         number_text(momentum) + ", made with " + number_text(options_.momentum));
    options_.momentum = momentum;
  }

 private:
  friend class detail::Optimizer<T, SGD<T>>;
  static constexpr const char* name = "nn::SGD";
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;

  void check_state(std::size_t k) const {
    if (options_.momentum != 0) this->check_state_shape(k, buffers_[k], "momentum buffer");
  }

  /// θ ← θ − α·(the gradient d after momentum), for one block; d is g or g + λ·θ (read before θ is written).
  template <class Direction>
  void update_block(Eigen::Map<Array> theta, Eigen::Map<Array> b, const Direction& d, T alpha, T mu) const {
    if (mu == T(0)) {
      theta -= alpha * d;
      return;
    }
    b = mu * b + d;
    if (options_.nesterov)
      theta -= alpha * (d + mu * b);
    else
      theta -= alpha * b;
  }

  void update(std::size_t k, const T* g) {
    const T alpha = static_cast<T>(options_.learning_rate), mu = static_cast<T>(options_.momentum);
    const T lambda = static_cast<T>(weight_decay_[k]);
    T* theta = this->storage(k).value.data();
    T* b = buffers_[k].data();  // null when μ = 0
    const Index count = this->shape(k).numel();
    // Blocks of 512 elements that stay in L1 across the two or three statements (one pass over memory).
    constexpr Index block = 512;
    for (Index i = 0; i < count; i += block) {
      const Index n = std::min(block, count - i);
      const Eigen::Map<const Array> gi(g + i, n);
      Eigen::Map<Array> thetai(theta + i, n), bi(b ? b + i : nullptr, b ? n : 0);
      if (lambda != T(0))
        update_block(thetai, bi, gi + lambda * thetai, alpha, mu);
      else
        update_block(thetai, bi, gi, alpha, mu);
    }
  }

  Options options_;
  std::vector<double> weight_decay_;
  std::vector<Matrix<T>> buffers_;
};

}  // namespace remat::nn
