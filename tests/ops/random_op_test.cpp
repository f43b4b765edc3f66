// A user's random op written with the public op recipe only (remat/op.hpp): multiplicative Gaussian noise
// y = x ⊙ (1 + σ·z), z ~ N(0,1) by Box–Muller from two uniform draws per element. Its draws come from the op's
// RandomStream (ForwardContext::random()), checked here against an independent SplitMix64 (the published
// constants of Steele, Lea & Flood 2014, written out again below, not remat's); the tape's offset advances by
// the op's random_draws exactly when the op is recorded; a checkpoint's replay redraws the same noise, so every
// policy's gradients equal the plain tape's bitwise; a training_only op is the identity in evaluation. Dropout is
// written the same way, so its mask is checked against the same oracle.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace user_random_ops {  // not remat's namespace: nothing here may use remat::detail

/// y = x ⊙ (1 + σ·z_k), z_k = sqrt(−2 ln(1 − u_{2k})) · cos(2π u_{2k+1}) (Box–Muller; 1 − u avoids log 0).
struct GaussianNoiseOp : remat::OpBase {
  static constexpr const char* name = "gaussian_noise";
  static constexpr remat::OpKind kind = remat::OpKind::random;
  struct Params {
    double sigma = 0;
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }  // the noise is drawn again
  static remat::Shape output_shape(const remat::Shape* in, const Params&) { return in[0]; }
  template <class P>
  static std::uint64_t random_draws(const remat::Shape*, const remat::Shape& out, const P&) {
    return 2 * static_cast<std::uint64_t>(out.numel());
  }
  static double noise(const remat::RandomStream& r, std::uint64_t k) {
    const double pi = 3.14159265358979323846;
    return std::sqrt(-2 * std::log(1 - r.uniform(2 * k))) * std::cos(2 * pi * r.uniform(2 * k + 1));
  }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const double sigma = remat::params_of<Params>(c).sigma;
    const remat::RandomStream r = c.random();
    const T* x = c.in(0).data();
    T* y = c.out().data();
    for (std::int64_t k = 0; k < c.out_shape().numel(); ++k)
      y[k] = x[k] * static_cast<T>(1 + sigma * noise(r, static_cast<std::uint64_t>(k)));
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    const double sigma = remat::params_of<Params>(c).sigma;
    const remat::RandomStream r = c.random();
    remat::GradTarget<T> d = c.grad_target(0);
    const T* g = c.grad_out().data();
    for (std::int64_t k = 0; k < c.out_shape().numel(); ++k) {
      const T v = g[k] * static_cast<T>(1 + sigma * noise(r, static_cast<std::uint64_t>(k)));
      d.map.data()[k] = d.accumulate ? d.map.data()[k] + v : v;
    }
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) {
    return 40.0 * static_cast<double>(out.numel());
  }
};

template <class T>
remat::Var<T> gaussian_noise(const remat::Var<T>& x, double sigma) {
  return remat::apply_op<GaussianNoiseOp>(GaussianNoiseOp::Params{sigma}, x);
}

/// The same op, present only in training (as dropout): the identity in evaluation.
struct TrainingNoiseOp : GaussianNoiseOp {
  static constexpr const char* name = "training_noise";
  static constexpr bool training_only = true;
};

/// A training_only op whose output is not its input's shape: it cannot be the identity in evaluation.
struct TrainingOnlyHalfOp : GaussianNoiseOp {
  static constexpr const char* name = "training_only_half";
  static constexpr bool training_only = true;
  static remat::Shape output_shape(const remat::Shape* in, const Params&) { return remat::Shape{1, in[0].cols()}; }
};

}  // namespace user_random_ops

namespace random_op_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;
using user_random_ops::gaussian_noise;

