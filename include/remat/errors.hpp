// The exceptions remat throws. Every message names the operation and the shapes or values involved.
#pragma once

#include <stdexcept>
#include <string>

namespace remat {

/// Operand shapes do not fit the operation, e.g. "matmul: A is [3,4] but B is [5,2]; A.cols must equal B.rows".
class shape_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An index argument is out of range, e.g. a class label in cross_entropy.
class index_error : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

/// A scalar argument is outside the operation's domain, e.g. dropout with p = 1.
class domain_error : public std::domain_error {
 public:
  using std::domain_error::domain_error;
};

/// Misuse of a tape: a Var from another tape or from a cleared tape, an empty Var, a region nested too deep.
class tape_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// A value or residual that was already freed is needed: a second backward without retain_graph,
/// or value() of an interior value the tape released.
class freed_value_error : public tape_error {
 public:
  using tape_error::tape_error;
};

/// A Parameter recorded on the tape was modified (Parameter::mutable_value()) before backward used it;
/// the gradient would be computed from the wrong value.
class stale_value_error : public tape_error {
 public:
  using tape_error::tape_error;
};

}  // namespace remat
