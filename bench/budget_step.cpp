// One training step of W1, W2 and W3 (bench/README.md; W3 is examples/gpt's model) under a memory budget of 50 % and
// 25 % of the plain step's measured peak, by three means: the tape's runtime budget (Tape::set_memory_budget, Dynamic
// Tensor Rematerialization, Kirisame et al. 2021) with each eviction heuristic; checkpoint_sequential with the segment
// count whose peak is the largest at or below the budget (found with the shapes-only tape, whose figures are the real
// run's); and checkpoint_sequential_auto's plan for the budget (planned once, then run with run_schedule); and the
// plain step without a budget, the reference row. W1's and W2's layers record their Parameters where they use them
// (Model::weight); W3's model records every block's before the chain (gpt::Model), so they stay to the end.
// After timing, one instrumented step reports the measured peak, the ops recomputed (DTR's regenerations + checkpoint
// replays) and their ratio to the step's recorded ops N, and checks the gradients bitwise against the plain step's.
//
//   build/bench/budget_step --benchmark_counters_tabular=true
//   bench/run.sh build-bench 5 budget (bench/suites/budget.sh): the idle-machine run of docs/schedules.md's table
//   and bench/RESULTS.md §4
//
// Do not time it on a busy machine (bench/README.md, Building and running).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <remat/remat.hpp>
#include <remat/schedule/checkpoint_sequential.hpp>
#include <remat/schedule/checkpoint_sequential_auto.hpp>

#include "context.hpp"
#include "gpt/gpt.hpp"
#include "remat_gpt.hpp"
#include "workloads.hpp"

namespace bench {

void set_threads(int threads) {
  remat::set_num_threads(threads);
}

namespace {

using V = remat::Var<float>;
using remat::Parameter;

/// How the chain of layers (W2: blocks) is recorded.
struct Runner {
  enum Kind { plain, sequential, schedule, plan } kind = plain;
  int segments = 1;
  const remat::Schedule* planned = nullptr;
  std::size_t budget = 0;
  remat::AutoScheduleReport* report = nullptr;

  template <class Layers>
  V operator()(const Layers& layers, V x) const {
    switch (kind) {
      case sequential:
        return remat::checkpoint_sequential(layers, segments, x);
      case schedule:
        return remat::run_schedule(layers, *planned, x);
      case plan:
        return remat::checkpoint_sequential_auto(layers, x, budget, report);
      case plain:
        break;
    }
    for (std::size_t l = 0; l < layers.size(); ++l) x = layers[l](x);
    return x;
  }
};

/// W1 (tanh(linear) layers) or W2 (pre-norm MLP blocks) on a tape of the given kind, with Parameters.
template <class W>
class Model {
 public:
  explicit Model(const Data& data, bool shapes = false)
      : data_(data), tape_(shapes ? remat::Tape<float>(remat::shapes_only) : remat::Tape<float>()) {
    for (const Affine& a : data.affine) {
      weight_.emplace_back(a.weight);
      bias_.emplace_back(a.bias);
    }
    for (const Affine& a : data.norm) {
      gain_.emplace_back(a.weight);
      shift_.emplace_back(a.bias);
    }
  }

  remat::Tape<float>& tape() { return tape_; }

  /// One step: zero_grad, record, backward. Returns the number of recorded ops (N).
  std::size_t step(const Runner& run) {
    tape_.clear();
    for (auto* list : {&weight_, &bias_, &gain_, &shift_})
      for (Parameter<float>& p : *list) p.zero_grad();
    V loss = record(run, tape_.constant(data_.x));
    std::size_t ops = 0;
    for (std::int32_t i = 0; i < remat::detail::VarAccess::state(loss)->size(); ++i)
      ops += remat::detail::VarAccess::state(loss)->node(i).is_leaf() ? 0 : 1;
    tape_.backward(loss);
    return ops;
  }

  std::vector<remat::Matrix<float>> gradients() const {
    std::vector<remat::Matrix<float>> g;
    for (const auto* list : {&weight_, &bias_, &gain_, &shift_})
      for (const Parameter<float>& p : *list) g.emplace_back(p.grad());
    return g;
  }

 private:
  // Each layer records its Parameters where it uses them, so the sweep hands each weight gradient to its
  // Parameter as soon as it passes that layer (docs/design.md §2.4). Recorded all before the forward pass,
  // every weight gradient stays on the tape until the backward ends: W1's peak is then its 66.7 MB of weight
  // gradients, which no budget can shrink.
  V weight(std::size_t i) { return tape_.variable(weight_[i]); }
  V bias(std::size_t i) { return tape_.variable(bias_[i]); }
  V gain(std::size_t i) { return tape_.variable(gain_[i]); }
  V shift(std::size_t i) { return tape_.variable(shift_[i]); }

