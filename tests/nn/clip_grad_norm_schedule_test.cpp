// nn::clip_grad_norm (the global norm, scaling only above the bound, non-finite norms, float precision, bad
// arguments) and nn::WarmupCosineSchedule (the linear warm-up, the cosine down to the minimum, its exact peak,
// bad arguments), and Generator::below's domain check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <remat/nn/clip_grad_norm.hpp>
#include <remat/nn/linear.hpp>
#include <remat/nn/warmup_cosine_schedule.hpp>
#include <remat/remat.hpp>

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace clip_grad_norm_schedule_test {

using remat::Matrix;
using remat::Parameter;
namespace nn = remat::nn;
// Expects `f` to throw E with a message containing each of `parts`.
template <class E, class F>
void expect_throw_naming(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// ---- clip_grad_norm ----

TEST(ClipGradNorm, ReturnsTheGlobalNormAndScalesOnlyAboveTheBound) {
  Parameter<double> a(Matrix<double>::Zero(1, 2)), b(Matrix<double>::Zero(2, 1)), idle(Matrix<double>::Zero(1, 1));
  auto set = [&] {
    a.mutable_grad() << 3, -4;
    b.mutable_grad() << 12, 0;
  };
  set();
  const std::vector<Parameter<double>*> all = {&a, &idle, &b};
  // √(9 + 16 + 144 + 0) = 13, exact; idle has no gradient and is skipped.
  EXPECT_EQ(nn::clip_grad_norm(all, 13.5), 13.0);
  EXPECT_EQ(a.grad()(0, 0), 3.0) << "13 + 1e-6 < 13.5: unchanged";
  EXPECT_EQ(b.grad()(0, 0), 12.0);
  EXPECT_FALSE(idle.has_grad());

  EXPECT_EQ(nn::clip_grad_norm(all, 6.5), 13.0);
  const double factor = 6.5 / (13.0 + 1e-6);
  EXPECT_EQ(a.grad()(0, 0), 3.0 * factor);
  EXPECT_EQ(a.grad()(0, 1), -4.0 * factor);
  EXPECT_EQ(b.grad()(0, 0), 12.0 * factor);
  EXPECT_EQ(b.grad()(1, 0), 0.0);
  EXPECT_FALSE(idle.has_grad()) << "still no gradient";
  EXPECT_NEAR(nn::clip_grad_norm(all, std::numeric_limits<double>::infinity()), 6.5, 1e-6);

  EXPECT_EQ(nn::clip_grad_norm(std::vector<Parameter<double>*>{&idle}, 1.0), 0.0) << "no gradients";
}

TEST(ClipGradNorm, TheNormIsTheHandSumOfSquaresOfFloatGradients) {
  remat::nn::Generator random(3);
  std::vector<Parameter<float>> parameters;
  double sum = 0;
  for (remat::Index cols : {1, 17, 1000}) {
    Parameter<float> p(Matrix<float>::Zero(3, cols));
    auto g = p.mutable_grad();
    for (remat::Index i = 0; i < g.size(); ++i) {
      g.data()[i] = static_cast<float>(random.uniform() * 4 - 2);
      sum += static_cast<double>(g.data()[i]) * g.data()[i];
    }
    parameters.push_back(std::move(p));
  }
  std::vector<Parameter<float>*> list;
  for (auto& p : parameters) list.push_back(&p);
  const double norm = nn::clip_grad_norm(list, 1.0);
  EXPECT_NEAR(norm, std::sqrt(sum), 1e-14 * std::sqrt(sum)) << "summed in double, in another order";
  double after = 0;
  for (auto& p : parameters) after += p.grad().cast<double>().squaredNorm();
  EXPECT_NEAR(std::sqrt(after), 1.0, 1e-6);
}

TEST(ClipGradNorm, ANonFiniteNormLeavesTheGradientsOrThrows) {
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    Parameter<double> a(Matrix<double>::Zero(1, 2)), b(Matrix<double>::Zero(1, 1));
    a.mutable_grad() << 1, bad;
    b.mutable_grad() << 5;
    const std::vector<Parameter<double>*> all = {&a, &b};
    const double norm = nn::clip_grad_norm(all, 1.0);
    EXPECT_FALSE(std::isfinite(norm));
    EXPECT_EQ(std::isnan(norm), std::isnan(bad));
    EXPECT_EQ(a.grad()(0, 0), 1.0) << "unchanged";
    EXPECT_EQ(b.grad()(0, 0), 5.0) << "unchanged";
    expect_throw_naming<remat::domain_error>([&] { nn::clip_grad_norm(all, 1.0, true); },
                                             {"nn::clip_grad_norm", std::isnan(bad) ? "nan" : "inf"});
    EXPECT_EQ(b.grad()(0, 0), 5.0) << "unchanged";
  }
}

TEST(ClipGradNorm, RejectsBadArgumentsChangingNothing) {
  Parameter<double> a(Matrix<double>::Zero(1, 1));
  a.mutable_grad() << 10;
  expect_throw_naming<remat::domain_error>([&] { nn::clip_grad_norm(std::vector<Parameter<double>*>{&a}, -1.0); },
                                           {"nn::clip_grad_norm", "-1"});
  expect_throw_naming<remat::domain_error>(
      [&] { nn::clip_grad_norm(std::vector<Parameter<double>*>{&a}, std::nan("")); }, {"nn::clip_grad_norm", "nan"});
  expect_throw_naming<remat::domain_error>(
      [&] {
        nn::clip_grad_norm(std::vector<Parameter<double>*>{&a, nullptr}, 1.0);
      },
      {"nn::clip_grad_norm", "parameter 1", "null"});
  EXPECT_EQ(a.grad()(0, 0), 10.0);
}

// ---- WarmupCosineSchedule ----

TEST(WarmupCosineSchedule, RisesLinearlyThenFollowsTheCosineDownToTheMinimum) {
  const double peak = 6e-4, min = 6e-5;
  const nn::WarmupCosineSchedule s(peak, 10, 110, min);
  EXPECT_DOUBLE_EQ(s.at(0), peak / 10);
  EXPECT_DOUBLE_EQ(s.at(4), peak * 5 / 10);
  EXPECT_DOUBLE_EQ(s.at(9), peak) << "warmup − 1: the warm-up ends at peak";
  EXPECT_DOUBLE_EQ(s.at(10), peak) << "warmup: the decay starts at peak";
  EXPECT_DOUBLE_EQ(s.at(35), min + 0.5 * (peak - min) * (1 + std::cos(M_PI * 0.25)));
  EXPECT_NEAR(s.at(60), (peak + min) / 2, 1e-18) << "midpoint";
  EXPECT_DOUBLE_EQ(s.at(109), min + 0.5 * (peak - min) * (1 - std::cos(M_PI / 100)));
  EXPECT_GT(s.at(109), min);
  EXPECT_EQ(s.at(110), min) << "total";
  EXPECT_EQ(s.at(111), min);
  EXPECT_EQ(s.at(std::uint64_t{1} << 62), min) << "beyond";
  for (std::uint64_t t = 0; t < 9; ++t) EXPECT_LT(s.at(t), s.at(t + 1)) << t;
  for (std::uint64_t t = 10; t < 110; ++t) EXPECT_GT(s.at(t), s.at(t + 1)) << t;
  EXPECT_EQ(s.peak_lr(), peak);
  EXPECT_EQ(s.min_lr(), min);
  EXPECT_EQ(s.warmup_steps(), 10u);
  EXPECT_EQ(s.total_steps(), 110u);
}

TEST(WarmupCosineSchedule, NoWarmupStartsAtThePeakAndTheMinimumDefaultsToZero) {
  const nn::WarmupCosineSchedule s(1.0, 0, 4);
  EXPECT_EQ(s.at(0), 1.0);
  EXPECT_DOUBLE_EQ(s.at(2), 0.5);
  EXPECT_EQ(s.at(4), 0.0);
  const nn::WarmupCosineSchedule one(1.0, 1, 2);  // one warm-up step, one decay step
  EXPECT_EQ(one.at(0), 1.0);
  EXPECT_EQ(one.at(1), 1.0);
  EXPECT_EQ(one.at(2), 0.0);
}

TEST(WarmupCosineSchedule, RejectsBadArgumentsNamingThem) {
  using S = nn::WarmupCosineSchedule;
  expect_throw_naming<remat::domain_error>([] { S(0.0, 1, 10); }, {"nn::WarmupCosineSchedule", "peak_lr 0"});
  expect_throw_naming<remat::domain_error>([] { S(std::numeric_limits<double>::infinity(), 1, 10); }, {"peak_lr inf"});
  expect_throw_naming<remat::domain_error>([] { S(std::nan(""), 1, 10); }, {"peak_lr nan"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 1, 10, 2e-3); }, {"min_lr 0.002"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 1, 10, -1e-4); }, {"min_lr -1e-04"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 1, 10, std::nan("")); }, {"min_lr nan"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, -1, 10); }, {"warmup_steps -1"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 10, 10); }, {"warmup_steps 10", "total_steps 10"});
  expect_throw_naming<remat::domain_error>([] { S(1e-3, 10, 5); }, {"total_steps 5"});
  EXPECT_NO_THROW(S(1e-3, 0, 1, 1e-3));
}

