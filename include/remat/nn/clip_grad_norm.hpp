// nn::clip_grad_norm: rescales the gradients of a list of Parameters so that their global L2 norm is at most
// a bound, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/parameter.hpp"

namespace remat::nn {

/// The global L2 norm of the parameters' gradients, N = √(Σ_k Σ_i g_ki²) over every parameter that has a
/// gradient (Parameter::has_grad(); the others are skipped, neither counted nor changed), as if the
/// gradients were one vector. If the factor c = max_norm / (N + 1e-6) is below 1, multiplies every one of
/// those gradients by c (rounded to T), which leaves their norm at max_norm·N/(N + 1e-6), up to the rounding
/// of c and of each product to T (in float it can end a few parts in 10⁸ above max_norm, as torch's does).
/// Returns N, the norm
/// before clipping (0 if no parameter has a gradient). As torch.nn.utils.clip_grad_norm_ (torch 1.13,
/// norm_type 2), except that torch computes N in T as the norm of the per-parameter norms: here the
/// squares are summed in double, in one sum (a float gradient's squares are exact in double; the sum
/// overflows to inf only for double gradients beyond about 1e154).
///
/// A non-finite N (a NaN or an infinity in some gradient): with error_if_nonfinite, throws domain_error,
/// changing nothing; without, returns N and leaves the gradients unchanged, so the caller can skip the step
/// (torch 1.13 instead multiplies them by the NaN or zero factor, which makes every gradient NaN or zero).
///
/// Throws domain_error, changing nothing, for a null pointer, for a parameter listed twice (it would count
/// twice in N and be scaled twice; the optimizers refuse it too) or unless max_norm ≥ 0 (max_norm = +inf
/// measures without clipping). Use it between backward and the optimizer's step():
///   tape.backward(loss); nn::clip_grad_norm(parameters, 1.0); optimizer.step();
template <class T>
double clip_grad_norm(const std::vector<Parameter<T>*>& parameters, double max_norm, bool error_if_nonfinite = false) {
  if (!(max_norm >= 0)) throw domain_error("nn::clip_grad_norm: max_norm must be >= 0, got " + number_text(max_norm));
  for (std::size_t k = 0; k < parameters.size(); ++k)
    if (!parameters[k]) throw domain_error("nn::clip_grad_norm: parameter " + std::to_string(k) + " is a null pointer");
  // A parameter listed twice would count twice in the norm and be scaled twice (as the optimizers, refuse it).
  for (std::size_t i = 0; i < parameters.size(); ++i)
    for (std::size_t j = i + 1; j < parameters.size(); ++j)
      if (parameters[i] == parameters[j])
        throw domain_error("nn::clip_grad_norm: parameters " + std::to_string(i) + " and " + std::to_string(j) +
                           " are the same parameter");
  double sum = 0;
  for (Parameter<T>* p : parameters)
    if (p->has_grad()) sum += p->grad().template cast<double>().squaredNorm();
  const double norm = std::sqrt(sum);
  if (!std::isfinite(norm)) {
    if (error_if_nonfinite)
      throw domain_error("nn::clip_grad_norm: the gradients' total L2 norm is " + number_text(norm) +
                         ", so they cannot be clipped (error_if_nonfinite)");
    return norm;
  }
  const double factor = max_norm / (norm + 1e-6);
  if (factor < 1)
    for (Parameter<T>* p : parameters)
      if (p->has_grad()) p->mutable_grad() *= static_cast<T>(factor);
  return norm;
}

}  // namespace remat::nn
