// The error contract of compressed residuals (docs/compression.md): for W1–W4 (bench/README.md), one training step's
// parameter gradients with every residual kept compressed, against the same step's exact gradients — the relative
// error ‖g − g₀‖ / ‖g₀‖ over all parameters together and the largest one of a single parameter — with the saved
// bytes after the forward pass and the step's peak, each format beside the exact step. Float, one step from the
// workloads' initial parameters, at 1 thread (OpenBLAS's products round differently at other thread counts, and W3's
// errors move by up to half with them: 4.0e-3 for bf16 at 1 thread, 6.5e-3 at 2); nothing is timed.
//
//   W1  the 16-layer tanh MLP, the 16 hidden layers as one region keeping every residual compressed
//   W2  the 8 pre-norm MLP blocks, each block such a region
//   W3  the GPT (examples/gpt), each block such a region (gpt::Options::block_policy); and int8 with the linear
//       layers' outputs in bf16
//   W4  examples/resnet's ResNet-14 (width 16, batch 128), each basic block such a region
//
//   cmake --build build --target compression_error && build/bench/compression_error
//
// Prints a Markdown table on stdout.
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <remat/remat.hpp>

#include "remat_gpt.hpp"
#include "remat_model.hpp"
#include "resnet/resnet.hpp"
#include "workloads.hpp"

namespace {

using remat::Compression;
using remat::Matrix;

struct Format {
  const char* name;
  Compression compression;
};

const std::vector<Format>& formats() {
  static const std::vector<Format> f{{"bf16", Compression::bf16()},
                                     {"int8/row", Compression::int8_per_row()},
                                     {"int8/128", Compression::int8_per_group(128)},
                                     {"int8/64", Compression::int8_per_group(64)}};
  return f;
}

/// One step's gradients and bytes.
struct Step {
  std::vector<Matrix<float>> grads;
  double saved = 0, peak = 0;
};

void print_row(const char* workload, const char* format, const Step& s, const Step& exact) {
  double diff = 0, norm = 0, worst = 0;
  for (std::size_t i = 0; i < s.grads.size(); ++i) {
    const double d = (s.grads[i] - exact.grads[i]).cast<double>().squaredNorm(),
                 n = exact.grads[i].cast<double>().squaredNorm();
    diff += d;
    norm += n;
    if (n > 0) worst = std::max(worst, std::sqrt(d / n));
  }
  std::printf("| %s | %s | %.2e | %.2e | %.2f | %.2f |\n", workload, format, std::sqrt(diff / norm), worst,
              s.saved / 1e6, s.peak / 1e6);
}

// ---- W1 and W2: the bench models, with a variant that checkpoints as a format says ----
Compression current;  // the format the variants below read (one at a time)

/// W1: all the hidden layers one region keeping every residual compressed.
struct AllCompressed {
  static constexpr const char* name = "compressed";
  template <class Layers, class V>
  static V run(const Layers& layers, V h) {
    auto all = [&layers](V x) {
      for (const auto& layer : layers) x = layer(x);
      return x;
    };
    return remat::checkpoint(all, remat::policies::save_compressed(current, remat::policies::everything_saveable))(h);
  }
};
/// W2: each block such a region.
struct EachCompressed {
  static constexpr const char* name = "compressed";
  template <class Layers, class V>
  static V run(const Layers& layers, V h) {
    const auto policy = remat::policies::save_compressed(current, remat::policies::everything_saveable);
    for (const auto& layer : layers) h = remat::checkpoint(layer, policy)(h);
    return h;
  }
};

std::vector<Matrix<float>> flatten(const bench::Gradients& g) {
  std::vector<Matrix<float>> out;
  for (const auto& a : g.affine) {
    out.push_back(a.weight);
    out.push_back(a.bias);
  }
  for (const auto& a : g.norm) {
    out.push_back(a.weight);
    out.push_back(a.bias);
  }
  return out;
}

template <class Workload, class Variant>
Step bench_step(const bench::Data& data) {
  bench::RematModel<Workload, Variant> model(data);
  bench::StepMemory m;
  model.step(&m);
  return {flatten(model.gradients()), m.saved_bytes, m.peak_bytes};
}

template <class Workload, class Compressed>
void bench_workload() {
  const bench::Data data = bench::make_data(Workload::shape);
  const Step exact = bench_step<Workload, bench::Plain>(data);
  print_row(Workload::name, "exact", exact, exact);
  for (const Format& f : formats()) {
    current = f.compression;
    print_row(Workload::name, f.name, bench_step<Workload, Compressed>(data), exact);
  }
}

// ---- W3 ----
/// `policy`: each block a region under it; null: no region.
Step gpt_step(std::function<remat::policies::Decision(const remat::OpInfo&)> policy) {
  const bench::GptData data = bench::make_data(bench::W3::shape);
  gpt::Options options;
  options.block_policy = std::move(policy);
  bench::RematGptModel model(data, bench::W3::shape, options);
  bench::StepMemory m;
  model.step(&m);
  return {model.parameter_gradients(), m.saved_bytes, m.peak_bytes};
}

// ---- W4 ----
Step resnet_step(const std::string& mode) {
  constexpr int width = 16, blocks = 2, batch = 128;
  remat::nn::Generator g(1);
  resnet::ResNet net(width, blocks, g);
  const Matrix<float> images =
      Matrix<float>::NullaryExpr(batch, resnet::side * resnet::side,
                                 [](remat::Index i, remat::Index j) { return std::sin(0.01f * float(i * 784 + j)); });
  std::vector<int> labels;
  for (int i = 0; i < batch; ++i) labels.push_back(i % resnet::classes);
  remat::Tape<float> tape;
  const resnet::V x = tape.constant(remat::Shape{batch, 1, resnet::side, resnet::side}, images.data());
  const resnet::V loss = remat::cross_entropy(resnet::forward(mode, tape, net, x), labels);
  Step s;
  s.saved = double(tape.memory().saved_bytes);
  tape.backward(loss);
  s.peak = double(tape.memory().peak_bytes);
  std::vector<remat::Parameter<float>*> decayed, other;
  net.parameters(decayed, other);
  for (auto* list : {&decayed, &other})
    for (remat::Parameter<float>* p : *list) s.grads.push_back(p->grad());
  return s;
}

}  // namespace

int main() {
  remat::set_num_threads(1);
  std::printf("| workload | residuals | gradient error (all) | worst parameter | saved MB | peak MB |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  bench_workload<bench::W1, AllCompressed>();
  bench_workload<bench::W2, EachCompressed>();
  const Step gpt_exact = gpt_step(nullptr);
  print_row("W3", "exact", gpt_exact, gpt_exact);
  for (const Format& f : formats())
    print_row("W3", f.name,
              gpt_step(remat::policies::save_compressed(f.compression, remat::policies::everything_saveable)),
              gpt_exact);
  // int8 but the linear layers' outputs (q, k and v in one product, the MLP's input to gelu) in bf16.
  print_row(
      "W3", "int8/64, linear bf16",
      gpt_step(remat::policies::save_compressed(
          Compression::bf16(), remat::policies::ops_named({"linear"}),
          remat::policies::save_compressed(Compression::int8_per_group(64), remat::policies::everything_saveable))),
      gpt_exact);
  const Step resnet_exact = resnet_step("none");
  print_row("W4", "exact", resnet_exact, resnet_exact);
  for (const Format& f : formats()) print_row("W4", f.name, resnet_step(f.name), resnet_exact);
}
