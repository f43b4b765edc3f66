// What the optimizers of remat::nn share: nn::ParameterGroup, and detail::Optimizer (the parameter list, the
// step count and the two ways of taking a step of nn::Adam, nn::AdamW and nn::SGD).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/parameter.hpp"

namespace remat::nn {

/// Parameters that share an optimizer's settings, like a parameter group of torch.optim: a group's
/// weight_decay, when set, replaces Options::weight_decay for its parameters. GPT training decays the
/// weight matrices but not the biases, the layer-norm gains and (a matter of choice) the embeddings:
///   nn::AdamW<float> optimizer({{matrices}, {biases_and_gains, 0.0}}, options);
template <class T>
struct ParameterGroup {
  std::vector<Parameter<T>*> parameters;              ///< the group's Parameters (they must outlive the optimizer)
  std::optional<double> weight_decay = std::nullopt;  ///< λ for these parameters; unset: Options::weight_decay
};

}  // namespace remat::nn

namespace remat::detail {

/// An optimizer of T parameters computes its update in T: a setting valid as a double must stay valid once
/// rounded to T (in float, 1e39 is inf, 0.99999999 is 1 and 1e-46 is 0). The largest finite T as a double.
template <class T>
inline constexpr double largest_finite = static_cast<double>(std::numeric_limits<T>::max());

/// Throws domain_error "<who>: <problem> in float, the parameters' type" (double, or "T" for another type).
[[noreturn]] inline void throw_setting_in_type(const char* who, const std::string& problem, const char* type) {
  throw domain_error(std::string(who) + ": " + problem + " in " + type + ", the parameters' type");
}
template <class T>
constexpr const char* type_name() {
  return std::is_same_v<T, float> ? "float" : std::is_same_v<T, double> ? "double" : "T";
}

/// Throws domain_error unless `value` (a setting already checked finite and ≥ 0 as a double) is finite in T.
template <class T>
void check_finite_in(const char* who, const char* setting, double value) {
  if (!(value <= largest_finite<T>))
    throw_setting_in_type(who, std::string(setting) + " " + number_text(value) + " is infinite", type_name<T>());
}

/// Throws domain_error unless `value` (a setting checked > 0 as a double) is at least T's smallest normal
/// number: a smaller one rounds to 0 in T or is a subnormal, which remat::set_flush_denormal (the examples'
/// default) reads as 0 (an ε of 1e-40 then makes 0/0 for a zero gradient; a learning rate of 1e-50 never
/// moves a float parameter).
template <class T>
void check_normal_in(const char* who, const char* setting, double value) {
  if (!(value >= static_cast<double>(std::numeric_limits<T>::min())))
    throw_setting_in_type(who,
                          std::string(setting) + " " + number_text(value) + " is below the smallest normal number (" +
                              number_text(static_cast<double>(std::numeric_limits<T>::min())) +
                              "): 0 or a subnormal, which flushing makes 0,",
                          type_name<T>());
}

/// Adam's and AdamW's first step moves by α/(1 − β₁) times a ratio of at most about 1 (bias-corrected m over
/// √v): throws domain_error unless that size is finite in T (α = 1e38 with β₁ = 0.9 is not, in float), and
/// unless a non-zero α is a normal number of T (check_normal_in).
template <class T>
void check_adam_step_size_in(const char* who, double learning_rate, double beta1) {
  if (learning_rate != 0) check_normal_in<T>(who, "learning_rate", learning_rate);
  const double size = learning_rate / (1 - beta1);
  if (!(size <= largest_finite<T>))
    throw_setting_in_type(who,
                          "learning_rate " + number_text(learning_rate) + " makes the first step's size " +
                              "learning_rate / (1 - beta1) = " + number_text(size) + " infinite",
                          type_name<T>());
}

/// Throws domain_error unless Adam's settings, valid as doubles (0 ≤ β < 1, 0 < ε < ∞), stay valid rounded to
/// T, where the update computes: β₁ and β₂ below 1 (0.99999999 is 1 in float: m or v would never move), ε
/// finite and above 0 (1e-46 is 0 in float: 0/0 for a gradient of 0), and the first step's size finite.
template <class T>
void check_adam_settings_in(const char* who, double learning_rate, double beta1, double beta2, double epsilon) {
  for (const auto& [setting, beta] : {std::pair{"beta1", beta1}, std::pair{"beta2", beta2}})
    if (!(static_cast<T>(beta) < T(1)))
      throw_setting_in_type(who, std::string(setting) + " " + number_text(beta) + " rounds to 1", type_name<T>());
  check_finite_in<T>(who, "epsilon", epsilon);
  check_normal_in<T>(who, "epsilon", epsilon);
  check_adam_step_size_in<T>(who, learning_rate, beta1);
}

/// The part of an optimizer that does not depend on its update rule: the parameters (whose storage it
/// shares, as a tape does, so a Parameter moved or destroyed after construction is still updated safely),
/// their shapes at construction, the step count t, step(), step(gradients) and zero_grad(). Each update
/// writes a parameter's value as Parameter::mutable_value() does (its version moves on), so a tape that
/// recorded the parameter before the update reports a stale value instead of using the new one.
///
/// Derived (CRTP, nn::Adam, nn::AdamW, nn::SGD) supplies, accessible to this class:
///   static constexpr const char* name;       // "nn::Adam", in messages
///   void check_state(std::size_t k) const;   // throws shape_error unless its state of parameter k has shape(k)
///   void update(std::size_t k, const T* g);  // updates parameter k and its state from gradient g (row-major)
template <class T, class Derived>
class Optimizer {
 public:
  /// One update from the parameters' own gradients (Parameter::grad(), filled by backward). A parameter
  /// without a gradient since its last zero_grad() is left unchanged (its state too), as in torch.optim;
  /// the step still counts in step_count(). Throws shape_error, before changing anything, if a parameter's
  /// shape changed since construction, a state matrix (set through the accessors) has another shape, or a
  /// parameter's gradient was written before its value was resized (Parameter::zero_grad() clears it), and
  /// tape_error inside a gradient-ready callback if a parameter it would update is one whose gradient is not
  /// ready yet (the backward still reads its value; a callback may step an optimizer over its own Parameter).
  void step() {
    check(false);
    for (const auto& p : parameters_)  // a gradient of the value before a resize: as many elements as that one
      if (p->grad_defined && p->grad_size != p->value.size())
        p->check_grad_size((std::string(Derived::name) + "::step").c_str());
    ++t_;
    for (std::size_t k = 0; k < parameters_.size(); ++k) {
      ParameterStorage<T>& p = *parameters_[k];
      if (!p.grad_defined) continue;
      ++p.version;  // as mutable_value(): tapes that recorded the old value become stale
      derived().update(k, p.grad);
    }
  }

