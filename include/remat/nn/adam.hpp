// nn::Adam: the Adam optimizer updating remat::Parameters in place.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/parameter.hpp"

namespace remat::nn {

/// Adam (Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015, Algorithm 1). For each
/// parameter θ with gradient g, at step t = 1, 2, …:
///   m ← β₁·m + (1−β₁)·g,   v ← β₂·v + (1−β₂)·g²,
///   θ ← θ − α · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε),
/// evaluated as torch.optim.Adam does: θ ← θ − (α/(1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε).
/// Defaults α = 1e-3, β₁ = 0.9, β₂ = 0.999, ε = 1e-8 (the paper's). No weight decay.
///
/// The optimizer shares each parameter's storage (as a tape does), so a Parameter moved or destroyed after
/// construction is still updated safely; it writes the value as Parameter::mutable_value() does, so a tape
/// that recorded a parameter before the update reports a stale value instead of using the new one. Its
/// whole state (step count t, first and second moments m and v) is reachable through step_count(),
/// first_moment() and second_moment(), for saving and restoring.
///
/// Training step, as with torch.optim: zero_grad(); record; tape.backward(loss); step(). Gradients of
/// several backward passes (micro-batches) accumulate in the parameters between zero_grad() and step().
template <class T>
class Adam {
 public:
  struct Options {
    double learning_rate = 1e-3;  ///< α
    double beta1 = 0.9;           ///< β₁, decay of the first moment
    double beta2 = 0.999;         ///< β₂, decay of the second moment
    double epsilon = 1e-8;        ///< ε, added to √v̂
  };

  /// Zero moments, t = 0. Throws domain_error unless α > 0, 0 ≤ β₁, β₂ < 1 and ε > 0, and for a null
  /// pointer.
  explicit Adam(const std::vector<Parameter<T>*>& parameters, Options options = {}) : options_(options) {
    if (!(options.learning_rate > 0) || !(options.beta1 >= 0 && options.beta1 < 1) ||
        !(options.beta2 >= 0 && options.beta2 < 1) || !(options.epsilon > 0))
      throw domain_error("nn::Adam: need learning_rate > 0, 0 <= beta1, beta2 < 1 and epsilon > 0; got " +
                         std::to_string(options.learning_rate) + ", " + std::to_string(options.beta1) + ", " +
                         std::to_string(options.beta2) + ", " + std::to_string(options.epsilon));
    for (Parameter<T>* p : parameters) {
      if (!p) throw domain_error("nn::Adam: a null parameter pointer");
      parameters_.push_back(detail::ParameterAccess::storage(*p));
      m_.push_back(Matrix<T>::Zero(p->rows(), p->cols()));
      v_.push_back(Matrix<T>::Zero(p->rows(), p->cols()));
    }
  }

  /// One update from the parameters' own gradients (Parameter::grad(), filled by backward). A parameter
  /// without a gradient since its last zero_grad() is left unchanged (its moments too), as in torch.optim.
  /// Throws shape_error, before changing anything, if a parameter's shape changed since construction.
  void step() {
    check_shapes();
    ++t_;
    for (std::size_t k = 0; k < parameters_.size(); ++k) {
      detail::ParameterStorage<T>& p = *parameters_[k];
      if (p.grad_defined) update(k, p.grad);
    }
  }

  /// Clears every parameter's gradient (Parameter::zero_grad()).
  void zero_grad() {
    for (auto& p : parameters_) p->grad_defined = false;
  }