  V record(const Runner& run, V x) {
    if constexpr (is_mlp<W>) {
      auto layer = [this](std::size_t l) {
        return [this, l](V h) { return remat::tanh(remat::linear(h, weight(l), bias(l))); };
      };
      std::vector<decltype(layer(0))> layers;
      for (std::size_t l = 0; l + 1 < weight_.size(); ++l) layers.push_back(layer(l));
      V h = run(layers, x);
      const std::size_t last = weight_.size() - 1;
      return remat::cross_entropy(remat::linear(h, weight(last), bias(last)), data_.labels);
    } else {
      auto block = [this](std::size_t i) {
        return [this, i](V h) {
          V inner = remat::gelu(remat::linear(remat::layer_norm(h, gain(i), shift(i)), weight(2 * i), bias(2 * i)));
          return h + remat::linear(inner, weight(2 * i + 1), bias(2 * i + 1));
        };
      };
      std::vector<decltype(block(0))> blocks;
      for (std::size_t i = 0; i + 1 < gain_.size(); ++i) blocks.push_back(block(i));
      V h = run(blocks, x);
      const std::size_t last = gain_.size() - 1, last_weight = weight_.size() - 1;
      V logits = remat::linear(remat::layer_norm(h, gain(last), shift(last)), weight(last_weight), bias(last_weight));
      return remat::cross_entropy(logits, data_.labels);
    }
  }

  const Data& data_;
  std::vector<Parameter<float>> weight_, bias_, gain_, shift_;
  remat::Tape<float> tape_;
};

/// W3: the GPT of examples/gpt with docs/gpt.md's deterministic parameters, unfused attention, no dropout;
/// its chain is the L blocks (gpt::Model::loss with a block runner), between the embeddings and the head.
template <class W>
class GptModel {
 public:
  explicit GptModel(const GptData& data, bool shapes = false)
      : data_(data),
        model_(gpt::Model<float>::deterministic(gpt_config(W::shape))),
        tape_(shapes ? remat::Tape<float>(remat::shapes_only) : remat::Tape<float>()) {}

  remat::Tape<float>& tape() { return tape_; }

  std::size_t step(const Runner& run) {
    tape_.clear();
    for (Parameter<float>* p : model_.parameters()) p->zero_grad();
    V loss = model_.loss(tape_, data_.ids, data_.targets, gpt::Attention::unfused, run);
    std::size_t ops = 0;
    for (std::int32_t i = 0; i < remat::detail::VarAccess::state(loss)->size(); ++i)
      ops += remat::detail::VarAccess::state(loss)->node(i).is_leaf() ? 0 : 1;
    tape_.backward(loss);
    return ops;
  }

  std::vector<remat::Matrix<float>> gradients() {
    std::vector<remat::Matrix<float>> g;
    for (Parameter<float>* p : model_.parameters()) g.emplace_back(p->grad());
    return g;
  }

 private:
  const GptData& data_;
  gpt::Model<float> model_;
  remat::Tape<float> tape_;
};

template <class W>
using ModelOf = std::conditional_t<is_gpt<W>, GptModel<W>, Model<W>>;
template <class W>
using DataOf = std::decay_t<decltype(make_data(W::shape))>;

template <class W>
Index chain_length() {
  if constexpr (is_mlp<W>)
    return W::shape.layers;
  else
    return W::shape.blocks;
}

/// The plain step's peak and gradients, once per workload and thread count (OpenBLAS's products are
/// bitwise reproducible only at a fixed thread count, docs/design.md §6).
struct Plain {
  std::size_t peak = 0;
  std::vector<remat::Matrix<float>> gradients;
};
template <class W>
const Plain& plain(const DataOf<W>& data, int threads) {
  static std::map<int, Plain> cache;
  auto found = cache.find(threads);
  if (found == cache.end()) {
    ModelOf<W> m(data);
    m.step(Runner{});
    found = cache.emplace(threads, Plain{m.tape().memory().peak_bytes, m.gradients()}).first;
  }
  return found->second;
}

enum class Means { plain, dtr, dtr_eq, local, sequential, planner };
const char* means_name(Means m) {
  switch (m) {
    case Means::plain:
      return "plain";
    case Means::dtr:
      return "dtr_h_DTR";
    case Means::dtr_eq:
      return "dtr_h_DTR_eq";
    case Means::local:
      return "dtr_h_local";
    case Means::sequential:
      return "checkpoint_sequential";
    case Means::planner:
      return "checkpoint_sequential_auto";
  }
  return "?";
}

/// The segment count whose step peak (counted on a shapes-only tape: the real run's figure) is the largest
/// at or below `budget`; 0 if none is.
template <class W>
int segments_for(const DataOf<W>& data, std::size_t budget) {
  int best = 0;
  std::size_t best_peak = 0;
  for (int s = 1; s <= chain_length<W>(); ++s) {
    ModelOf<W> m(data, /*shapes=*/true);
    Runner r;
    r.kind = Runner::sequential;
    r.segments = s;
    m.step(r);
    const std::size_t peak = m.tape().memory().peak_bytes;
    if (peak <= budget && peak > best_peak) {
      best = s;
      best_peak = peak;
    }
  }
  return best;
}

bool bitwise_equal(const std::vector<remat::Matrix<float>>& a, const std::vector<remat::Matrix<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].rows() != b[i].rows() || a[i].cols() != b[i].cols() ||
        std::memcmp(a[i].data(), b[i].data(), std::size_t(a[i].size()) * sizeof(float)) != 0)
      return false;
  return true;
}

