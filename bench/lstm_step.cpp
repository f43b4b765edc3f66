// One training step of W5, an unrolled LSTM (bench/workloads.hpp; issue 44), plain and under a memory budget:
// the tape's runtime budget (Tape::set_memory_budget, Dynamic Tensor Rematerialization, Kirisame et al. 2021) at
// 50 % and 35 % of the plain step's measured peak with each eviction heuristic; one checkpoint per timestep (the
// cell as a checkpointed function of (x_t, h, c) returning the tuple (h, c), nothing saved); and
// checkpoint_sequential_auto's plan for the budget, its layers mapping the state (h, c) to (h, c). After timing, one
// instrumented step reports the measured peak, the ops recomputed and evictions, and checks the gradients
// bitwise against the plain step's. Every variant records the Parameters where each timestep uses them (the
// sweep hands a weight's gradient to its Parameter as it passes that timestep, docs/design.md §2.4) and the
// inputs x_t before the first timestep (they are the step's data, as PyTorch's input tensor).
//
//   build/bench/lstm_step --benchmark_counters_tabular=true          (Google Benchmark)
//   build/bench/lstm_step --count <W5|W5-large> <means> <fraction> <steps>
//     runs `steps` steps after a warm-up and prints the instrumented figures: for instruction counts under
//     `valgrind --tool=callgrind` (bench/probes/lstm_instructions.sh), which a busy machine does not distort.
//   bench/run.sh build-bench 5 lstm (bench/suites/lstm.sh): the idle-machine run of bench/RESULTS.md §5
//
// Do not time it on a busy machine (bench/README.md, Building and running).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <remat/remat.hpp>
#include <remat/schedule/checkpoint_sequential_auto.hpp>

#include "context.hpp"
#include "workloads.hpp"

namespace bench {

void set_threads(int threads) {
  remat::set_num_threads(threads);
}

namespace {

using V = remat::Var<float>;
using remat::Parameter;

enum class Means { plain, per_step, dtr, dtr_eq, local, planner };
const char* means_name(Means m) {
  switch (m) {
    case Means::plain:
      return "plain";
    case Means::per_step:
      return "checkpoint_per_step";
    case Means::dtr:
      return "dtr_h_DTR";
    case Means::dtr_eq:
      return "dtr_h_DTR_eq";
    case Means::local:
      return "dtr_h_local";
    case Means::planner:
      return "checkpoint_sequential_auto";
  }
  return "?";
}

/// How the timesteps are recorded.
struct Runner {
  enum Kind { plain, per_step, schedule, plan } kind = plain;
  const remat::Schedule* planned = nullptr;
  std::size_t budget = 0;
  remat::AutoScheduleReport* report = nullptr;
};

/// W5 on a tape, with Parameters.
template <class W>
class Lstm {
 public:
  explicit Lstm(const LstmData& data)
      : data_(data),
        w_ih_(data.w_ih),
        w_hh_(data.w_hh),
        bias_(data.bias),
        w_out_(data.head.weight),
        b_out_(data.head.bias) {}

  remat::Tape<float>& tape() { return tape_; }

  /// One step: zero_grad, record, backward. Returns the number of recorded ops (N).
  std::size_t step(const Runner& run) {
    tape_.clear();
    for (Parameter<float>* p : parameters()) p->zero_grad();
    V loss = record(run);
    std::size_t ops = 0;
    for (std::int32_t i = 0; i < remat::detail::VarAccess::state(loss)->size(); ++i)
      ops += remat::detail::VarAccess::state(loss)->node(i).is_leaf() ? 0 : 1;
    forward_ = tape_.memory();
    tape_.backward(loss);
    return ops;
  }
  /// memory() after the last step's forward pass.
  const remat::MemoryStats& forward_memory() const { return forward_; }

  std::vector<remat::Matrix<float>> gradients() {
    std::vector<remat::Matrix<float>> g;
    for (Parameter<float>* p : parameters()) g.emplace_back(p->grad());
    return g;
  }

 private:
  static constexpr Index hidden = W::shape.hidden;

  std::vector<Parameter<float>*> parameters() { return {&w_ih_, &w_hh_, &bias_, &w_out_, &b_out_}; }

  /// One timestep of the standard cell; the weights recorded where it uses them.
  std::tuple<V, V> cell(const V& x, const V& h, const V& c) {
    V gates = remat::linear(x, tape_.variable(w_ih_), tape_.variable(bias_)) + remat::matmul(h, tape_.variable(w_hh_));
    V i = remat::sigmoid(remat::slice_cols(gates, 0, hidden));
    V f = remat::sigmoid(remat::slice_cols(gates, hidden, hidden));
    V g = remat::tanh(remat::slice_cols(gates, 2 * hidden, hidden));
    V o = remat::sigmoid(remat::slice_cols(gates, 3 * hidden, hidden));
    V c_next = f * c + i * g;
    return {o * remat::tanh(c_next), c_next};
  }

