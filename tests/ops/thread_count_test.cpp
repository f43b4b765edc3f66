// remat::set_num_threads (remat/threads.hpp): refusing zero and negative counts naming the value, results
// bitwise identical for every thread count, calls from two threads and from inside a parallel region, and a
// huge count that must not kill the next kernel (a regression test, run in a death-test child).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "fma_op.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/threads.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace thread_count_test {

using remat_test::fma;
using remat_test::FmaOp;

using remat::Index;
using remat::Matrix;
using remat::Parameter;
using remat::Shape;
using remat::Tape;
using remat::Var;
using Policy = std::function<bool(const remat::OpInfo&)>;

/// y = exp(x) · s with exp(x) kept as its extra, and a [1, cols] temporary (the column maxima, unused
/// arithmetic-wise except as a scratch write) in forward and backward.
struct ScaledExpOp : remat::OpBase {
  static constexpr const char* name = "scaled_exp";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  struct Params {
    double s;
  };
  static unsigned reads(remat::GradInputs g) { return remat::wants(g, 0) ? remat::reads_extra : 0u; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape extra_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape scratch_shape(const Shape* in, const Params&) { return Shape{1, in[0].cols}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    c.extra() = c.in(0).array().exp().matrix();
    c.scratch() = c.extra().colwise().maxCoeff();
    c.out() = static_cast<T>(p.s) * c.extra();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    c.scratch().setZero();
    c.add_grad(0, static_cast<T>(p.s) * c.grad_out().array() * c.extra().array());
  }
  static double flops(const Shape*, int, const Shape& out) { return 3.0 * static_cast<double>(out.size()); }
};

template <class T>
Var<T> scaled_exp(const Var<T>& x, double s) {
  return remat::apply_op<ScaledExpOp>(ScaledExpOp::Params{s}, x);
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(*a.data())) == 0;
}
template <class Body>
void run_in_child(Body body) {
  alarm(20);
  body();
  std::fflush(stdout);
  std::_Exit(0);
}
TEST(ThreadCount, SetNumThreadsRefusesZeroAndNegativeNamingTheValue) {
  const int before = remat::num_threads();
  for (int n : {0, -1, INT_MIN}) {
    remat_test::expect_error_naming<remat::domain_error>([&] { remat::set_num_threads(n); },
                                                         {"set_num_threads", std::to_string(n)});
    EXPECT_EQ(remat::num_threads(), before);
  }
}

/// A program of remat's own kernels above the parallel grain (no matrix product: OpenBLAS's products are
/// exempt from the guarantee): every result bitwise the same for 1, 2, 3, 5 and 8 threads.
TEST(ThreadCount, ResultsAreBitwiseIdenticalForEveryThreadCount) {
  const int saved = remat::num_threads();
  const Matrix<float> X = remat_test::random_matrix<float>(300, 130, 4, remat_test::Domain{-2, 2, 0});
  const Matrix<float> G = remat_test::random_matrix<float>(1, 130, 5, remat_test::Domain{0.5, 1.5, 0});
  std::vector<int> labels;
  for (int i = 0; i < 300; ++i) labels.push_back((i * 7) % 130);
  auto run = [&](Matrix<float>& gx, Matrix<float>& gg, float& loss_value) {
    Tape<float> tape;
    Parameter<float> gain(G), bias(Matrix<float>::Zero(1, 130));
    Var<float> x = tape.variable(X);
    Var<float> h =
        remat::layer_norm(remat::gelu(x) + fma(x, remat::sin(x), x), tape.variable(gain), tape.variable(bias));
    h = scaled_exp(remat::tanh(h), 0.5) + remat::softmax(h) + remat::log_softmax(h);
    Var<float> loss = remat::cross_entropy(h, labels) + remat::mean(h * h) + remat::sum(remat::sum_rows(h)) * 1e-3f;
    loss_value = loss.item();
    tape.backward(loss);
    gx = x.grad();
    gg = gain.grad();
  };
  Matrix<float> gx1, gg1;
  float l1 = 0;
  remat::set_num_threads(1);
  run(gx1, gg1, l1);
  for (int n : {2, 3, 5, 8}) {
    SCOPED_TRACE(std::to_string(n) + " threads");
    remat::set_num_threads(n);
    Matrix<float> gx, gg;
    float l = 0;
    const long regions = remat::detail::parallel_regions_entered.load();
    run(gx, gg, l);
#ifdef _OPENMP
    // The kernels went to the team: the comparison is of a run where the thread count changes the schedule.
    EXPECT_GT(remat::detail::parallel_regions_entered.load(), regions);
#endif
    EXPECT_EQ(std::memcmp(&l, &l1, sizeof l), 0);
    EXPECT_TRUE(same_bits(gx, gx1));
    EXPECT_TRUE(same_bits(gg, gg1));
  }
  remat::set_num_threads(saved);
}

/// set_num_threads from two threads at once, and from inside an OpenMP parallel region: no crash, the setting
/// is one of the values given, and a kernel run afterwards gives the one-thread result.
TEST(ThreadCount, SetNumThreadsFromTwoThreadsAndInsideAParallelRegion) {
  const int saved = remat::num_threads();
  std::thread a([] {
    for (int i = 0; i < 200; ++i) remat::set_num_threads(2);
  });
  std::thread b([] {
    for (int i = 0; i < 200; ++i) remat::set_num_threads(3);
  });
  a.join();
  b.join();
  EXPECT_TRUE(remat::num_threads() == 2 || remat::num_threads() == 3);
#ifdef _OPENMP
#pragma omp parallel num_threads(2)
  { remat::set_num_threads(2 + omp_get_thread_num()); }
  EXPECT_TRUE(remat::num_threads() == 2 || remat::num_threads() == 3);
#endif
  const Matrix<float> X = remat_test::random_matrix<float>(256, 256, 8);
  auto grad = [&] {
    Tape<float> tape;
    Var<float> x = tape.variable(X);
    tape.backward(remat::sum(remat::tanh(x) * x));
    return Matrix<float>(x.grad());
  };
  const Matrix<float> many = grad();
  remat::set_num_threads(1);
  EXPECT_TRUE(same_bits(grad(), many));
  remat::set_num_threads(saved);
}

// Regression (crash): set_num_threads accepts any n ≥ 1, and every kernel above the grain then asks libgomp for a
// team of exactly n threads (parallel.hpp parallel_for: "always the same team size", never min(n, blocks)); for
// n = 2^30 libgomp cannot allocate or start the team and ends the process ("libgomp: Out of memory" / "Thread
// creation failed"), from an ordinary op. Expected: set_num_threads throws domain_error for an n it cannot
// honour (e.g. above omp_get_thread_limit() or a documented cap), or clamps it; never a dead process.
TEST(ThreadCount, AHugeThreadCountDoesNotKillTheNextKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                try {
                  remat::set_num_threads(1 << 30);
                } catch (const remat::domain_error&) {
                  std::_Exit(0);  // refused: fine
                }
                Tape<float> tape;
                Var<float> x = tape.variable(Matrix<float>::Constant(512, 512, 0.5f));
                tape.backward(remat::sum(remat::tanh(x)));
                if (!x.grad().isApproxToConstant(1 - std::tanh(0.5f) * std::tanh(0.5f))) std::_Exit(3);
              }),
              ::testing::ExitedWithCode(0), "");
}

}  // namespace thread_count_test
