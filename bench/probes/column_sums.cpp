// Sums over the rows of a row-major tensor (a bias gradient, sum_cols): remat's detail::assign_column_sums
// (row blocks × 256-column chunks, whole rows read contiguously, partial rows added in block order) beside
// Eigen's colwise().sum() by 32-column blocks (remat's kernel before detail::column_sums) and over the whole
// tensor (bench/probes/README.md). Operands stay in the last-level cache between repetitions.
//
//   build-bench/bench/column_sums --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <remat/remat.hpp>

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
enum Kernel { remat_column_sums, eigen_32_column_blocks, eigen_whole };

void ColumnSums(benchmark::State& state) {
  const auto rows = state.range(0), cols = state.range(1);
  const auto kernel = static_cast<Kernel>(state.range(2));
  remat::set_num_threads(static_cast<int>(state.range(3)));
  const RowMajor g = RowMajor::Random(rows, cols);
  RowMajor sums(1, cols);
  const remat::ConstAlignedMap<float> in(g.data(), rows, cols);
  remat::AlignedMap<float> out(sums.data(), 1, cols);
  for (auto _ : state) {
    switch (kernel) {
      case remat_column_sums:
        remat::detail::assign_column_sums<float>(out, in, false, 1);
        break;
      case eigen_32_column_blocks:
        remat::detail::for_items(remat::detail::above_grain(rows * cols, 1), (cols + 31) / 32, [&](remat::Index b) {
          const remat::Index c0 = 32 * b, n = std::min<remat::Index>(32, cols - c0);
          out.middleCols(c0, n).noalias() = in.middleCols(c0, n).colwise().sum();
        });
        break;
      case eigen_whole:
        out.noalias() = in.colwise().sum();
        break;
    }
    benchmark::DoNotOptimize(sums.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(rows * cols * sizeof(float)) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "cols", "kernel", "threads"})->Unit(benchmark::kMicrosecond)->UseRealTime();
  for (const auto& s : {std::pair<int, int>{2048, 1024}, {2048, 256}, {512, 1024}, {16, 32}})
    for (int threads : {1, 2})
      for (int kernel : {remat_column_sums, eigen_32_column_blocks, eigen_whole})
        b->Args({s.first, s.second, kernel, threads});
}
BENCHMARK(ColumnSums)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