  V record(const Runner& run) {
    std::vector<V> x;
    for (const auto& m : data_.x) x.push_back(tape_.constant(m));
    const Index batch = W::shape.batch;
    V h = tape_.constant(remat::Matrix<float>::Zero(batch, hidden)), c = h;
    if (run.kind == Runner::plain || run.kind == Runner::per_step) {
      for (std::size_t t = 0; t < x.size(); ++t) {
        if (run.kind == Runner::plain)
          std::tie(h, c) = cell(x[t], h, c);
        else
          std::tie(h, c) = remat::checkpoint([this](V xt, V ht, V ct) { return cell(xt, ht, ct); })(x[t], h, c);
        x[t] = {};  // the backward's read keeps it
      }
    } else {
      // The schedules' layers map the state (h, c) to (h, c).
      auto layer = [&](std::size_t t) { return [this, &x, t](V ht, V ct) { return cell(x[t], ht, ct); }; };
      std::vector<decltype(layer(0))> layers;
      for (std::size_t t = 0; t < x.size(); ++t) layers.push_back(layer(t));
      std::tuple<V, V> s{h, c};
      h = c = {};
      s = run.kind == Runner::schedule
              ? remat::run_schedule(layers, *run.planned, std::move(s))
              : remat::checkpoint_sequential_auto(layers, std::move(s), run.budget, run.report);
      x.clear();
      std::tie(h, c) = s;
    }
    c = {};
    return remat::cross_entropy(remat::linear(h, tape_.variable(w_out_), tape_.variable(b_out_)), data_.labels);
  }

  const LstmData& data_;
  Parameter<float> w_ih_, w_hh_, bias_, w_out_, b_out_;
  remat::Tape<float> tape_;
  remat::MemoryStats forward_;
};

/// The plain step's peak and gradients, once per workload and thread count (OpenBLAS's products are bitwise
/// reproducible only at a fixed thread count, docs/design.md §6).
struct Plain {
  std::size_t peak = 0;
  std::vector<remat::Matrix<float>> gradients;
};
template <class W>
const Plain& plain(const LstmData& data, int threads) {
  static std::map<int, Plain> cache;
  auto found = cache.find(threads);
  if (found == cache.end()) {
    Lstm<W> m(data);
    m.step(Runner{});
    found = cache.emplace(threads, Plain{m.tape().memory().peak_bytes, m.gradients()}).first;
  }
  return found->second;
}

bool bitwise_equal(const std::vector<remat::Matrix<float>>& a, const std::vector<remat::Matrix<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].rows() != b[i].rows() || a[i].cols() != b[i].cols() ||
        std::memcmp(a[i].data(), b[i].data(), std::size_t(a[i].size()) * sizeof(float)) != 0)
      return false;
  return true;
}

