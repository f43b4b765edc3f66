// One training step (forward + loss + all weight gradients) of W0, W1, W1-small, W2 and W3 (bench/README.md),
// crossed with the implementations: remat under each checkpoint variant, hand-written Eigen backprop
// (plain and with manual segment recomputation) and, when built with it, LibTorch. Each benchmark runs
// at 1 and 2 threads, then runs one instrumented step for the memory counters and checks its gradients
// against the hand-written ones (W3, which has no hand-written version: every remat mode bitwise against
// remat's none, LibTorch and fused attention within float32 tolerance, and the saved bytes against
// examples/gpt/memory_formula.hpp), so a fast wrong answer cannot win.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "context.hpp"
#include "hand_written.hpp"
#include "remat_gpt.hpp"
#include "remat_model.hpp"
#include "workloads.hpp"
#ifdef REMAT_BENCH_LIBTORCH
#include "torch_model.hpp"
#endif

namespace bench {

void set_threads(int threads) {
  remat::set_num_threads(threads);  // remat's kernels and OpenBLAS's products
#ifdef REMAT_BENCH_LIBTORCH
  torch_set_threads(threads);
#endif
}

namespace {

template <class W>
using HandModel = std::conditional_t<is_mlp<W>, HandMlp, HandBlocks>;

template <class W>
Index chain_length() {
  static_assert(!is_gpt<W>, "W3 has no chain of hand-written layers");
  if constexpr (is_mlp<W>)
    return W::shape.layers;
  else
    return W::shape.blocks;
}

// ---- implementations: each provides Model<W> with step(), memory() and gradients() ----

/// A remat model class template (`ModelOf<W>`: step(StepMemory*), gradients()) as an implementation.
template <template <class> class ModelOf>
struct RematWith {
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
    ModelOf<W> model;
  };
};
template <class Variant>
struct RematModelOf {
  template <class W>
  using type = RematModel<W, Variant>;
};
/// The recorded step with a checkpoint variant.
template <class Variant>
using Remat = RematWith<RematModelOf<Variant>::template type>;
/// The plain MLP step captured once and replayed (remat::CapturedStep).
using RematCaptured = RematWith<RematCapturedMlp>;

/// W3 under one recompute mode and attention kind (docs/gpt.md).
template <gpt::Recompute R, gpt::Attention A>
struct RematGpt {
  static inline const gpt::Options options{R, A};  // not constexpr: Options holds a std::function
  template <class W>
  struct Model {
    explicit Model(const GptData& data) : model(data, W::shape, options) {}
    float step() { return loss = model.step(); }
    StepMemory memory() {
      StepMemory m;
      loss = model.step(&m);
      return m;
    }
    std::vector<Matrix<float>> parameter_gradients() { return model.parameter_gradients(); }
    RematGptModel model;
    float loss = 0;  // of the last step
  };
};
template <class Impl>
inline constexpr bool is_remat_gpt = false;
template <gpt::Recompute R, gpt::Attention A>
inline constexpr bool is_remat_gpt<RematGpt<R, A>> = true;

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
    explicit Model(const decltype(make_data(W::shape))& data) : model(data, W::shape) {}
    float step() { return loss = model.step(); }
    StepMemory memory() {
      loss = model.step();
      return {-1, -1, -1};  // LibTorch exposes no byte counts for CPU tensors; see the PyTorch peer script
    }
    Gradients gradients() const { return model.gradients(); }
    std::vector<Matrix<float>> parameter_gradients() const { return model.parameter_gradients(); }
    TorchModel model;
    float loss = 0;  // of the last step
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

/// Largest |a − b| / max|b| over tensors of the same shapes (1e30 if the shapes differ), and the index of
/// the tensor where it is.
std::pair<double, std::size_t> relative_error(const std::vector<Matrix<float>>& a,
                                              const std::vector<Matrix<float>>& b) {
  if (a.size() != b.size()) return {1e30, 0};
  std::pair<double, std::size_t> worst{0, 0};
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].rows() != b[i].rows() || a[i].cols() != b[i].cols()) return {1e30, i};
    const double scale = std::max(1e-12, double(b[i].cwiseAbs().maxCoeff()));
    const double error = double((a[i] - b[i]).cwiseAbs().maxCoeff()) / scale;
    if (error > worst.first) worst = {error, i};
  }
  return worst;
}