  /// One update of every parameter: gradients[k] is d loss / d parameter k, of its shape, stored
  /// contiguously row-major (a remat::Matrix or MatrixView, e.g. Var::grad() after Tape::backward).
  /// Throws shape_error, before changing anything, if the count or a shape differs (or as step()).
  template <class Gradient>
  void step(const std::vector<Gradient>& gradients) {
    static_assert(Gradient::IsRowMajor || Gradient::ColsAtCompileTime == 1,
                  "remat::nn optimizers: step(gradients): gradients must be row-major like the parameters");
    if (gradients.size() != parameters_.size())
      throw shape_error(std::string(Derived::name) + "::step: " + std::to_string(gradients.size()) + " gradients for " +
                        std::to_string(parameters_.size()) + " parameters");
    for (std::size_t k = 0; k < gradients.size(); ++k)
      if (gradients[k].rows() != parameters_[k]->value.rows() || gradients[k].cols() != parameters_[k]->value.cols())
        throw shape_error(std::string(Derived::name) + "::step: gradient " + std::to_string(k) + " is " +
                          to_string(Shape{gradients[k].rows(), gradients[k].cols()}) + " but its parameter is " +
                          to_string(Shape{parameters_[k]->value.rows(), parameters_[k]->value.cols()}));
    check(true);
    ++t_;
    for (std::size_t k = 0; k < gradients.size(); ++k) {
      ++parameters_[k]->version;
      derived().update(k, gradients[k].data());
    }
  }

