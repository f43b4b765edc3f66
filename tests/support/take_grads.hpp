// take_grads(parameters): each Parameter's gradient after a step, then zero_grad(), so that the next step (a
// checkpointed or budgeted run of the same model) starts from zero and its gradients can be compared bitwise.
#pragma once

#include <vector>

#include "remat/matrix.hpp"
#include "remat/parameter.hpp"

namespace remat_test {

/// The gradients of `parameters`, in order; each Parameter's gradient is cleared.
template <class T>
std::vector<remat::Matrix<T>> take_grads(std::vector<remat::Parameter<T>>& parameters) {
  std::vector<remat::Matrix<T>> grads;
  for (remat::Parameter<T>& p : parameters) {
    grads.push_back(p.grad());
    p.zero_grad();
  }
  return grads;
}

}  // namespace remat_test