// The schedule's documented values, exactly: lr(W − 1) = lr(W) = peak, never above peak, never below min.
// peak · (t+1) / W rounded above peak for peak 0.1 and W = 3 (0.10000000000000002), in 42 of 1400 pairs.
TEST(WarmupCosineSchedule, TheWarmUpEndsExactlyAtThePeakAndNoRateLeavesMinToPeak) {
  for (const double peak : {0.1, 6e-4, 3e-4, 0.3, 0.7, 1e-3})
    for (const double min : {0.0, peak / 10, peak / 3})
      for (std::int64_t w = 1; w <= 60; ++w) {
        const nn::WarmupCosineSchedule s(peak, w, w + 37, min);
        ASSERT_EQ(s.at(static_cast<std::uint64_t>(w - 1)), peak) << "peak " << peak << " W " << w;
        ASSERT_EQ(s.at(static_cast<std::uint64_t>(w)), peak) << "peak " << peak << " W " << w;
        for (std::uint64_t t = 0; t < static_cast<std::uint64_t>(w + 40); ++t) {
          ASSERT_LE(s.at(t), peak) << "peak " << peak << " min " << min << " W " << w << " t " << t;
          if (t < static_cast<std::uint64_t>(w))
            ASSERT_GT(s.at(t), 0.0) << "peak " << peak << " W " << w << " t " << t;
          else
            ASSERT_GE(s.at(t), min) << "peak " << peak << " min " << min << " W " << w << " t " << t;
        }
      }
}