  /// Clears every parameter's gradient (Parameter::zero_grad()).
  void zero_grad() {
    for (auto& p : parameters_) p->grad_defined = false;
  }

  /// The number of parameters.
  std::size_t size() const { return parameters_.size(); }
  /// t: the number of steps taken (part of the state: saved and restored with the rest).
  std::uint64_t& step_count() { return t_; }
  std::uint64_t step_count() const { return t_; }
  /// The current value of parameter k. Throws std::out_of_range unless k < size().
  const Matrix<T>& value(std::size_t k) const { return parameters_.at(k)->value; }

 protected:
  Optimizer() = default;

  /// Appends a parameter. Throws domain_error for a null pointer.
  void add(Parameter<T>* p) {
    if (!p) throw domain_error(std::string(Derived::name) + ": a null parameter pointer");
    parameters_.push_back(ParameterAccess::storage(*p));
    shapes_.push_back(Shape{p->rows(), p->cols()});
  }
  /// Throws domain_error if a parameter was given twice (it would be updated twice per step).
  void reject_duplicates() const {
    for (std::size_t i = 0; i < parameters_.size(); ++i)
      for (std::size_t j = i + 1; j < parameters_.size(); ++j)
        if (parameters_[i] == parameters_[j])
          throw domain_error(std::string(Derived::name) + ": parameters " + std::to_string(i) + " and " +
                             std::to_string(j) + " are the same parameter");
  }

  /// The shape of parameter k when the optimizer was made: the shape of its state.
  Shape shape(std::size_t k) const { return shapes_[k]; }
  ParameterStorage<T>& storage(std::size_t k) { return *parameters_[k]; }

  /// Throws shape_error "<name>::step: the <state_name> of parameter k is [..] but the parameter is [..]"
  /// unless `state` has shape(k).
  void check_state_shape(std::size_t k, const Matrix<T>& state, const char* state_name) const {
    if (state.rows() != shapes_[k].rows() || state.cols() != shapes_[k].cols())
      throw shape_error(std::string(Derived::name) + "::step: the " + state_name + " of parameter " +
                        std::to_string(k) + " is " + to_string(Shape{state.rows(), state.cols()}) +
                        " but the parameter is " + to_string(shapes_[k]));
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
  const Derived& derived() const { return static_cast<const Derived&>(*this); }

  /// Throws shape_error for a parameter or state of another shape than at construction, tape_error for a
  /// parameter the step would update (every one if `all`, else those with a gradient) whose value a backward
  /// still reads (a step inside a gradient-ready callback: ParameterStorage::check_not_read).
  void check(bool all) const {
    for (std::size_t k = 0; k < parameters_.size(); ++k) {
      const ParameterStorage<T>& p = *parameters_[k];
      if ((all || p.grad_defined) && p.being_read())
        p.check_not_read((std::string(Derived::name) + "::step: parameter " + std::to_string(k)).c_str());
      const Matrix<T>& value = parameters_[k]->value;
      if (value.rows() != shapes_[k].rows() || value.cols() != shapes_[k].cols())
        throw shape_error(std::string(Derived::name) + "::step: parameter " + std::to_string(k) + " is " +
                          to_string(Shape{value.rows(), value.cols()}) + " but was " + to_string(shapes_[k]) +
                          " when the optimizer was made");
      derived().check_state(k);
    }
  }

  std::vector<std::shared_ptr<ParameterStorage<T>>> parameters_;
  std::vector<Shape> shapes_;
  std::uint64_t t_ = 0;
};

}  // namespace remat::detail
