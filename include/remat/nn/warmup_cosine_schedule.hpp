// nn::WarmupCosineSchedule: a learning rate with linear warm-up then cosine decay, as GPT training uses.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "remat/errors.hpp"

namespace remat::nn {

/// A learning rate that rises linearly for W = warmup_steps steps and then falls along half a cosine to
/// min_lr at T = total_steps (cosine annealing: Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent
/// with Warm Restarts", ICLR 2017, one cycle and no restart; linear warm-up: Goyal et al., "Accurate,
/// Large Minibatch SGD", 2017; the schedule of GPT-3 and of nanoGPT's get_lr). For step t = 0, 1, …,
/// the number of optimizer steps taken before the one that uses the rate:
///   lr(t) = peak · (t+1)/W                                      for t < W,
///   lr(t) = min + ½(peak − min)(1 + cos(π·(t−W)/(T−W)))          for W ≤ t < T,
///   lr(t) = min                                                 for t ≥ T.
/// So lr(0) = peak/W, lr(W−1) = lr(W) = peak (the warm-up ends at peak, where the decay starts),
/// lr(T−1) = min + ½(peak − min)(1 − cos(π/(T−W))) is the last rate above min, and W = 0 starts at peak.
/// Computed in double. Use: optimizer.set_learning_rate(schedule.at(optimizer.step_count())); then
/// optimizer.step(). (nn::Adam refuses a rate of 0: with min_lr = 0, stay below T steps or use nn::AdamW.)
class WarmupCosineSchedule {
 public:
  /// Throws domain_error unless 0 < peak_lr < ∞, 0 ≤ min_lr ≤ peak_lr, warmup_steps ≥ 0 and
  /// total_steps > warmup_steps.
  WarmupCosineSchedule(double peak_lr, std::int64_t warmup_steps, std::int64_t total_steps, double min_lr = 0)
      : peak_(peak_lr), min_(min_lr) {
    if (!(peak_lr > 0 && std::isfinite(peak_lr)) || !(min_lr >= 0 && min_lr <= peak_lr) || warmup_steps < 0 ||
        total_steps <= warmup_steps)
      throw domain_error(
          "nn::WarmupCosineSchedule: need 0 < peak_lr < inf, 0 <= min_lr <= peak_lr, warmup_steps >= 0 and "
          "total_steps > warmup_steps; got peak_lr " +
          number_text(peak_lr) + ", warmup_steps " + std::to_string(warmup_steps) + ", total_steps " +
          std::to_string(total_steps) + ", min_lr " + number_text(min_lr));
    warmup_ = static_cast<std::uint64_t>(warmup_steps);
    total_ = static_cast<std::uint64_t>(total_steps);
  }

  /// lr(step), as the class comment defines it: in (0, peak_lr] during warm-up, then in [min_lr, peak_lr].
  double at(std::uint64_t step) const {
    // peak · ((t+1)/W): a factor ≤ 1, so the product never rounds above peak, and is peak at t = W − 1; at
    // least the smallest positive double, so that a tiny peak over a long warm-up does not round to 0.
    if (step < warmup_)
      return std::max(peak_ * (static_cast<double>(step + 1) / static_cast<double>(warmup_)),
                      std::numeric_limits<double>::denorm_min());
    if (step >= total_) return min_;
    const double progress = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
    // peak − ½(peak − min)(1 − cos): the same rate, exactly peak at t = W; kept in [min, peak] against rounding.
    const double rate = peak_ - 0.5 * (peak_ - min_) * (1 - std::cos(pi * progress));
    return std::min(peak_, std::max(min_, rate));
  }

  double peak_lr() const { return peak_; }                ///< the rate at the end of the warm-up
  double min_lr() const { return min_; }                  ///< the rate the cosine decays to
  std::uint64_t warmup_steps() const { return warmup_; }  ///< steps of the linear warm-up
  std::uint64_t total_steps() const { return total_; }    ///< the step at which the decay ends

 private:
  static constexpr double pi = 3.14159265358979323846;
  double peak_, min_;
  std::uint64_t warmup_ = 0, total_ = 0;
};

}  // namespace remat::nn
