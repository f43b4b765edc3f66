// One training step (forward + loss + all weight gradients) of W0, W1, W1-small and W2 (docs/design.md
// §6), crossed with the implementations: remat under each checkpoint variant, hand-written Eigen backprop
// (plain and with manual segment recomputation) and, when built with it, LibTorch. Each benchmark runs
// at 1 and 2 threads, then runs one instrumented step for the memory counters and checks its gradients
// against the hand-written ones, so a fast wrong answer cannot win.
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "hand_written.hpp"
#include "remat_model.hpp"
#include "workloads.hpp"
#ifdef REMAT_BENCH_LIBTORCH
#include "torch_model.hpp"
#endif

#ifdef EIGEN_USE_BLAS
extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_config();
extern "C" char* openblas_get_corename();
#endif

namespace bench {

void set_threads(int threads) {
#ifdef EIGEN_USE_BLAS
  openblas_set_num_threads(threads);
#endif
#ifdef REMAT_BENCH_LIBTORCH
  torch_set_threads(threads);
#endif
}

namespace {

template <class W>
using HandModel = std::conditional_t<is_mlp<W>, HandMlp, HandBlocks>;

template <class W>
Index chain_length() {
  if constexpr (is_mlp<W>)
    return W::shape.layers;
  else
    return W::shape.blocks;
}

// ---- implementations: each provides Model<W> with step(), memory() and gradients() ----

template <class Variant>
struct Remat {
  template <class W>
  struct Model {
    explicit Model(const Data& data) : model(data) {}
    float step() { return model.step(); }
    StepMemory memory() {
      StepMemory m;
      model.step(&m);
      return m;
    }
    Gradients gradients() const { return model.gradients(); }
    RematModel<W, Variant> model;
  };
};

/// Hand-written backprop; Segments > 1: that many segments (0: round(√L)), all but the last recomputed by
/// hand before their backward (PyTorch's checkpoint_sequential semantics).
template <int Segments>
struct HandWrittenImpl {
  template <class W>
  struct Model {
    explicit Model(const Data& data)
        : chain(data, W::shape, Segments == 0 ? sqrt_segments(chain_length<W>()) : Segments) {}
    float step() { return chain.step(); }
    StepMemory memory() {
      chain.step();
      return {double(chain.saved_bytes()), double(chain.peak_bytes()), -1};
    }
    Gradients gradients() const { return chain.gradients(); }
    HandChain<HandModel<W>> chain;
  };
};
using HandWritten = HandWrittenImpl<1>;
using HandWrittenSequential = HandWrittenImpl<0>;
using HandWrittenSegments4 = HandWrittenImpl<4>;

#ifdef REMAT_BENCH_LIBTORCH
struct LibTorch {
  template <class W>
  struct Model {
    explicit Model(const Data& data) : model(data, W::shape) {}
    float step() { return model.step(); }
    StepMemory memory() {
      model.step();
      return {-1, -1, -1};  // LibTorch exposes no byte counts for CPU tensors; see the PyTorch peer script
    }
    Gradients gradients() const { return model.gradients(); }
    TorchModel model;
  };
};
#endif

// ---- the gradient check ----

/// Largest |a − b| / max|b| over every gradient tensor (b: hand-written, single thread, computed once).
template <class W>
double gradient_error(const Gradients& got) {
  static const Data data = make_data(W::shape);
  static const Gradients reference = [] {
    set_threads(1);
    HandChain<HandModel<W>> chain(data, W::shape, 1);
    chain.step();
    return chain.gradients();
  }();
  auto compare = [](const std::vector<Affine>& a, const std::vector<Affine>& b) {
    if (a.size() != b.size()) return 1e30;
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      for (auto [x, y] : {std::pair(&a[i].weight, &b[i].weight), std::pair(&a[i].bias, &b[i].bias)}) {
        if (x->rows() != y->rows() || x->cols() != y->cols()) return 1e30;
        const double scale = std::max(1e-12, double(y->cwiseAbs().maxCoeff()));
        worst = std::max(worst, double((*x - *y).cwiseAbs().maxCoeff()) / scale);
      }
    return worst;
  };
  return std::max(compare(got.affine, reference.affine), compare(got.norm, reference.norm));
}

/// Per benchmark (workload × implementation): the model, built and warmed up once and reused by every
/// repetition and thread count, its memory counters (taken once) and the gradient check (once per thread
/// count). Repetitions then cost only their timed steps.
template <class W, class Impl>
struct Fixture {
  Data data = make_data(W::shape);
  typename Impl::template Model<W> model{data};
  StepMemory memory;
  std::map<int, double> error;  // gradient error per thread count
  Fixture() {
    model.step();  // warm-up: fills the buffer pools
    memory = model.memory();
  }
};

template <class W, class Impl>
void Step(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  set_threads(threads);
  static Fixture<W, Impl>* fixture = nullptr;
  if (!fixture) fixture = new Fixture<W, Impl>;  // kept until exit, like the benchmark registry
  auto& model = fixture->model;
  model.step();  // warm-up at this thread count (BLAS thread pool)
  for (auto _ : state) benchmark::DoNotOptimize(model.step());

  const StepMemory& memory = fixture->memory;
  const double flops = step_flops(W::shape);
  state.counters["flops_per_step"] = flops;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (memory.saved_bytes >= 0) state.counters["saved_bytes"] = memory.saved_bytes;
  if (memory.peak_bytes >= 0) state.counters["peak_bytes"] = memory.peak_bytes;
  if (memory.replayed_bytes >= 0) state.counters["replayed_bytes"] = memory.replayed_bytes;
  // The gradients of the last timed step, checked once per thread count.
  auto checked = fixture->error.find(threads);
  if (checked == fixture->error.end())
    checked = fixture->error.emplace(threads, gradient_error<W>(model.gradients())).first;
  const double error = checked->second;
  state.counters["gradient_error"] = error;
  if (!(error < 1e-3)) state.SkipWithError("gradients differ from the hand-written reference");
}

void configure(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);
}

using RematPlain = Remat<Plain>;
using RematNothingSaveable = Remat<NothingSaveable>;
using RematDotsSaveable = Remat<DotsSaveable>;
using RematEverythingSaveable = Remat<EverythingSaveable>;
using RematSequential = Remat<Sequential>;
using RematSegments4NothingSaveable = Remat<Segments4NothingSaveable>;
using RematSegments4DotsSaveable = Remat<Segments4DotsSaveable>;

/// Multi-layer regions (4 segments), where the policy decides what the replay recomputes; for chains of
/// at least 8 layers, so each segment holds several.
#define BENCH_SEGMENTS(W)                                                       \
  BENCHMARK_TEMPLATE(Step, W, HandWrittenSegments4)->Apply(configure);          \
  BENCHMARK_TEMPLATE(Step, W, RematSegments4NothingSaveable)->Apply(configure); \
  BENCHMARK_TEMPLATE(Step, W, RematSegments4DotsSaveable)->Apply(configure)

#ifdef REMAT_BENCH_LIBTORCH
#define BENCH_WORKLOAD(W)                                                 \
  BENCHMARK_TEMPLATE(Step, W, HandWritten)->Apply(configure);             \
  BENCHMARK_TEMPLATE(Step, W, LibTorch)->Apply(configure);                \
  BENCHMARK_TEMPLATE(Step, W, RematPlain)->Apply(configure);              \
  BENCHMARK_TEMPLATE(Step, W, RematNothingSaveable)->Apply(configure);    \
  BENCHMARK_TEMPLATE(Step, W, RematDotsSaveable)->Apply(configure);       \
  BENCHMARK_TEMPLATE(Step, W, RematEverythingSaveable)->Apply(configure); \
  BENCHMARK_TEMPLATE(Step, W, HandWrittenSequential)->Apply(configure);   \
  BENCHMARK_TEMPLATE(Step, W, RematSequential)->Apply(configure)
#else
#define BENCH_WORKLOAD(W)                                                 \
  BENCHMARK_TEMPLATE(Step, W, HandWritten)->Apply(configure);             \
  BENCHMARK_TEMPLATE(Step, W, RematPlain)->Apply(configure);              \
  BENCHMARK_TEMPLATE(Step, W, RematNothingSaveable)->Apply(configure);    \
  BENCHMARK_TEMPLATE(Step, W, RematDotsSaveable)->Apply(configure);       \
  BENCHMARK_TEMPLATE(Step, W, RematEverythingSaveable)->Apply(configure); \
  BENCHMARK_TEMPLATE(Step, W, HandWrittenSequential)->Apply(configure);   \
  BENCHMARK_TEMPLATE(Step, W, RematSequential)->Apply(configure)
#endif

BENCH_WORKLOAD(W0);
BENCH_WORKLOAD(W1Small);
BENCH_WORKLOAD(W1);
BENCH_WORKLOAD(W2);
BENCH_SEGMENTS(W0);
BENCH_SEGMENTS(W1);
BENCH_SEGMENTS(W2);

/// The shared library that provides `symbol` in this process (which BLAS really runs).
std::string library_of(const char* symbol) {
  void* address = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info;
  if (!address || !dladdr(address, &info) || !info.dli_fname) return "not found";
  return info.dli_fname;
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "(unset)";
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using bench::environment;
  benchmark::AddCustomContext("sgemm_ from", bench::library_of("sgemm_"));
#ifdef EIGEN_USE_BLAS
  benchmark::AddCustomContext("openblas", std::string(openblas_get_config()) + " core " + openblas_get_corename());
#else
  benchmark::AddCustomContext("openblas", "not used (Eigen's own GEMM)");
#endif
  for (const char* name : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "GLIBC_TUNABLES", "OMP_WAIT_POLICY"})
    benchmark::AddCustomContext(name, environment(name));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
