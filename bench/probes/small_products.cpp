// W0's three products per layer ([16,32]·[32,32], xᵀ·dy and dy·Wᵀ) through Eigen's `dst.noalias() = a·b` on
// row-major maps (a zero fill, a blocking choice, then ?gemm with beta = 1) and through remat's
// detail::direct_gemm (one ?gemm call with beta = 0), whose results are bitwise equal (tests/ops/direct_gemm_test.cpp).
// The question it answered and the answer: bench/probes/README.md.
//
//   OMP_NUM_THREADS=1 build-bench/bench/small_products --benchmark_repetitions=10
//   --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <remat/remat.hpp>

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = remat::ConstAlignedMap<float>;
enum Product { forward, weight_gradient, input_gradient };
enum Path { eigen, direct };

void SmallProduct(benchmark::State& state) {
  const auto product = static_cast<Product>(state.range(0));
  const bool use_direct = state.range(1) == direct;
  const RowMajor x = RowMajor::Random(16, 32), w = RowMajor::Random(32, 32), g = RowMajor::Random(16, 32);
  RowMajor out(product == weight_gradient ? 32 : 16, 32);
  const Map X(x.data(), 16, 32), W(w.data(), 32, 32), G(g.data(), 16, 32);
  remat::AlignedMap<float> dst(out.data(), out.rows(), out.cols());
  const auto run = [&](const auto& p) {
    if (use_direct) {
      if (!remat::detail::direct_gemm(dst, p, false)) state.SkipWithError("direct_gemm did not take the product");
    } else {
      dst.noalias() = p;
    }
  };
  for (auto _ : state) {
    switch (product) {
      case forward:
        run(X * W);
        break;
      case weight_gradient:
        run(X.transpose() * G);
        break;
      case input_gradient:
        run(G * W.transpose());
        break;
    }
    benchmark::ClobberMemory();
  }
}
BENCHMARK(SmallProduct)
    ->ArgNames({"product", "direct"})
    ->ArgsProduct({{forward, weight_gradient, input_gradient}, {eigen, direct}})
    ->Unit(benchmark::kNanosecond);

}  // namespace

BENCHMARK_MAIN();
