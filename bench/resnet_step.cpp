// W4: one training step (forward, mean cross-entropy, backward) of examples/resnet's ResNet-14 (width 16, batch
// 128, 28×28 images), in remat under each checkpoint mode of the example, with conv2d on oneDNN and on im2col,
// beside LibTorch's same model (bench/torch_resnet.cpp, when built with LibTorch). PyTorch's rows come from
// bench/peers/resnet_step.py. And the same step of a ResNet-104 (17 blocks per stage; the `deep` rows) in every
// mode and under DTR's memory budget at 50 % and 25 % of its plain peak: the literature's depth, measured. Each
// benchmark's argument is the thread count; the counters give remat's saved bytes after the forward pass and the
// step's peak (MB, 10^6 bytes), and the budget rows the budget. bench/RESULTS.md §3 has the table; `bench/run.sh
// build-bench 5 resnet` (bench/suites/resnet.sh) runs it.
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include "resnet/resnet.hpp"
#ifdef REMAT_BENCH_LIBTORCH
#include "torch_resnet.hpp"
#endif

namespace {

constexpr int width = 16, blocks = 2, deep_blocks = 17, batch = 128;

/// A fixed batch: images of a smooth pattern (their values do not change the time) and labels 0–9.
struct Batch {
  remat::Matrix<float> images = remat::Matrix<float>::NullaryExpr(
      batch, resnet::side* resnet::side,
      [](remat::Index i, remat::Index j) { return std::sin(0.01f * float(i * 784 + j)); });
  std::vector<int> labels;
  Batch() {
    for (int i = 0; i < batch; ++i) labels.push_back(i % resnet::classes);
  }
};

/// One training step of ResNet-(6·blocks + 2) on `tape` under `checkpoint`; returns the loss.
resnet::V record_step(remat::Tape<float>& tape, resnet::ResNet& net, const Batch& data, const std::string& checkpoint) {
  const resnet::V x = tape.constant(remat::Shape{batch, 1, resnet::side, resnet::side}, data.images.data());
  return remat::cross_entropy(resnet::forward(checkpoint, tape, net, x), data.labels);
}

/// `budget_fraction` > 0: no checkpoint, a memory budget of that fraction of the plain step's peak (estimated).
void run_steps(benchmark::State& state, int depth_blocks, const std::string& checkpoint, bool onednn,
               double budget_fraction) {
  remat::set_num_threads(static_cast<int>(state.range(0)));
  remat::backends::onednn::set_enabled(onednn);
  remat::nn::Generator g(1);
  resnet::ResNet net(width, depth_blocks, g);
  const Batch data;
  remat::Tape<float> tape;
  std::size_t budget = 0;
  if (budget_fraction > 0) {
    const remat::MemoryEstimate plain =
        remat::estimate_memory<float>([&](remat::Tape<float>& t) { return record_step(t, net, data, "none"); });
    budget = static_cast<std::size_t>(budget_fraction * double(plain.peak_bytes));
    tape.set_memory_budget(budget);
  }
  std::size_t saved = 0, peak = 0;
  {  // one untimed step: oneDNN's plans and the first touch of the pool's pages are set-up, not the step
    const resnet::V loss = record_step(tape, net, data, checkpoint);
    tape.backward(loss);
  }
  for (auto _ : state) {
    tape.clear();
    const resnet::V loss = record_step(tape, net, data, checkpoint);
    saved = tape.memory().saved_bytes;
    tape.backward(loss);
    peak = tape.memory().peak_bytes;
    benchmark::DoNotOptimize(loss.item());
  }
  state.counters["saved_MB"] = double(saved) / 1e6;
  state.counters["peak_MB"] = double(peak) / 1e6;
  if (budget) state.counters["budget_MB"] = double(budget) / 1e6;
  remat::backends::onednn::set_enabled(remat::backends::onednn::is_available());
}

void remat_step(benchmark::State& state, const std::string& checkpoint, bool onednn) {
  run_steps(state, blocks, checkpoint, onednn, 0);
}

void deep_step(benchmark::State& state, const std::string& checkpoint, double budget_fraction) {
  run_steps(state, deep_blocks, checkpoint, true, budget_fraction);
}

void configure(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MeasureProcessCPUTime();
}

}  // namespace

BENCHMARK_CAPTURE(remat_step, none, std::string("none"), true)->Apply(configure);
BENCHMARK_CAPTURE(remat_step, block, std::string("block"), true)->Apply(configure);
BENCHMARK_CAPTURE(remat_step, dots, std::string("dots"), true)->Apply(configure);
BENCHMARK_CAPTURE(remat_step, sqrt, std::string("sqrt"), true)->Apply(configure);
BENCHMARK_CAPTURE(remat_step, none_im2col, std::string("none"), false)->Apply(configure);
BENCHMARK_CAPTURE(deep_step, none, std::string("none"), 0.0)->Apply(configure);
BENCHMARK_CAPTURE(deep_step, block, std::string("block"), 0.0)->Apply(configure);
BENCHMARK_CAPTURE(deep_step, dots, std::string("dots"), 0.0)->Apply(configure);
BENCHMARK_CAPTURE(deep_step, sqrt, std::string("sqrt"), 0.0)->Apply(configure);
BENCHMARK_CAPTURE(deep_step, budget50, std::string("none"), 0.5)->Apply(configure);
BENCHMARK_CAPTURE(deep_step, budget25, std::string("none"), 0.25)->Apply(configure);

#ifdef REMAT_BENCH_LIBTORCH
namespace {
void libtorch_step(benchmark::State& state) {
  bench::TorchResNet::set_threads(static_cast<int>(state.range(0)));
  bench::TorchResNet net(width, blocks, batch);
  net.step();  // untimed, as remat's first step
  for (auto _ : state) benchmark::DoNotOptimize(net.step());
}
}  // namespace
BENCHMARK(libtorch_step)->Apply(configure);
#endif

BENCHMARK_MAIN();