// "In (0, peak_lr] during warm-up" also for a tiny peak over a long warm-up, whose product rounded to 0.
TEST(WarmupCosineSchedule, WarmUpRatesStayPositiveForATinyPeak) {
  EXPECT_GT(nn::WarmupCosineSchedule(5e-324, 2, 4).at(0), 0.0);
  EXPECT_GT(nn::WarmupCosineSchedule(1e-310, std::int64_t{1} << 62, INT64_MAX).at(0), 0.0);
  EXPECT_LE(nn::WarmupCosineSchedule(5e-324, 2, 4).at(0), 5e-324);
}

// below(0) divided by zero (SIGFPE): the empty range is a typed error.
TEST(Generator, BelowZeroThrowsDomainError) {
  nn::Generator g(1);
  expect_throw_naming<remat::domain_error>([&] { (void)g.below(0); }, {"nn::Generator::below", "0"});
  EXPECT_LT(g.below(1), 1u);
}

// clip_grad_norm in float leaves the norm at max_norm up to float rounding (it ended above max_norm in 982 of
// 2000 random trials, by at most 5.9e-8 relative): the doc's bound, checked in double.
TEST(ClipGradNorm, FloatClippedNormIsMaxNormToFloatPrecision) {
  nn::Generator random(1);
  for (int trial = 0; trial < 200; ++trial) {
    Parameter<float> p(Matrix<float>::Zero(1, 37));
    auto g = p.mutable_grad();
    for (int i = 0; i < 37; ++i) g(0, i) = static_cast<float>((random.uniform() * 20 - 10) * 1000);
    const double max_norm = 1.0 + trial * 1e-3;
    nn::clip_grad_norm<float>({&p}, max_norm);
    const double norm = p.grad().cast<double>().norm();
    ASSERT_LE(std::abs(norm - max_norm), 1e-6 * max_norm) << "trial " << trial;
  }
}

}  // namespace clip_grad_norm_schedule_test