/// W3's references: remat's none step with unfused and with fused attention at the current thread count
/// (OpenBLAS's split of a product depends on the thread count, so bitwise equality is only asked within
/// one), computed once per thread count and attention kind.
struct GptReference {
  float loss = 0;
  std::vector<Matrix<float>> gradients;
};
template <class W>
const GptReference& gpt_reference(int threads, gpt::Attention attention) {
  static std::map<std::pair<int, gpt::Attention>, GptReference> cache;
  auto found = cache.find({threads, attention});
  if (found == cache.end()) {
    static const GptData data = make_data(W::shape);
    RematGptModel none(data, W::shape, {gpt::Recompute::none, attention});
    GptReference r;
    r.loss = none.step();
    r.gradients = none.parameter_gradients();
    found = cache.emplace(std::pair(threads, attention), std::move(r)).first;
  }
  return found->second;
}

/// What a benchmark's correctness check found: counters to report and, if it failed, why.
struct Check {
  std::map<std::string, double> counters;
  std::string failure;  // empty: passed
};

/// Per benchmark (workload × implementation): the model, built and warmed up once and reused by every
/// repetition and thread count, its memory counters (taken once) and the correctness check (once per
/// thread count). Repetitions then cost only their timed steps.
template <class W, class Impl>
struct Fixture {
  decltype(make_data(W::shape)) data = make_data(W::shape);
  typename Impl::template Model<W> model{data};
  StepMemory memory;
  std::map<int, Check> checks;  // per thread count
  Fixture() {
    model.step();  // warm-up: fills the buffer pools
    memory = model.memory();
  }
};

/// MLPs and W2: the gradients of the last timed step against the hand-written single-thread reference.
template <class W, class Impl>
Check check_against_hand_written(Fixture<W, Impl>& fixture) {
  Check c;
  const double error = gradient_error<W>(fixture.model.gradients());
  c.counters["gradient_error"] = error;
  if (!(error < 1e-3)) c.failure = "gradients differ from the hand-written reference";
  return c;
}

/// W3: the last timed step against remat's none at this thread count. A remat mode must give the loss and
/// gradients of none with the same attention bit for bit (recomputation replays the same kernels on the
/// same inputs) and save exactly the bytes of examples/gpt/memory_formula.hpp. Fused attention (rounded
/// differently) and LibTorch must agree with unfused none within float32 accuracy: the loss to 1e-4
/// relative, every gradient to 1e-2 of its largest entry. Not 1e-3 as for the MLPs: on W3 float32 itself
/// is that far from float64 — remat's float32 gradients differ from its float64 ones by up to 3.2e-3 of
/// the largest entry (block1.ln2_bias), PyTorch's by up to 5.1e-3, and LibTorch's from remat's by 1.9e-3
/// (1 thread) and 3.0e-3 (2 threads): small gain and bias gradients are sums over 2048 rows that cancel.
template <class W, class Impl>
Check check_gpt(Fixture<W, Impl>& fixture, int threads) {
  Check c;
  auto& model = fixture.model;
  const std::vector<Matrix<float>> gradients = model.parameter_gradients();
  const GptReference& unfused = gpt_reference<W>(threads, gpt::Attention::unfused);
  const double loss_error = std::abs(double(model.loss) - double(unfused.loss)) / std::abs(double(unfused.loss));
  const auto [error, worst] = relative_error(gradients, unfused.gradients);
  c.counters["loss_error"] = loss_error;
  c.counters["gradient_error"] = error;
  if (!(loss_error < 1e-4))
    c.failure = "loss " + std::to_string(model.loss) + " differs from remat none's (unfused) " +
                std::to_string(unfused.loss) + " by more than 1e-4 relative";
  if (!(error < 1e-2) && c.failure.empty()) {
    const auto names = gpt::Model<float>(gpt_config(W::shape)).parameter_names();
    c.failure = "gradients differ from remat none (unfused): " + names.at(worst) + " by " + std::to_string(error) +
                " of its largest entry";
  }
  if constexpr (is_remat_gpt<Impl>) {
    const GptReference& none = gpt_reference<W>(threads, Impl::options.attention);
    bool bitwise = model.loss == none.loss && gradients.size() == none.gradients.size();
    for (std::size_t i = 0; bitwise && i < gradients.size(); ++i) bitwise = gradients[i] == none.gradients[i];
    c.counters["bitwise_equal_to_none"] = bitwise;
    if (!bitwise && c.failure.empty()) c.failure = "loss or gradients not bitwise equal to remat none";
    const double formula = gpt_saved_bytes(W::shape, Impl::options);
    c.counters["saved_bytes_formula"] = formula;
    if (fixture.memory.saved_bytes != formula && c.failure.empty())
      c.failure = "saved_bytes " + std::to_string(fixture.memory.saved_bytes) +
                  " differ from examples/gpt/memory_formula.hpp's " + std::to_string(formula);
  }
  return c;
}

