// A linear layer's backward has two independent products of equal FLOPs, dx = dy·Wᵀ and dW = xᵀ·dy (both
// m·k·n multiply-adds). This compares, for W1's and W2's linear shapes, running them one after the other, each
// on every thread of OpenBLAS, with running them side by side on a team of two, one product per thread
// (OpenBLAS's OpenMP build runs a product single-threaded inside a parallel region). Every product goes through
// detail::assign_product, as in remat's ops (the zero fill on remat's team, then the GEMM adds).
//
//   build-bench/bench/product_pairs --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true
//       --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <remat/remat.hpp>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct Linear {
  RowMajor x, w, g, dx, dw;
  Linear(int m, int k, int n)
      : x(RowMajor::Random(m, k)), w(RowMajor::Random(k, n)), g(RowMajor::Random(m, n)), dx(m, k), dw(k, n) {}
  void input_gradient() {
    remat::detail::assign_product(remat::AlignedMap<float>(dx.data(), dx.rows(), dx.cols()), g * w.transpose());
  }
  void weight_gradient() {
    remat::detail::assign_product(remat::AlignedMap<float>(dw.data(), dw.rows(), dw.cols()), x.transpose() * g);
  }
};

enum Mode { one_after_the_other, side_by_side };

void pair(benchmark::State& state, Linear& l) {
  const double m = static_cast<double>(l.x.rows()), k = static_cast<double>(l.x.cols()),
               n = static_cast<double>(l.w.cols());
  remat::set_num_threads(static_cast<int>(state.range(1)));
  const auto mode = static_cast<Mode>(state.range(0));
  for (auto _ : state) {
    if (mode == one_after_the_other) {
      l.input_gradient();
      l.weight_gradient();
    } else {
#ifdef _OPENMP
      int team = 0;
#pragma omp parallel num_threads(2)
      {
        if (omp_get_thread_num() == 0) {
          team = omp_get_num_threads();
          l.input_gradient();
        } else {
          l.weight_gradient();
        }
      }
      if (team != 2) {
        state.SkipWithError("side by side: OpenMP gave a team of fewer than two threads");
        break;
      }
#else
      state.SkipWithError("side by side needs OpenMP");
      break;
#endif
    }
    benchmark::DoNotOptimize(l.dx.data());
    benchmark::DoNotOptimize(l.dw.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * m * k * n * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

void W1(benchmark::State& s) {  // W1's hidden layers: x [512,1024], W [1024,1024]
  static Linear l(512, 1024, 1024);
  pair(s, l);
}
void W2Up(benchmark::State& s) {  // W2's Linear(256→1024)
  static Linear l(2048, 256, 1024);
  pair(s, l);
}
void W2Down(benchmark::State& s) {  // W2's Linear(1024→256)
  static Linear l(2048, 1024, 256);
  pair(s, l);
}

void modes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"mode", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  b->Args({one_after_the_other, 1})->Args({one_after_the_other, 2})->Args({side_by_side, 2});
}
BENCHMARK(W1)->Apply(modes);
BENCHMARK(W2Up)->Apply(modes);
BENCHMARK(W2Down)->Apply(modes);

}  // namespace

BENCHMARK_MAIN();
