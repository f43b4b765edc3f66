// nn::OneCycleSchedule: the 1cycle learning-rate and momentum policy, as torch.optim.lr_scheduler.OneCycleLR.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "remat/errors.hpp"

namespace remat::nn {

/// The 1cycle policy (Smith & Topin, "Super-Convergence: Very Fast Training of Neural Networks Using Large
/// Learning Rates", 2018) exactly as PyTorch 1.13's OneCycleLR with its defaults (anneal_strategy "cos",
/// three_phase false, cycle_momentum true): over T = total_steps optimizer steps, the learning rate rises from
/// max_lr/div_factor to max_lr along half a cosine for the first pct_start·T − 1 steps, then falls to
/// max_lr/(div_factor·final_div_factor) at step T − 1; the momentum moves the other way, from max_momentum down to
/// base_momentum and back. With E = pct_start·T − 1 (a double, as PyTorch computes it) and
/// cos_anneal(a, b, p) = b + (a − b)/2·(1 + cos(π·p)), step t = 0, 1, …, T − 1 (the optimizer steps taken
/// before the one that uses the values) gets
///   lr(t) = cos_anneal(initial, max_lr, t/E)                     for t ≤ E,
///   lr(t) = cos_anneal(max_lr, minimum, (t − E)/(T − 1 − E))     after,
/// and momentum likewise between max_momentum and base_momentum. Use, each step:
/// optimizer.set_learning_rate(s.learning_rate_at(t)); optimizer.set_momentum(s.momentum_at(t)); optimizer.step().
class OneCycleSchedule {
 public:
  /// Throws domain_error unless 0 < max_lr < ∞, total_steps ≥ 2, 0 < pct_start < 1 with pct_start·T − 1 > 0 and
  /// below T − 1, div_factor and final_div_factor > 0, and 0 < base_momentum ≤ max_momentum < ∞.
  OneCycleSchedule(double max_lr, std::int64_t total_steps, double pct_start = 0.3, double div_factor = 25,
                   double final_div_factor = 1e4, double base_momentum = 0.85, double max_momentum = 0.95)
      : max_lr_(max_lr),
        initial_lr_(max_lr / div_factor),
        min_lr_(max_lr / div_factor / final_div_factor),
        base_momentum_(base_momentum),
        max_momentum_(max_momentum),
        total_(total_steps),
        peak_(pct_start * static_cast<double>(total_steps) - 1) {
    if (!(max_lr > 0 && std::isfinite(max_lr)) || total_steps < 2 || !(pct_start > 0 && pct_start < 1) ||
        !(peak_ > 0 && peak_ < static_cast<double>(total_steps - 1)) ||
        !(div_factor > 0 && std::isfinite(div_factor)) || !(final_div_factor > 0 && std::isfinite(final_div_factor)) ||
        !(base_momentum > 0 && base_momentum <= max_momentum && std::isfinite(max_momentum)))
      throw domain_error(
          "nn::OneCycleSchedule: need 0 < max_lr < inf, total_steps >= 2, 0 < pct_start < 1 with "
          "0 < pct_start * total_steps - 1 < total_steps - 1, div factors > 0 and 0 < base_momentum <= "
          "max_momentum; got max_lr " +
          number_text(max_lr) + ", total_steps " + std::to_string(total_steps) + ", pct_start " +
          number_text(pct_start) + ", div_factor " + number_text(div_factor) + ", final_div_factor " +
          number_text(final_div_factor) + ", momentum " + number_text(base_momentum) + " to " +
          number_text(max_momentum));
  }

  /// The learning rate of step t (t ≥ T − 1: the final one). Throws domain_error for t < 0.
  double learning_rate_at(std::int64_t t) const {
    const double p = phase(t);
    return t_in_warmup(t) ? anneal(initial_lr_, max_lr_, p) : anneal(max_lr_, min_lr_, p);
  }
  /// The momentum of step t: max_momentum → base_momentum while the rate rises, back while it falls.
  double momentum_at(std::int64_t t) const {
    const double p = phase(t);
    return t_in_warmup(t) ? anneal(max_momentum_, base_momentum_, p) : anneal(base_momentum_, max_momentum_, p);
  }
  std::int64_t total_steps() const { return total_; }  ///< T

 private:
  static double anneal(double start, double end, double p) {
    return end + (start - end) / 2 * (std::cos(3.14159265358979323846 * p) + 1);
  }
  bool t_in_warmup(std::int64_t t) const { return static_cast<double>(t) <= peak_; }
  /// The fraction of the current phase done at step t.
  double phase(std::int64_t t) const {
    if (t < 0) throw domain_error("nn::OneCycleSchedule: step " + std::to_string(t) + " is negative");
    const double s = static_cast<double>(std::min(t, total_ - 1));
    return t_in_warmup(t) ? s / peak_ : (s - peak_) / (static_cast<double>(total_ - 1) - peak_);
  }

  double max_lr_, initial_lr_, min_lr_, base_momentum_, max_momentum_;
  std::int64_t total_;
  double peak_;
};

}  // namespace remat::nn