/// `perf record --control fifo:F -D -1` records only the timed steps when REMAT_PERF_CONTROL=F is set
/// (bench/probes/profile.sh): setup, warm-up and the gradient checks stay out of the profile.
class PerfWindow {
 public:
  PerfWindow() {
    if (const char* fifo = std::getenv("REMAT_PERF_CONTROL")) control_ = std::fopen(fifo, "w");
    send("enable\n");
  }
  ~PerfWindow() {
    send("disable\n");
    if (control_) std::fclose(control_);
  }
  PerfWindow(const PerfWindow&) = delete;
  PerfWindow& operator=(const PerfWindow&) = delete;

 private:
  void send(const char* command) {
    if (!control_) return;
    std::fputs(command, control_);
    std::fflush(control_);
  }
  std::FILE* control_ = nullptr;
};

template <class W, class Impl>
void Step(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  set_threads(threads);
  static Fixture<W, Impl>* fixture = nullptr;
  if (!fixture) fixture = new Fixture<W, Impl>;  // kept until exit, like the benchmark registry
  auto& model = fixture->model;
  model.step();  // warm-up at this thread count (BLAS thread pool)
  {
    PerfWindow window;
    for (auto _ : state) benchmark::DoNotOptimize(model.step());
  }

  const StepMemory& memory = fixture->memory;
  const double flops = step_flops(W::shape);
  state.counters["flops_per_step"] = flops;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (memory.saved_bytes >= 0) state.counters["saved_bytes"] = memory.saved_bytes;
  if (memory.peak_bytes >= 0) state.counters["peak_bytes"] = memory.peak_bytes;
  if (memory.replayed_bytes >= 0) state.counters["replayed_bytes"] = memory.replayed_bytes;
  // The last timed step, checked once per thread count.
  auto checked = fixture->checks.find(threads);
  if (checked == fixture->checks.end()) {
    Check c;
    if constexpr (is_gpt<W>)
      c = check_gpt(*fixture, threads);
    else
      c = check_against_hand_written(*fixture);
    checked = fixture->checks.emplace(threads, std::move(c)).first;
  }
  for (const auto& [name, value] : checked->second.counters) state.counters[name] = value;
  if (!checked->second.failure.empty()) state.SkipWithError(checked->second.failure.c_str());
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
BENCHMARK_TEMPLATE(Step, W0, RematCaptured)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W1Small, RematCaptured)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W1, RematCaptured)->Apply(configure);
// W3: every recompute mode with unfused attention (softmax of attention_scores, then attention_values),
// and none and block with the fused op, whose backward recomputes the probabilities itself; with LibTorch
// (plain: its C++ API has no checkpointing) when built with it.
using RematNone = RematGpt<gpt::Recompute::none, gpt::Attention::unfused>;
using RematBlock = RematGpt<gpt::Recompute::block, gpt::Attention::unfused>;
using RematAttention = RematGpt<gpt::Recompute::attention, gpt::Attention::unfused>;
using RematDotsNoBatch = RematGpt<gpt::Recompute::dots_no_batch, gpt::Attention::unfused>;
using RematSqrt = RematGpt<gpt::Recompute::sqrt, gpt::Attention::unfused>;
using RematNoneFused = RematGpt<gpt::Recompute::none, gpt::Attention::fused>;
using RematBlockFused = RematGpt<gpt::Recompute::block, gpt::Attention::fused>;
BENCHMARK_TEMPLATE(Step, W3, RematNone)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W3, RematBlock)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W3, RematAttention)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W3, RematDotsNoBatch)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W3, RematSqrt)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W3, RematNoneFused)->Apply(configure);
BENCHMARK_TEMPLATE(Step, W3, RematBlockFused)->Apply(configure);
#ifdef REMAT_BENCH_LIBTORCH
BENCHMARK_TEMPLATE(Step, W3, LibTorch)->Apply(configure);
#endif

BENCH_SEGMENTS(W0);
BENCH_SEGMENTS(W1);
BENCH_SEGMENTS(W2);

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  bench::add_blas_context();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
