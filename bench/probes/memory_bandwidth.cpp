// What a second thread adds to a kernel that streams W2's [2048,1024] float32 tensors, with the operands in
// the last-level cache (warm: one set of three 8 MiB tensors, 24 MiB) or in DRAM (cold: each iteration takes
// the next of 8 sets, 192 MiB in all, so its operands were evicted since it last ran). Two kernels, both on
// remat's team and row-block partition (detail::for_row_blocks, as remat's elementwise ops run):
//   triad         d = a + ½ b                         (12 bytes moved per element, 2 FLOPs)
//   gelu_backward d = g ⊙ gelu'(x), remat's formula   (GeluOp's tanh_term and derivative: about 20 FLOPs)
//   gelu_backward_in_place   the same, written over g    (what a gradient written in place would cost)
// The questions it answers (bench/probes/README.md): how far can W2's non-GEMM work, which streams such tensors,
// scale from 1 to 2 threads on this machine at all, and what would writing a gradient into dL/dy's buffer
// save (no fresh 8 MiB destination for the caches to fetch before writing it)? The program flushes subnormals
// (remat::set_flush_denormal): in place, g shrinks by gelu'(x) ≈ 0.6 each time its set comes round.
//
//   build-bench/bench/memory_bandwidth --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>

#include <remat/remat.hpp>
#include <vector>

namespace {

using Flat = Eigen::Array<float, Eigen::Dynamic, 1>;
constexpr remat::Index rows = 2048, cols = 1024, elements = rows * cols;
enum Kernel { triad, gelu_backward, gelu_backward_in_place };
enum Residence { warm, cold };

/// Three tensors: two read, one written.
struct Operands {
  std::vector<float> a, b, d;
  Operands() : a(elements, 0.25f), b(elements, -0.5f), d(elements, 0.0f) {}
};

void run_kernel(Kernel kernel, Operands& o) {
  using Gelu = remat::detail::GeluOp;
  const double cost = kernel == triad ? 1 : Gelu::flops_per_element;
  remat::detail::for_row_blocks(rows, cols, cost, [&](remat::Index r0, remat::Index n) {
    if (kernel == triad) {
      const Eigen::Map<const Flat> a(o.a.data() + r0 * cols, n * cols), b(o.b.data() + r0 * cols, n * cols);
      Eigen::Map<Flat>(o.d.data() + r0 * cols, n * cols) = a + 0.5f * b;
      return;
    }
    alignas(64) float t_buffer[Gelu::chunk];  // chunk by chunk, as GeluOp::backward
    for (remat::Index e0 = r0 * cols, end = (r0 + n) * cols; e0 < end; e0 += Gelu::chunk) {
      const remat::Index m = std::min(Gelu::chunk, end - e0);
      const Eigen::Map<const Flat> x(o.a.data() + e0, m), g(o.b.data() + e0, m);
      Eigen::Map<Flat> t(t_buffer, m);
      t = Gelu::tanh_term(x);
      float* out = (kernel == gelu_backward_in_place ? o.b.data() : o.d.data()) + e0;
      Eigen::Map<Flat>(out, m) = Gelu::derivative(x, t, g);
    }
  });
}

void Streaming(benchmark::State& state) {
  const auto kernel = static_cast<Kernel>(state.range(0));
  const auto residence = static_cast<Residence>(state.range(1));
  remat::set_num_threads(static_cast<int>(state.range(2)));
  remat::set_flush_denormal(true);
  std::vector<Operands> sets(residence == warm ? 1 : 8);
  std::size_t next = 0;
  for (auto _ : state) {
    run_kernel(kernel, sets[next]);
    benchmark::DoNotOptimize(sets[next].d.data());
    benchmark::ClobberMemory();
    next = (next + 1) % sets.size();
  }
  state.counters["GB/s"] =
      benchmark::Counter(3.0 * elements * sizeof(float) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void arguments(benchmark::internal::Benchmark* b) {
  b->ArgNames({"kernel", "cold", "threads"})->Unit(benchmark::kMicrosecond)->UseRealTime();
  for (int kernel : {triad, gelu_backward, gelu_backward_in_place})
    for (int residence : {warm, cold})
      for (int threads : {1, 2}) b->Args({kernel, residence, threads});
}
BENCHMARK(Streaming)->Apply(arguments);

}  // namespace

BENCHMARK_MAIN();