template <class W>
void budget_step(benchmark::State& state, Means means, double fraction) {
  const int threads = static_cast<int>(state.range(0));
  set_threads(threads);
  static const DataOf<W> data = make_data(W::shape);
  const Plain& reference = plain<W>(data, threads);
  const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(reference.peak));
  ModelOf<W> model(data);
  Runner run;
  remat::Schedule schedule;
  switch (means) {
    case Means::plain:  // no budget: the reference row
      break;
    case Means::dtr:
    case Means::dtr_eq:
    case Means::local:
      model.tape().set_memory_budget(budget, means == Means::dtr      ? remat::EvictionHeuristic::dtr
                                             : means == Means::dtr_eq ? remat::EvictionHeuristic::dtr_eq
                                                                      : remat::EvictionHeuristic::local);
      break;
    case Means::sequential:
      run.kind = Runner::sequential;
      run.segments = segments_for<W>(data, budget);
      if (run.segments == 0) {
        state.SkipWithError("no segment count of checkpoint_sequential keeps the peak within the budget");
        return;
      }
      break;
    case Means::planner: {
      remat::AutoScheduleReport report;
      Runner probe;
      probe.kind = Runner::plan;
      probe.budget = budget;
      probe.report = &report;
      try {
        model.step(probe);
      } catch (const remat::memory_budget_error& e) {
        state.SkipWithError(e.what());
        return;
      }
      schedule = report.schedule;
      run.kind = Runner::schedule;
      run.planned = &schedule;
      break;
    }
  }
  try {
    model.step(run);  // warm-up: fills the pool
  } catch (const remat::memory_budget_error& e) {
    state.SkipWithError(e.what());
    return;
  }
  for (auto _ : state) model.step(run);
  const std::size_t ops = model.step(run);  // instrumented
  const remat::MemoryStats m = model.tape().memory();
  const double recomputed = static_cast<double>(m.rematerialized_ops + m.replayed_ops);
  state.counters["budget_bytes"] = static_cast<double>(budget);
  state.counters["plain_peak_bytes"] = static_cast<double>(reference.peak);
  state.counters["peak_bytes"] = static_cast<double>(m.peak_bytes);
  state.counters["recomputed_ops"] = recomputed;
  state.counters["N"] = static_cast<double>(ops);
  state.counters["recomputed_per_N"] = recomputed / static_cast<double>(ops);
  state.counters["evictions"] = static_cast<double>(m.evictions);
  if (means == Means::sequential) state.counters["segments"] = run.segments;
  state.SetLabel(means_name(means));
  // DTR's promise is the peak; the schedules bound only their chain (the head and the loss come after it).
  state.counters["within_budget"] = m.peak_bytes <= budget ? 1 : 0;
  const bool dtr = means == Means::dtr || means == Means::dtr_eq || means == Means::local;
  if (dtr && m.peak_bytes > budget) state.SkipWithError("the measured peak exceeds the budget");
  if (!bitwise_equal(model.gradients(), reference.gradients))
    state.SkipWithError("gradients differ from the plain step's");
}

template <class W>
void register_one(const std::string& name, Means means, double fraction) {
  benchmark::RegisterBenchmark(name.c_str(), budget_step<W>, means, fraction)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

template <class W>
void register_workload() {
  register_one<W>(std::string("budget_step/") + W::name + "/plain/budget_none", Means::plain, 1.0);
  for (double fraction : {0.5, 0.25})
    for (Means means : {Means::dtr, Means::dtr_eq, Means::local, Means::sequential, Means::planner})
      register_one<W>(std::string("budget_step/") + W::name + "/" + means_name(means) + "/budget_" +
                          std::to_string(static_cast<int>(std::lround(fraction * 100))) + "pct",
                      means, fraction);
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  bench::add_blas_context();
  bench::register_workload<bench::W1>();
  bench::register_workload<bench::W2>();
  bench::register_workload<bench::W3>();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
