// gradcheck: compares remat's reverse-mode gradient of a loss with central finite differences, in double
// (like torch.autograd.gradcheck). Use it to verify a custom op's backward (remat/custom_op.hpp):
//
//   auto result = remat::gradcheck(
//       [](remat::Tape<double>&, const std::vector<remat::Var<double>>& v) { return remat::sum(my_op(v[0])); },
//       {x});
//   if (result.max_error > 1e-6) std::cerr << result.describe() << "\n";
//
// Error metric, per input element: |a − n| / max(1, |a|, |n|), with a the analytic (reverse-mode) and
// n the numeric derivative; the result is the maximum over every element of every input. It is an
// absolute error for derivatives of magnitude ≤ 1 and a relative one above, so that neither tiny nor
// large derivatives dominate. A NaN or infinite derivative counts as an infinite error.
//
// Numeric derivative: n = (L(x + h) − L(x − h)) / (2h) with h = step · max(1, |x|), where L is evaluated
// on a fresh tape (same seed, so dropout draws the same mask) with every input a constant. With step =
// 1e-6 the truncation error is O(h² L''') ≈ 1e-12 and the rounding error ≈ 1e-16 |L| / h ≈ 1e-10 |L|, so
// a correct backward gives errors near 1e-9 on well-scaled inputs; torch.autograd.gradcheck uses the same
// central differences (eps 1e-6, atol 1e-5, rtol 1e-3). Cost: 2 forward passes per input element.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "remat/matrix.hpp"
#include "remat/tape.hpp"
#include "remat/var.hpp"

namespace remat {

/// How gradcheck() differentiates numerically.
struct GradcheckOptions {
  double step = 1e-6;                ///< relative finite-difference step (h = step · max(1, |x|))
  std::uint64_t tape_seed = 0x5eed;  ///< seed of every tape the check creates
};

/// Where the largest disagreement is, and how large.
struct GradcheckResult {
  double max_error = 0;     ///< max over elements of |a − n| / max(1, |a|, |n|)
  int input = -1;           ///< which input holds the worst element
  Index row = -1;           ///< its row
  Index col = -1;           ///< its column
  double analytic = 0;      ///< reverse-mode derivative there
  double numeric = 0;       ///< central-difference derivative there
  std::size_t checked = 0;  ///< number of elements compared

  /// One line for a failure message: the error, where, and both derivatives (17 significant digits).
  std::string describe() const {
    std::ostringstream s;
    s.precision(17);
    s << "max relative error " << max_error << " over " << checked << " elements, at input " << input << " (" << row
      << "," << col << "): analytic " << analytic << ", numeric " << numeric;
    return s.str();
  }
};

/// The loss to check: given the tape and one Var per input (all on that fresh tape; variables for the
/// reverse-mode pass, constants for the finite differences), returns a [1,1] Var. It may record
/// constants of its own on the tape.
using LossFunction = std::function<Var<double>(Tape<double>&, const std::vector<Var<double>>&)>;

namespace detail {

inline double gradcheck_loss(const LossFunction& loss, const std::vector<Matrix<double>>& inputs,
                             std::uint64_t tape_seed) {
  Tape<double> tape(tape_seed);
  std::vector<Var<double>> vars;
  vars.reserve(inputs.size());
  for (const auto& m : inputs) vars.push_back(tape.constant(m));
  return loss(tape, vars).item();
}
}  // namespace detail

/// Checks d loss / d input for every element of every input. Throws whatever `loss` throws.
inline GradcheckResult gradcheck(const LossFunction& loss, std::vector<Matrix<double>> inputs,
                                 const GradcheckOptions& options = {}) {
  std::vector<Matrix<double>> analytic;
  {
    Tape<double> tape(options.tape_seed);
    std::vector<Var<double>> vars;
    for (const auto& m : inputs) vars.push_back(tape.variable(m));
    Var<double> l = loss(tape, vars);
    tape.backward(l);
    for (const auto& v : vars) analytic.emplace_back(v.grad());
  }
  GradcheckResult result;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    for (Index i = 0; i < inputs[k].rows(); ++i) {
      for (Index j = 0; j < inputs[k].cols(); ++j) {
        const double x = inputs[k](i, j);
        const double h = options.step * std::max(1.0, std::abs(x));
        inputs[k](i, j) = x + h;
        const double plus = detail::gradcheck_loss(loss, inputs, options.tape_seed);
        inputs[k](i, j) = x - h;
        const double minus = detail::gradcheck_loss(loss, inputs, options.tape_seed);
        inputs[k](i, j) = x;
        const double n = (plus - minus) / (2 * h);
        const double a = analytic[k](i, j);
        double error = std::abs(a - n) / std::max({1.0, std::abs(a), std::abs(n)});
        if (!std::isfinite(error)) error = std::numeric_limits<double>::infinity();
        ++result.checked;
        if (result.input < 0 || error > result.max_error) {
          result.max_error = error;
          result.input = static_cast<int>(k);
          result.row = i;
          result.col = j;
          result.analytic = a;
          result.numeric = n;
        }
      }
    }
  }
  return result;
}

}  // namespace remat
