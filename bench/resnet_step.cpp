// W4: one training step (forward, mean cross-entropy, backward) of examples/resnet's ResNet-14 (width 16, batch
// 128, 28×28 images), in remat under each checkpoint mode of the example, with conv2d on oneDNN and on im2col,
// beside LibTorch's same model (bench/torch_resnet.cpp, when built with LibTorch). PyTorch's rows come from
// bench/peers/resnet_step.py. Each benchmark's argument is the thread count; the counters give remat's saved
// bytes after the forward pass and the step's peak (MB, 10^6 bytes). bench/RESULTS.md §23 has the command.
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include "resnet/resnet.hpp"
#ifdef REMAT_BENCH_LIBTORCH
#include "torch_resnet.hpp"
#endif

namespace {

constexpr int width = 16, blocks = 2, batch = 128;

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

void remat_step(benchmark::State& state, const std::string& checkpoint, bool onednn) {
  remat::set_num_threads(static_cast<int>(state.range(0)));
  remat::backends::onednn::set_enabled(onednn);
  remat::nn::Generator g(1);
  resnet::ResNet net(width, blocks, g);
  const Batch data;
  remat::Tape<float> tape;
  std::size_t saved = 0, peak = 0;
  for (auto _ : state) {
    tape.clear();
    const resnet::V x = tape.constant(remat::Shape{batch, 1, resnet::side, resnet::side}, data.images.data());
    const resnet::V loss = remat::cross_entropy(resnet::forward(checkpoint, tape, net, x), data.labels);
    saved = tape.memory().saved_bytes;
    tape.backward(loss);
    peak = tape.memory().peak_bytes;
    benchmark::DoNotOptimize(loss.item());
  }
  state.counters["saved_MB"] = double(saved) / 1e6;
  state.counters["peak_MB"] = double(peak) / 1e6;
  remat::backends::onednn::set_enabled(remat::backends::onednn::is_available());
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

#ifdef REMAT_BENCH_LIBTORCH
namespace {
void libtorch_step(benchmark::State& state) {
  bench::TorchResNet::set_threads(static_cast<int>(state.range(0)));
  bench::TorchResNet net(width, blocks, batch);
  for (auto _ : state) benchmark::DoNotOptimize(net.step());
}
}  // namespace
BENCHMARK(libtorch_step)->Apply(configure);
#endif

BENCHMARK_MAIN();
