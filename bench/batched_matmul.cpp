// A batched matrix product, C [64,128,128] = A [64,128,64] × B [64,64,128] in float32, at 1 and 2 threads,
// through LibTorch and through two hand-written loops over the batch, the floor a batched matmul in remat
// would be held to. Rows (all in one program, so that one run interleaves them):
//   torch_matmul/forward/<threads>           torch::matmul(a, b) on contiguous tensors (a new C each time)
//   torch_matmul/forward_backward/<threads>  a and b require grad; torch::matmul(a, b).sum().backward(), the
//                                            grads reset to undefined before each step (as torch_model.cpp)
//   remat_matmul/forward/<threads>           remat::matmul of two Parameters on a tape cleared each step
//   remat_matmul/forward_backward/<threads>  the same and tape.backward(remat::sum(c)): the graph of the torch row
//   eigen_loop/forward/<threads>             per batch, C_i.noalias() = A_i·B_i on row-major Eigen maps into a
//                                            preallocated C; at 2 threads the batch is split over an OpenMP
//                                            team of 2 (each product then runs on its own thread: OpenBLAS's
//                                            OpenMP build is single-threaded inside a parallel region)
//   blas_loop/forward/<threads>              per batch, cblas_sgemm into the preallocated C, in turn, each
//                                            product on every OpenBLAS thread (only when CMake found OpenBLAS)
// Threads as in step_benchmark: remat::set_num_threads(n) (remat's team and openblas_set_num_threads(n); the
// OpenMP build of OpenBLAS also calls omp_set_num_threads(n), which Eigen reads) and torch::set_num_threads(n).
// Every row checks its last result against a double-precision reference. Google Benchmark appends
// "/real_time" to each name (UseRealTime: wall-clock iterations and GFLOP/s, as the threaded bench programs).
//
//   "${tuned[@]}" build-bench/bench/batched_matmul --benchmark_repetitions=10
//       --benchmark_enable_random_interleaving=true          (tuned: bench/common.sh; on an idle machine)
#include <benchmark/benchmark.h>

#include <remat/remat.hpp>  // before <cblas.h>: remat/blas.hpp declares OpenBLAS's thread functions weak

#ifdef REMAT_BENCH_CBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "context.hpp"

namespace {

constexpr int64_t batch = 64, m = 128, k = 64, n = 128;  // A [batch,m,k] × B [batch,k,n] → C [batch,m,n]
constexpr double forward_flops = 2.0 * batch * m * k * n;
// A float32 product of length k = 64 against a double reference: well below this, relative to max |C|.
constexpr double tolerance = 1e-5;

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The operands (fixed-seed normal), the same for every row, and the reference results in double.
struct Operands {
  std::vector<float> a, b;
  std::vector<double> c, grad_a, grad_b;  // grad_a, grad_b: of sum(C), i.e. for dC = ones
  Operands() : a(batch * m * k), b(batch * k * n), c(batch * m * n, 0.0), grad_a(batch * m * k), grad_b(batch * k * n) {
    std::mt19937 generator(20260101);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : a) v = normal(generator);
    for (float& v : b) v = normal(generator);
    for (int64_t s = 0; s < batch; ++s) {
      const float* as = &a[s * m * k];
      const float* bs = &b[s * k * n];
      double* cs = &c[s * m * n];
      for (int64_t i = 0; i < m; ++i)
        for (int64_t p = 0; p < k; ++p)
          for (int64_t j = 0; j < n; ++j) cs[i * n + j] += double(as[i * k + p]) * double(bs[p * n + j]);
      // d sum(C) / dA[i,p] = Σ_j B[p,j];  d sum(C) / dB[p,j] = Σ_i A[i,p].
      for (int64_t p = 0; p < k; ++p) {
        double row = 0, column = 0;
        for (int64_t j = 0; j < n; ++j) row += bs[p * n + j];
        for (int64_t i = 0; i < m; ++i) column += as[i * k + p];
        for (int64_t i = 0; i < m; ++i) grad_a[(s * m + i) * k + p] = row;
        for (int64_t j = 0; j < n; ++j) grad_b[(s * k + p) * n + j] = column;
      }
    }
  }
};

const Operands& operands() {
  static const Operands o;
  return o;
}

/// Largest |got − want| / max |want|.
double relative_error(const float* got, const std::vector<double>& want) {
  double error = 0, scale = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    error = std::max(error, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return error / scale;
}

void check(benchmark::State& state, const char* what, const float* got, const std::vector<double>& want) {
  const double e = relative_error(got, want);
  if (!(e <= tolerance)) state.SkipWithError((std::string(what) + ": relative error " + std::to_string(e)).c_str());
}

void set_threads(int threads) {
  remat::set_num_threads(threads);  // remat's kernels and OpenBLAS's products (and, its OpenMP build, omp's)
  torch::set_num_threads(threads);  // ATen's intra-op threads
}

void finish(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

torch::Tensor tensor(const std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return torch::from_blob(const_cast<float*>(v.data()), shape, torch::kFloat32).clone();
}

void TorchForward(benchmark::State& state) {
  set_threads(static_cast<int>(state.range(0)));
  const Operands& o = operands();
  const torch::Tensor a = tensor(o.a, {batch, m, k}), b = tensor(o.b, {batch, k, n});
  torch::Tensor c = torch::matmul(a, b);  // warm-up at this thread count
  for (auto _ : state) {
    c = torch::matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr<float>());
    benchmark::ClobberMemory();
  }
  check(state, "C", c.contiguous().data_ptr<float>(), o.c);
  finish(state, forward_flops);
}

void TorchForwardBackward(benchmark::State& state) {
  set_threads(static_cast<int>(state.range(0)));
  const Operands& o = operands();
  torch::Tensor a = tensor(o.a, {batch, m, k}).set_requires_grad(true);
  torch::Tensor b = tensor(o.b, {batch, k, n}).set_requires_grad(true);
  const auto step = [&] {
    a.mutable_grad() = torch::Tensor();  // undefined: backward writes the fresh gradient, no zero fill or add
    b.mutable_grad() = torch::Tensor();
    torch::matmul(a, b).sum().backward();  // dC = ones, as remat's row
  };
  step();  // warm-up
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(a.grad().data_ptr<float>());
    benchmark::DoNotOptimize(b.grad().data_ptr<float>());
    benchmark::ClobberMemory();
  }
  check(state, "dA", a.grad().contiguous().data_ptr<float>(), o.grad_a);
  check(state, "dB", b.grad().contiguous().data_ptr<float>(), o.grad_b);
  finish(state, 3 * forward_flops);  // C = A·B, dA = dC·Bᵀ, dB = Aᵀ·dC
}

