// W2's six GEMM shapes alone, through each path a product can take to OpenBLAS (bench/probes/README.md): Eigen's
// dst = a·b on row-major maps (a serial zero fill, then the GEMM adds), the same with the fill on remat's
// team (detail::zero_for_product, what remat's ops do), and sgemm_ with beta = 0 as LibTorch's addmm calls
// it. Operands stay in the last-level cache between repetitions: this isolates the call path from the
// step's context (its operands mostly come from memory).
//
//   build-bench/bench/gemm_paths --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <functional>
#include <remat/remat.hpp>

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
constexpr int batch = 2048, width = 256, hidden = 1024;  // W2 (bench/workloads.hpp)

struct Operands {
  RowMajor x = RowMajor::Random(batch, width), w1 = RowMajor::Random(width, hidden);
  RowMajor g = RowMajor::Random(batch, hidden), w2 = RowMajor::Random(hidden, width);
  RowMajor d = RowMajor::Random(batch, width);
  RowMajor y{batch, hidden}, z{batch, width}, dw1{width, hidden}, dw2{hidden, width}, dg{batch, hidden},
      dx{batch, width};
};
Operands& operands() {
  static Operands o;
  return o;
}

enum Path { eigen_serial_zero, team_zero, sgemm_beta0 };

/// Row-major c[m,n] = op(a)·op(b) as sgemm_ sees it: column-major cᵀ = op(b)ᵀ·op(a)ᵀ, beta = 0.
void sgemm_row_major(char ta, char tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                     float* c) {
  const float one = 1, zero = 0;
  sgemm_(&tb, &ta, &n, &m, &k, &one, b, &ldb, a, &lda, &zero, c, &n);
}

template <class Product>
void run(benchmark::State& state, RowMajor& dst, const Product& product, const std::function<void()>& direct) {
  remat::set_num_threads(static_cast<int>(state.range(1)));
  const auto path = static_cast<Path>(state.range(0));
  remat::AlignedMap<float> map(dst.data(), dst.rows(), dst.cols());
  for (auto _ : state) {
    switch (path) {
      case eigen_serial_zero:
        dst.noalias() = product;
        break;
      case team_zero:
        remat::detail::assign_product(map, product);
        break;
      case sgemm_beta0:
        direct();
        break;
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
}

void Forward1(benchmark::State& s) {  // y = x·W1: [2048,256]·[256,1024]
  Operands& o = operands();
  run(s, o.y, o.x * o.w1,
      [&] { sgemm_row_major('N', 'N', batch, hidden, width, o.x.data(), width, o.w1.data(), hidden, o.y.data()); });
}
void Forward2(benchmark::State& s) {  // z = g·W2: [2048,1024]·[1024,256]
  Operands& o = operands();
  run(s, o.z, o.g * o.w2,
      [&] { sgemm_row_major('N', 'N', batch, width, hidden, o.g.data(), hidden, o.w2.data(), width, o.z.data()); });
}
void InputGradient2(benchmark::State& s) {  // dg = d·W2ᵀ: [2048,256]·[256,1024]
  Operands& o = operands();
  run(s, o.dg, o.d * o.w2.transpose(),
      [&] { sgemm_row_major('N', 'T', batch, hidden, width, o.d.data(), width, o.w2.data(), width, o.dg.data()); });
}
void WeightGradient2(benchmark::State& s) {  // dW2 = gᵀ·d: [1024,2048]·[2048,256]
  Operands& o = operands();
  run(s, o.dw2, o.g.transpose() * o.d,
      [&] { sgemm_row_major('T', 'N', hidden, width, batch, o.g.data(), hidden, o.d.data(), width, o.dw2.data()); });
}
void InputGradient1(benchmark::State& s) {  // dx = dg·W1ᵀ: [2048,1024]·[1024,256]
  Operands& o = operands();
  run(s, o.dx, o.dg * o.w1.transpose(),
      [&] { sgemm_row_major('N', 'T', batch, width, hidden, o.dg.data(), hidden, o.w1.data(), hidden, o.dx.data()); });
}
void WeightGradient1(benchmark::State& s) {  // dW1 = xᵀ·dg: [256,2048]·[2048,1024]
  Operands& o = operands();
  run(s, o.dw1, o.x.transpose() * o.dg,
      [&] { sgemm_row_major('T', 'N', width, hidden, batch, o.x.data(), width, o.dg.data(), hidden, o.dw1.data()); });
}

void paths_and_threads(benchmark::internal::Benchmark* b) {
  b->ArgNames({"path", "threads"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int threads : {1, 2})
    for (int path : {eigen_serial_zero, team_zero, sgemm_beta0}) b->Args({path, threads});
}
BENCHMARK(Forward1)->Apply(paths_and_threads);
BENCHMARK(Forward2)->Apply(paths_and_threads);
BENCHMARK(InputGradient2)->Apply(paths_and_threads);
BENCHMARK(WeightGradient2)->Apply(paths_and_threads);
BENCHMARK(InputGradient1)->Apply(paths_and_threads);
BENCHMARK(WeightGradient1)->Apply(paths_and_threads);

}  // namespace

BENCHMARK_MAIN();