  /// One update: gradients[k] is d loss / d parameter k, of its shape, stored contiguously row-major
  /// (a remat::Matrix or MatrixView, e.g. Var::grad() after Tape::backward). Throws shape_error, before
  /// changing anything, if the count or a shape differs.
  template <class Gradient>
  void step(const std::vector<Gradient>& gradients) {
    static_assert(Gradient::IsRowMajor || Gradient::ColsAtCompileTime == 1,
                  "nn::Adam::step: gradients must be row-major like the parameters");
    if (gradients.size() != parameters_.size())
      throw shape_error("nn::Adam::step: " + std::to_string(gradients.size()) + " gradients for " +
                        std::to_string(parameters_.size()) + " parameters");
    for (std::size_t k = 0; k < gradients.size(); ++k)
      if (gradients[k].rows() != parameters_[k]->value.rows() || gradients[k].cols() != parameters_[k]->value.cols())
        throw shape_error("nn::Adam::step: gradient " + std::to_string(k) + " is " +
                          to_string(Shape{gradients[k].rows(), gradients[k].cols()}) + " but its parameter is " +
                          to_string(Shape{parameters_[k]->value.rows(), parameters_[k]->value.cols()}));
    check_shapes();
    ++t_;
    for (std::size_t k = 0; k < gradients.size(); ++k) update(k, gradients[k].data());
  }

  const Options& options() const { return options_; }
  /// Sets α for the following steps (a learning-rate schedule). Throws domain_error unless α > 0.
  void set_learning_rate(double learning_rate) {
    if (!(learning_rate > 0))
      throw domain_error("nn::Adam: learning_rate must be > 0, got " + std::to_string(learning_rate));
    options_.learning_rate = learning_rate;
  }
  std::size_t size() const { return parameters_.size(); }
  /// t: the number of steps taken.
  std::uint64_t& step_count() { return t_; }
  /// m and v of parameter k (same shape as the parameter).
  Matrix<T>& first_moment(std::size_t k) { return m_.at(k); }
  Matrix<T>& second_moment(std::size_t k) { return v_.at(k); }
  /// The current value of parameter k.
  const Matrix<T>& value(std::size_t k) const { return parameters_.at(k)->value; }

 private:
  void check_shapes() const {
    for (std::size_t k = 0; k < parameters_.size(); ++k)
      if (parameters_[k]->value.rows() != m_[k].rows() || parameters_[k]->value.cols() != m_[k].cols())
        throw shape_error("nn::Adam::step: parameter " + std::to_string(k) + " is " +
                          to_string(Shape{parameters_[k]->value.rows(), parameters_[k]->value.cols()}) + " but was " +
                          to_string(Shape{m_[k].rows(), m_[k].cols()}) + " when the optimizer was made");
  }

  /// θ_k ← θ_k − α̂ · m / (√v / √(1−β₂ᵗ) + ε) with the moments updated from gradient `g` (row-major,
  /// θ_k's size).
  void update(std::size_t k, const T* g) {
    const double t = static_cast<double>(t_);
    const T beta1 = static_cast<T>(options_.beta1), beta2 = static_cast<T>(options_.beta2);
    const T step_size = static_cast<T>(options_.learning_rate / (1 - std::pow(options_.beta1, t)));
    const T correction2 = static_cast<T>(std::sqrt(1 - std::pow(options_.beta2, t)));
    const T epsilon = static_cast<T>(options_.epsilon);
    detail::ParameterStorage<T>& p = *parameters_[k];
    ++p.version;  // as mutable_value(): tapes that recorded the old value become stale
    // Blocks of 512 elements, each updated by three vectorised Eigen statements while it stays in L1:
    // in effect one pass over memory (the update is memory-bound: 4 arrays read, 3 written).
    T* m = m_[k].data();
    T* v = v_[k].data();
    T* theta = p.value.data();
    const Index count = m_[k].size();
    constexpr Index block = 512;
    for (Index i = 0; i < count; i += block) {
      const Index n = std::min(block, count - i);
      using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
      const Eigen::Map<const Array> gi(g + i, n);
      Eigen::Map<Array> mi(m + i, n), vi(v + i, n), thetai(theta + i, n);
      mi = beta1 * mi + (1 - beta1) * gi;
      vi = beta2 * vi + (1 - beta2) * gi.square();
      thetai -= step_size * mi / (vi.sqrt() / correction2 + epsilon);
    }
  }

  std::vector<std::shared_ptr<detail::ParameterStorage<T>>> parameters_;
  Options options_;
  std::vector<Matrix<T>> m_, v_;
  std::uint64_t t_ = 0;
};

}  // namespace remat::nn
