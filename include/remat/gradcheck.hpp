// gradcheck: compares remat's reverse-mode gradient of a loss with central finite differences, in double
// (like torch.autograd.gradcheck). Use it to verify a custom op's backward (remat/op.hpp):
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
#include <utility>
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

/// Input k recorded on `tape`: of shapes[k] if `shapes` is not empty (the matrix holds its values row-major),
/// else the matrix itself.
inline Var<double> gradcheck_leaf(Tape<double>& tape, const Matrix<double>& m, const std::vector<Shape>& shapes,
                                  std::size_t k, bool variable) {
  if (shapes.empty()) return variable ? tape.variable(m) : tape.constant(m);
  return variable ? tape.variable(shapes[k], m.data()) : tape.constant(shapes[k], m.data());
}

inline double gradcheck_loss(const LossFunction& loss, const std::vector<Matrix<double>>& inputs,
                             const std::vector<Shape>& shapes, const GradcheckOptions& options) {
  Tape<double> tape(options.tape_seed);
  std::vector<Var<double>> vars;
  vars.reserve(inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) vars.push_back(gradcheck_leaf(tape, inputs[k], shapes, k, false));
  return loss(tape, vars).item();
}
}  // namespace detail

/// Checks d loss / d input for every element of every input, each input N-D of shapes[k] when `shapes` is not
/// empty (the matrix inputs[k] then holds its shapes[k].numel() values row-major, in any matrix shape). Result
/// positions (row, col) are in the matrices. Throws whatever `loss` throws, shape_error if `shapes` is neither
/// empty nor one shape per input of the input's element count.
inline GradcheckResult gradcheck(const LossFunction& loss, std::vector<Matrix<double>> inputs,
                                 const std::vector<Shape>& shapes, const GradcheckOptions& options = {}) {
  if (!shapes.empty() && shapes.size() != inputs.size())
    throw shape_error("gradcheck: " + std::to_string(shapes.size()) + " shapes for " + std::to_string(inputs.size()) +
                      " inputs; give one per input, or none");
  for (std::size_t k = 0; k < shapes.size(); ++k)
    if (shapes[k].numel() != inputs[k].size())
      throw shape_error("gradcheck: input " + std::to_string(k) + " has " + std::to_string(inputs[k].size()) +
                        " elements but its shape " + to_string(shapes[k]) + " has " +
                        std::to_string(shapes[k].numel()));
  std::vector<Matrix<double>> analytic;
  {
    Tape<double> tape(options.tape_seed);
    std::vector<Var<double>> vars;
    for (std::size_t k = 0; k < inputs.size(); ++k)
      vars.push_back(detail::gradcheck_leaf(tape, inputs[k], shapes, k, true));
    Var<double> l = loss(tape, vars);
    tape.backward(l);
    for (std::size_t k = 0; k < inputs.size(); ++k)
      analytic.emplace_back(
          Eigen::Map<const Matrix<double>>(vars[k].grad().data(), inputs[k].rows(), inputs[k].cols()));
  }
  GradcheckResult result;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    for (Index i = 0; i < inputs[k].rows(); ++i) {
      for (Index j = 0; j < inputs[k].cols(); ++j) {
        const double x = inputs[k](i, j);
        const double h = options.step * std::max(1.0, std::abs(x));
        inputs[k](i, j) = x + h;
        const double plus = detail::gradcheck_loss(loss, inputs, shapes, options);
        inputs[k](i, j) = x - h;
        const double minus = detail::gradcheck_loss(loss, inputs, shapes, options);
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

/// Checks d loss / d input for every element of every input, each input the matrix it is. Throws whatever
/// `loss` throws.
inline GradcheckResult gradcheck(const LossFunction& loss, std::vector<Matrix<double>> inputs,
                                 const GradcheckOptions& options = {}) {
  return gradcheck(loss, std::move(inputs), {}, options);
}

}  // namespace remat