/// SplitMix64's output function, written from the paper's constants (the oracle: not remat's code).
std::uint64_t oracle_mix(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// Draw k of the stream (seed, offset) as a uniform double in [0,1): the top 53 bits.
double oracle_uniform(std::uint64_t seed, std::uint64_t offset, std::uint64_t k) {
  return static_cast<double>(oracle_mix(seed ^ oracle_mix(offset + k)) >> 11) / 9007199254740992.0;
}
double oracle_noise(std::uint64_t seed, std::uint64_t offset, std::uint64_t k) {
  const double pi = 3.14159265358979323846;
  return std::sqrt(-2 * std::log(1 - oracle_uniform(seed, offset, 2 * k))) *
         std::cos(2 * pi * oracle_uniform(seed, offset, 2 * k + 1));
}

Matrix<double> ramp(remat::Index rows, remat::Index cols) {
  Matrix<double> m(rows, cols);
  for (remat::Index i = 0; i < m.size(); ++i) m.data()[i] = 0.5 + 0.25 * static_cast<double>(i);
  return m;
}

/// The expected y of a gaussian_noise(x, sigma) drawn at `offset` of a tape seeded `seed`.
Matrix<double> expected_noise(const Matrix<double>& x, double sigma, std::uint64_t seed, std::uint64_t offset) {
  Matrix<double> y = x;
  for (remat::Index k = 0; k < y.size(); ++k)
    y.data()[k] = x.data()[k] * (1 + sigma * oracle_noise(seed, offset, static_cast<std::uint64_t>(k)));
  return y;
}

TEST(RandomOp, DrawsTheTapesStreamAndTheOffsetAdvancesByItsRandomDraws) {
  const std::uint64_t seed = 77;
  Tape<double> tape(seed);
  const Matrix<double> x = ramp(3, 4);
  Var<double> v = tape.constant(x);
  const Matrix<double> first = gaussian_noise(v, 0.5).value();
  const Matrix<double> second = gaussian_noise(v, 0.5).value();
  EXPECT_EQ(first, expected_noise(x, 0.5, seed, 0));
  // The first op used 2 draws per element: 24.
  EXPECT_EQ(second, expected_noise(x, 0.5, seed, 24));
  EXPECT_NE(second, expected_noise(x, 0.5, seed, 12)) << "one draw per element would start here";
}

TEST(RandomOp, ARefusedRecordDrawsNothing) {
  Tape<double> tape(5);
  Var<double> v = tape.constant(ramp(2, 3));
  Var<double> stale;
  EXPECT_THROW(gaussian_noise(stale, 0.5), remat::tape_error);
  const Matrix<double> y = gaussian_noise(v, 0.5).value();
  EXPECT_EQ(y, expected_noise(ramp(2, 3), 0.5, 5, 0));
}

TEST(RandomOp, PassesTheGradcheck) {
  // gradcheck records each evaluation on a fresh tape of one seed: the same noise every time.
  const auto result = remat::gradcheck(
      [](Tape<double>&, const std::vector<Var<double>>& in) {
        return remat::sum(remat::square(gaussian_noise(in[0], 0.3)));
      },
      {ramp(3, 5)});
  EXPECT_TRUE(remat_test::passes(result));
}

/// The loss and dL/dx of tanh → noise → tanh, checkpointed under `policy` (or not: `plain`), → noise → sum.
template <class Policy>
std::pair<Matrix<double>, Matrix<double>> noisy_step(const Matrix<double>& x, bool plain, Policy policy) {
  Tape<double> tape(11);
  Var<double> v = tape.variable(x);
  auto block = [](const Var<double>& a) {
    return remat::tanh(gaussian_noise(remat::checkpoint_name(remat::tanh(a), "inner"), 0.4));
  };
  Var<double> h = plain ? block(v) : remat::checkpoint(block, policy)(v);
  Var<double> loss = remat::sum(gaussian_noise(h, 0.2));
  tape.backward(loss);
  return {Matrix<double>(loss.value()), Matrix<double>(v.grad())};
}

TEST(RandomOp, EveryPolicyReplaysTheSameNoiseAndGivesThePlainGradientsBitwise) {
  const Matrix<double> x = ramp(4, 6);
  const auto plain = noisy_step(x, true, remat::policies::nothing_saveable);
  auto expect_plain = [&](const auto& checkpointed, const char* name) {
    EXPECT_EQ(checkpointed.first, plain.first) << name;
    EXPECT_EQ(checkpointed.second, plain.second) << name;
  };
  expect_plain(noisy_step(x, false, remat::policies::nothing_saveable), "nothing_saveable");
  expect_plain(noisy_step(x, false, remat::policies::everything_saveable), "everything_saveable");
  expect_plain(noisy_step(x, false, remat::policies::dots_saveable), "dots_saveable");
  expect_plain(noisy_step(x, false, remat::policies::save_only_these_names({"inner"})), "save_only_these_names");
  // The check can fail: a different seed's noise gives other gradients.
  Tape<double> other(12);
  Var<double> v = other.variable(x);
  other.backward(remat::sum(gaussian_noise(remat::tanh(gaussian_noise(remat::tanh(v), 0.4)), 0.2)));
  EXPECT_NE(Matrix<double>(v.grad()), plain.second);
}

TEST(RandomOp, ATrainingOnlyOpIsTheIdentityInEvaluationAndDrawsNothing) {
  Tape<double> tape(3);
  const Matrix<double> x = ramp(2, 2);
  Var<double> v = tape.constant(x);
  tape.set_training(false);
  const std::size_t before = tape.size();
  Var<double> same =
      remat::apply_op<user_random_ops::TrainingNoiseOp>(user_random_ops::TrainingNoiseOp::Params{1.0}, v);
  EXPECT_TRUE(same.is_same(v));
  EXPECT_EQ(tape.size(), before);
  tape.set_training(true);
  Var<double> noisy =
      remat::apply_op<user_random_ops::TrainingNoiseOp>(user_random_ops::TrainingNoiseOp::Params{1.0}, v);
  EXPECT_FALSE(noisy.is_same(v));
  EXPECT_EQ(Matrix<double>(noisy.value()), expected_noise(x, 1.0, 3, 0)) << "evaluation drew nothing";
}

TEST(RandomOp, ATrainingOnlyOpThatChangesTheShapeIsRefusedInEvaluation) {
  Tape<double> tape(3);
  Var<double> v = tape.constant(ramp(2, 2));
  tape.set_training(false);
  const std::size_t before = tape.size();
  try {
    remat::apply_op<user_random_ops::TrainingOnlyHalfOp>(user_random_ops::TrainingOnlyHalfOp::Params{1.0}, v);
    ADD_FAILURE() << "no exception";
  } catch (const remat::shape_error& e) {
    EXPECT_NE(std::string(e.what()).find("training_only_half"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[1,2]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tape.size(), before);
}

TEST(RandomOp, DropoutsMaskIsTheStreamsDrawAgainstP) {
  const std::uint64_t seed = 2024;
  Tape<double> tape(seed);
  const Matrix<double> x = ramp(5, 7);
  Var<double> v = tape.constant(x);
  const double p = 0.3;
  const Matrix<double> shift = gaussian_noise(v, 0.1).value();  // 70 draws: dropout starts at offset 70
  (void)shift;
  const Matrix<double> y = remat::dropout(v, p).value();
  for (remat::Index k = 0; k < x.size(); ++k) {
    const bool keep = oracle_uniform(seed, 70, static_cast<std::uint64_t>(k)) >= p;
    EXPECT_EQ(y.data()[k], keep ? x.data()[k] * (1 / (1 - p)) : 0.0) << k;
  }
}

}  // namespace random_op_test
