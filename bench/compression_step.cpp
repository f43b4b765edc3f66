// Where compressed residuals pay (docs/compression.md): one training step of W2, W3 and W4 (bench/README.md) with
// each block a checkpoint region under a policy — nothing_saveable, dots_saveable (W3: JAX's
// dots_with_no_batch_dims_saveable), every residual kept in bf16 or in int8 with a scale per 64 elements (W3 also
// int8 with the linear layers' outputs in bf16) — beside the plain step. The argument is the thread count; the
// counters are the tape's saved bytes after the forward pass and the step's peak (MB, 10^6 bytes). The gradient
// error of each format is bench/compression_error's. bench/RESULTS.md §6 has the table; `bench/run.sh build-bench 5
// compression` (bench/suites/compression.sh) runs it.
#include <benchmark/benchmark.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "remat_gpt.hpp"
#include "remat_model.hpp"
#include "resnet/resnet.hpp"
#include "workloads.hpp"

namespace {

using remat::Compression;
namespace policies = remat::policies;

void report(benchmark::State& state, double saved, double peak) {
  state.counters["saved_MB"] = saved / 1e6;
  state.counters["peak_MB"] = peak / 1e6;
}

// ---- W2: each block a region under the policy ----
struct Bf16 {
  static constexpr const char* name = "bf16";
  static Compression get() { return Compression::bf16(); }
};
struct Int8 {
  static constexpr const char* name = "int8_64";
  static Compression get() { return Compression::int8_per_group(64); }
};
template <class Format>
struct EachCompressed {
  static constexpr const char* name = Format::name;
  template <class Layers, class V>
  static V run(const Layers& layers, V h) {
    const auto policy = policies::save_compressed(Format::get(), policies::everything_saveable);
    for (const auto& layer : layers) h = remat::checkpoint(layer, policy)(h);
    return h;
  }
};

template <class Variant>
void w2(benchmark::State& state) {
  remat::set_num_threads(static_cast<int>(state.range(0)));
  const bench::Data data = bench::make_data(bench::W2::shape);
  bench::RematModel<bench::W2, Variant> model(data);
  bench::StepMemory m;
  model.step(&m);  // untimed: the pool's first touch
  for (auto _ : state) benchmark::DoNotOptimize(model.step());
  report(state, m.saved_bytes, m.peak_bytes);
}

// ---- W3 ----
using Policy = std::function<policies::Decision(const remat::OpInfo&)>;

void w3(benchmark::State& state, gpt::Recompute recompute, Policy policy) {
  remat::set_num_threads(static_cast<int>(state.range(0)));
  const bench::GptData data = bench::make_data(bench::W3::shape);
  gpt::Options options;
  options.recompute = recompute;
  options.block_policy = std::move(policy);
  bench::RematGptModel model(data, bench::W3::shape, options);
  bench::StepMemory m;
  model.step(&m);
  for (auto _ : state) benchmark::DoNotOptimize(model.step());
  report(state, m.saved_bytes, m.peak_bytes);
}

// ---- W4: examples/resnet's ResNet-14, width 16, batch 128, conv2d as the example runs it ----
void w4(benchmark::State& state, const std::string& mode) {
  remat::set_num_threads(static_cast<int>(state.range(0)));
  constexpr int batch = 128;
  remat::nn::Generator g(1);
  resnet::ResNet net(16, 2, g);
  const remat::Matrix<float> images =
      remat::Matrix<float>::NullaryExpr(batch, resnet::side * resnet::side, [](remat::Index i, remat::Index j) {
        return std::sin(0.01f * float(i * 784 + j));
      });
  std::vector<int> labels;
  for (int i = 0; i < batch; ++i) labels.push_back(i % resnet::classes);
  remat::Tape<float> tape;
  double saved = 0, peak = 0;
  auto step = [&] {
    tape.clear();
    const resnet::V x = tape.constant(remat::Shape{batch, 1, resnet::side, resnet::side}, images.data());
    const resnet::V loss = remat::cross_entropy(resnet::forward(mode, tape, net, x), labels);
    saved = double(tape.memory().saved_bytes);
    tape.backward(loss);
    peak = double(tape.memory().peak_bytes);
    return loss.item();
  };
  step();  // untimed: oneDNN's plans and the pool's first touch
  for (auto _ : state) benchmark::DoNotOptimize(step());
  report(state, saved, peak);
}

void configure(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK_TEMPLATE(w2, bench::Plain)->Name("W2/plain")->Apply(configure);
BENCHMARK_TEMPLATE(w2, bench::NothingSaveable)->Name("W2/nothing_saveable")->Apply(configure);
BENCHMARK_TEMPLATE(w2, bench::DotsSaveable)->Name("W2/dots_saveable")->Apply(configure);
BENCHMARK_TEMPLATE(w2, EachCompressed<Bf16>)->Name("W2/bf16")->Apply(configure);
BENCHMARK_TEMPLATE(w2, EachCompressed<Int8>)->Name("W2/int8_64")->Apply(configure);

BENCHMARK_CAPTURE(w3, plain, gpt::Recompute::none, nullptr)->Name("W3/plain")->Apply(configure);
BENCHMARK_CAPTURE(w3, block, gpt::Recompute::block, nullptr)->Name("W3/nothing_saveable")->Apply(configure);
BENCHMARK_CAPTURE(w3, dots, gpt::Recompute::dots_no_batch, nullptr)->Name("W3/dots_no_batch")->Apply(configure);
BENCHMARK_CAPTURE(w3, bf16, gpt::Recompute::none, policies::save_compressed(Compression::bf16(), policies::everything_saveable))
    ->Name("W3/bf16")
    ->Apply(configure);
BENCHMARK_CAPTURE(w3, int8, gpt::Recompute::none,
                  policies::save_compressed(Compression::int8_per_group(64), policies::everything_saveable))
    ->Name("W3/int8_64")
    ->Apply(configure);
BENCHMARK_CAPTURE(w3, int8_linear_bf16, gpt::Recompute::none,
                  policies::save_compressed(Compression::bf16(), policies::ops_named({"linear"}),
                                            policies::save_compressed(Compression::int8_per_group(64),
                                                                      policies::everything_saveable)))
    ->Name("W3/int8_64_linear_bf16")
    ->Apply(configure);

BENCHMARK_CAPTURE(w4, plain, std::string("none"))->Name("W4/plain")->Apply(configure);
BENCHMARK_CAPTURE(w4, block, std::string("block"))->Name("W4/nothing_saveable")->Apply(configure);
BENCHMARK_CAPTURE(w4, dots, std::string("dots"))->Name("W4/dots_saveable")->Apply(configure);
BENCHMARK_CAPTURE(w4, bf16, std::string("bf16"))->Name("W4/bf16")->Apply(configure);
BENCHMARK_CAPTURE(w4, int8, std::string("int8"))->Name("W4/int8_64")->Apply(configure);

}  // namespace

BENCHMARK_MAIN();