/// remat's Parameters of the operands (no copy per step: a tape references them).
struct RematOperands {
  remat::Parameter<float> a, b;
  RematOperands() {
    const Operands& o = operands();
    a = remat::Parameter<float>(remat::Tensor<float, 3>(remat::TensorView<float, 3>(o.a.data(), batch, m, k)));
    b = remat::Parameter<float>(remat::Tensor<float, 3>(remat::TensorView<float, 3>(o.b.data(), batch, k, n)));
  }
};

void RematForward(benchmark::State& state) {
  set_threads(static_cast<int>(state.range(0)));
  RematOperands p;
  remat::Tape<float> tape;
  const auto step = [&] {
    tape.clear();
    const remat::Var<float> c = remat::matmul(tape.variable(p.a), tape.variable(p.b));
    return c;
  };
  step();  // warm-up: the tape's pool holds C from now on
  for (auto _ : state) {
    const remat::Var<float> c = step();
    benchmark::DoNotOptimize(c.value().data());
    benchmark::ClobberMemory();
  }
  const remat::Var<float> c = step();
  check(state, "C", c.value().data(), operands().c);
  finish(state, forward_flops);
}

void RematForwardBackward(benchmark::State& state) {
  set_threads(static_cast<int>(state.range(0)));
  RematOperands p;
  remat::Tape<float> tape;
  const auto step = [&] {
    tape.clear();
    p.a.zero_grad();
    p.b.zero_grad();
    const remat::Var<float> c = remat::matmul(tape.variable(p.a), tape.variable(p.b));
    tape.backward(remat::sum(c));
  };
  step();  // warm-up
  for (auto _ : state) {
    step();
    benchmark::DoNotOptimize(p.a.grad().data());
    benchmark::DoNotOptimize(p.b.grad().data());
    benchmark::ClobberMemory();
  }
  check(state, "dA", p.a.grad().data(), operands().grad_a);
  check(state, "dB", p.b.grad().data(), operands().grad_b);
  finish(state, 3 * forward_flops);
}

void EigenLoop(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  set_threads(threads);
  const Operands& o = operands();
  std::vector<float> c(batch * m * n);
  int team = 1;
  const auto run = [&] {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1)
#endif
    {
#ifdef _OPENMP
#pragma omp single
      team = omp_get_num_threads();
#pragma omp for schedule(static)
#endif
      for (int64_t s = 0; s < batch; ++s) {
        const Eigen::Map<const RowMajor> as(&o.a[s * m * k], m, k), bs(&o.b[s * k * n], k, n);
        Eigen::Map<RowMajor> cs(&c[s * m * n], m, n);
        cs.noalias() = as * bs;
      }
    }
  };
  run();  // warm-up
  if (team != threads) {
    state.SkipWithError(("the batch loop got a team of " + std::to_string(team) + " threads").c_str());
    return;
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  check(state, "C", c.data(), o.c);
  finish(state, forward_flops);
}

#ifdef REMAT_BENCH_CBLAS
void BlasLoop(benchmark::State& state) {
  set_threads(static_cast<int>(state.range(0)));  // OpenBLAS's threads: openblas_set_num_threads(n)
  const Operands& o = operands();
  std::vector<float> c(batch * m * n);
  const auto run = [&] {
    for (int64_t s = 0; s < batch; ++s)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, &o.a[s * m * k], k, &o.b[s * k * n], n,
                  0.0f, &c[s * m * n], n);
  };
  run();  // warm-up
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  check(state, "C", c.data(), o.c);
  finish(state, forward_flops);
}
#endif

void threads_1_2(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  bench::add_blas_context();
  benchmark::RegisterBenchmark("torch_matmul/forward", TorchForward)->Apply(threads_1_2);
  benchmark::RegisterBenchmark("torch_matmul/forward_backward", TorchForwardBackward)->Apply(threads_1_2);
  benchmark::RegisterBenchmark("remat_matmul/forward", RematForward)->Apply(threads_1_2);
  benchmark::RegisterBenchmark("remat_matmul/forward_backward", RematForwardBackward)->Apply(threads_1_2);
  benchmark::RegisterBenchmark("eigen_loop/forward", EigenLoop)->Apply(threads_1_2);
#ifdef REMAT_BENCH_CBLAS
  benchmark::RegisterBenchmark("blas_loop/forward", BlasLoop)->Apply(threads_1_2);
#endif
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