/// A model set up for `means` at `fraction` of the plain peak: the budget set, or the planner's schedule planned.
/// Returns an error message, empty if none.
template <class W>
std::string set_up(Lstm<W>& model, Means means, std::size_t budget, Runner& run, remat::Schedule& schedule) {
  switch (means) {
    case Means::plain:
      break;
    case Means::per_step:
      run.kind = Runner::per_step;
      break;
    case Means::dtr:
    case Means::dtr_eq:
    case Means::local:
      model.tape().set_memory_budget(budget, means == Means::dtr      ? remat::EvictionHeuristic::dtr
                                             : means == Means::dtr_eq ? remat::EvictionHeuristic::dtr_eq
                                                                      : remat::EvictionHeuristic::local);
      break;
    case Means::planner: {
      remat::AutoScheduleReport report;
      Runner probe;
      probe.kind = Runner::plan;
      probe.budget = budget;
      probe.report = &report;
      try {
        model.step(probe);
      } catch (const remat::domain_error& e) {  // memory_budget_error, or more layers than plan_schedule takes
        return e.what();
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
    return e.what();
  }
  return {};
}

template <class W>
void lstm_step(benchmark::State& state, Means means, double fraction) {
  const int threads = static_cast<int>(state.range(0));
  set_threads(threads);
  static const LstmData data = make_data(W::shape);
  const Plain& reference = plain<W>(data, threads);
  const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(reference.peak));
  Lstm<W> model(data);
  Runner run;
  remat::Schedule schedule;
  const std::string error = set_up(model, means, budget, run, schedule);
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  for (auto _ : state) model.step(run);
  const std::size_t ops = model.step(run);  // instrumented
  const remat::MemoryStats m = model.tape().memory();
  const double recomputed = static_cast<double>(m.rematerialized_ops + m.replayed_ops);
  state.counters["budget_bytes"] = means == Means::plain || means == Means::per_step ? 0 : static_cast<double>(budget);
  state.counters["plain_peak_bytes"] = static_cast<double>(reference.peak);
  state.counters["peak_bytes"] = static_cast<double>(m.peak_bytes);
  state.counters["recomputed_ops"] = recomputed;
  state.counters["N"] = static_cast<double>(ops);
  state.counters["recomputed_per_N"] = recomputed / static_cast<double>(ops);
  state.counters["recomputed_flops"] = m.rematerialized_flops + m.replayed_flops;
  state.counters["evictions"] = static_cast<double>(m.evictions);
  state.counters["within_budget"] = m.peak_bytes <= budget ? 1 : 0;
  state.counters["flops_per_step"] = step_flops(W::shape);
  state.SetLabel(means_name(means));
  const bool dtr = means == Means::dtr || means == Means::dtr_eq || means == Means::local;
  if (dtr && m.peak_bytes > budget) state.SkipWithError("the measured peak exceeds the budget");
  if (!bitwise_equal(model.gradients(), reference.gradients))
    state.SkipWithError("gradients differ from the plain step's");
}

template <class W>
void register_one(const std::string& means_text, const std::string& budget_text, Means means, double fraction) {
  const std::string name = std::string("budget_step/") + W::name + "/" + means_text + "/budget_" + budget_text;
  benchmark::RegisterBenchmark(name.c_str(), lstm_step<W>, means, fraction)
      ->ArgName("threads")
      ->Arg(1)
      ->Arg(2)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

template <class W>
void register_workload() {
  register_one<W>("plain", "none", Means::plain, 1.0);
  register_one<W>("checkpoint_per_step", "none", Means::per_step, 1.0);
  for (double fraction : {0.5, 0.35})
    for (Means means : {Means::dtr, Means::dtr_eq, Means::local, Means::planner})
      register_one<W>(means_name(means), std::to_string(static_cast<int>(std::lround(fraction * 100))) + "pct", means,
                      fraction);
}

/// The forward pass's GEMM FLOPs (the two gate products per timestep and the head's): recomputed FLOPs are
/// reported as a multiple of it.
double forward_gemm_flops(const LstmShape& s) {
  return double(s.steps) * 2.0 * double(s.batch) * double(s.input + s.hidden) * double(4 * s.hidden) +
         2.0 * double(s.batch) * double(s.hidden) * double(s.classes);
}

/// --count: `steps` instrumented steps after the warm-up, one thread, no Google Benchmark.
template <class W>
int count(const std::string& means_text, double fraction, long steps) {
  set_threads(1);
  const LstmData data = make_data(W::shape);
  const Plain& reference = plain<W>(data, 1);
  const auto budget = static_cast<std::size_t>(fraction * static_cast<double>(reference.peak));
  Means means = Means::plain;
  bool known = false;
  for (Means m : {Means::plain, Means::per_step, Means::dtr, Means::dtr_eq, Means::local, Means::planner})
    if (means_text == means_name(m)) {
      means = m;
      known = true;
    }
  if (!known) {
    std::fprintf(stderr, "lstm_step --count: unknown means %s\n", means_text.c_str());
    return 2;
  }
  Lstm<W> model(data);
  Runner run;
  remat::Schedule schedule;
  const auto start = std::chrono::steady_clock::now();
  const std::string error = set_up(model, means, budget, run, schedule);
  if (!error.empty()) {
    std::printf("%s %s %.2f: %s\n", W::name, means_text.c_str(), fraction, error.c_str());
    return 1;
  }
  std::size_t ops = 0;
  for (long s = 0; s < steps; ++s) ops = model.step(run);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const remat::MemoryStats m = model.tape().memory();
  std::printf(
      "%s %s budget %.2f (%zu B of plain peak %zu B): peak %zu B, N %zu, recomputed %zu (regenerated %zu, replayed "
      "%zu) = %.2f N, %.3f forward GEMM-FLOPs, evictions %zu (forward pass: %zu evictions, %zu regenerated), gradients "
      "%s, %ld steps + warm-up in %.2f s\n",
      W::name, means_text.c_str(), fraction, budget, reference.peak, m.peak_bytes, ops,
      m.rematerialized_ops + m.replayed_ops, m.rematerialized_ops, m.replayed_ops,
      static_cast<double>(m.rematerialized_ops + m.replayed_ops) / static_cast<double>(ops),
      (m.rematerialized_flops + m.replayed_flops) / forward_gemm_flops(W::shape), m.evictions,
      model.forward_memory().evictions, model.forward_memory().rematerialized_ops,
      bitwise_equal(model.gradients(), reference.gradients) ? "bitwise equal" : "DIFFER", steps, seconds);
  return 0;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--count") == 0) {
    if (argc != 6) {
      std::fprintf(stderr, "usage: lstm_step --count <W5|W5-large> <means> <fraction> <steps>\n");
      return 2;
    }
    const std::string workload = argv[2];
    const double fraction = std::atof(argv[4]);
    const long steps = std::atol(argv[5]);
    if (workload == "W5") return bench::count<bench::W5>(argv[3], fraction, steps);
    if (workload == "W5-large") return bench::count<bench::W5Large>(argv[3], fraction, steps);
    std::fprintf(stderr, "lstm_step --count: workload must be W5 or W5-large, got %s\n", workload.c_str());
    return 2;
  }
  bench::add_blas_context();
  bench::register_workload<bench::W5>();
  bench::register_workload<bench::W5Large>();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
