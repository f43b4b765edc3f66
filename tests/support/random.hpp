// Seeded random matrices for tests: the same seed gives the same matrix on every platform and compiler
// (the conversion from bits to a double is done here, not by std::uniform_real_distribution, whose
// algorithm the standard leaves to the implementation).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string_view>

#include "remat/matrix.hpp"

namespace remat_test {

/// A closed interval [low, high] to draw input values from, optionally excluding (−min_abs, min_abs)
/// so that values stay away from a kink or a pole at 0 (relu, abs, 1/x). Values closer to 0 than
/// min_abs are moved to ±min_abs + (value), keeping their sign; min_abs must be < max(|low|, |high|).
struct Domain {
  double low = -2;
  double high = 2;
  double min_abs = 0;
  bool negatives_to_zero = false;  ///< a negative draw becomes exactly 0 (torch.where's conditions: half of them 0)
};

/// Any real value in [−2, 2].
inline constexpr Domain anywhere{-2, 2, 0};
/// Positive values in [0.5, 2] (log, sqrt, a fractional pow).
inline constexpr Domain positive{0.5, 2, 0};
/// |value| in [0.25, 2]: away from the kink of relu/abs and from the pole of 1/x.
inline constexpr Domain away_from_zero{-2, 2, 0.25};

/// A 64-bit generator with a portable uniform draw in [0, 1).
class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  /// Uniform in [low, high).
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  /// A draw from `domain` (see Domain).
  double draw(const Domain& domain) {
    double v = uniform(domain.low, domain.high);
    if (domain.min_abs > 0 && std::abs(v) < domain.min_abs) {
      const double sign = v < 0 ? -1.0 : 1.0;
      v = sign * domain.min_abs + v;  // |v| ≥ min_abs, and still inside [low, high] for symmetric domains
      if (v > domain.high || v < domain.low) v = -v;
    }
    if (domain.negatives_to_zero && v < 0) v = 0;
    return v;
  }
  /// Uniform integer in [0, n).
  int integer(int n) { return static_cast<int>(uniform() * n); }
  std::uint64_t bits() { return engine_(); }

 private:
  std::mt19937_64 engine_;
};

/// A rows×cols matrix with entries drawn from `domain`.
template <class T = double>
remat::Matrix<T> random_matrix(remat::Index rows, remat::Index cols, std::uint64_t seed,
                               const Domain& domain = anywhere) {
  Random random(seed);
  remat::Matrix<T> m(rows, cols);
  for (remat::Index i = 0; i < rows; ++i)
    for (remat::Index j = 0; j < cols; ++j) m(i, j) = static_cast<T>(random.draw(domain));
  return m;
}

template <class T = double>
remat::Matrix<T> random_matrix(const remat::Shape& shape, std::uint64_t seed, const Domain& domain = anywhere) {
  return random_matrix<T>(shape.rows(), shape.cols(), seed, domain);
}

/// A stable 64-bit seed from a test name (FNV-1a), so each test case draws its own inputs.
inline std::uint64_t seed_from(std::string_view name, std::uint64_t salt = 0) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ salt;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace remat_test
