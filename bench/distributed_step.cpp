// W1's training step (bench/README.md: 784 → 16 × 1024 tanh → 10, float32) data-parallel over MPI ranks:
// a global batch of 512 rows split into contiguous shards, each rank's step = forward + backward on its
// shard + the all-reduce of the gradients (remat::distributed::GradientReducer, buckets overlapped with the
// backward sweep), and nothing else (no optimizer). Run it under mpirun with 1 or more ranks
// (bench/suites/distributed.sh does, on an idle machine, for bench/RESULTS.md §9):
//
//   mpirun -np 2 --bind-to core --map-by core build-bench/bench/distributed_step --threads 1
//
// Flags (before Google Benchmark's own): --threads T (remat's kernels and OpenBLAS, per rank), --repetitions R
// (default 10), --steps K (timed steps per repetition, default 5), --bucket-mib M (default 25, DDP's).
// A repetition's time is the mean of its K steps; a step's time is the slowest rank's (max over ranks, taken
// after the step). Google Benchmark reports the median and the interquartile range ("iqr") over the
// repetitions, and the overlap counters of the reducer's StepTiming summed over each repetition's steps:
// hidden_fraction (all-reduce busy time before backward ended / busy time), exposed_wait_ms (finish() end −
// backward end), backward_ms, busy_ms, resolution_ms (the widest window in which a completion was seen),
// bytes_per_step, buckets. With one rank the reducer still runs (a one-rank all-reduce is a copy): the
// benchmark ".../reducer" measures what it costs, and ".../plain" is the same step without a reducer.
// Rank 0 prints; after timing, each configuration checks the reduced gradients against one process's
// gradients of the whole batch (1e-4 relative per tensor), so a fast wrong answer cannot win.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <remat/distributed/distributed.hpp>

#include "context.hpp"
#include "remat_model.hpp"
#include "workloads.hpp"

namespace bench {

void set_threads(int threads) {
  remat::set_num_threads(threads);
}

namespace {

namespace dist = remat::distributed;
using Model = RematModel<W1, Plain>;

struct Flags {
  int threads = 1, repetitions = 10, steps = 5;
  double bucket_mib = 25;
};

/// Removes this program's flags from argv (the rest is Google Benchmark's). Throws std::invalid_argument for
/// a flag without a value or a value out of range.
Flags parse_flags(int& argc, char** argv) {
  Flags f;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&](double low, double high) {
      if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
      const double v = std::stod(argv[++i]);
      if (!(v >= low && v <= high))
        throw std::invalid_argument(flag + " " + argv[i] + " is outside [" + std::to_string(low) + ", " +
                                    std::to_string(high) + "]");
      return v;
    };
    if (flag == "--threads")
      f.threads = static_cast<int>(value(1, 256));
    else if (flag == "--repetitions")
      f.repetitions = static_cast<int>(value(1, 100000));
    else if (flag == "--steps")
      f.steps = static_cast<int>(value(1, 100000));
    else if (flag == "--bucket-mib")
      f.bucket_mib = value(1.0 / 1024, 1 << 20);
    else
      argv[kept++] = argv[i];
  }
  argc = kept;
  return f;
}

/// Rows [first, first + rows) of the full W1 batch: this rank's shard, with the whole batch's weights.
Data shard_of(const Data& full, Index first, Index rows) {
  Data d = full;
  d.x = full.x.middleRows(first, rows);
  d.labels.assign(full.labels.begin() + first, full.labels.begin() + first + rows);
  return d;
}

/// The slowest rank's time (every rank's step must end for the global step to end).
double slowest(double seconds) {
  dist::detail::check(MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD),
                      "distributed_step: MPI_Allreduce");
  return seconds;
}

/// Largest ‖a − b‖ / ‖b‖ over the parameters' gradients (b: one process, the whole batch).
double gradient_error(const std::vector<remat::Parameter<float>*>& got,
                      const std::vector<remat::Parameter<float>*>& want) {
  double worst = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    const double norm = want[k]->grad().cast<double>().norm();
    const double diff = (got[k]->grad().cast<double>() - want[k]->grad().cast<double>()).norm();
    worst = std::max(worst, norm > 0 ? diff / norm : diff);
  }
  return worst;
}

/// Everything a configuration reuses across its repetitions: the data, this rank's model and its reducer.
struct Setup {
  Data full = make_data(W1::shape);
  Data shard;
  std::unique_ptr<Model> model;
  std::unique_ptr<dist::GradientReducer<float>> reducer;
  double weight = 1;

  Setup(bool reduce, std::size_t bucket_bytes) {
    const int r = dist::rank(), n = dist::size();
    const Index batch = W1::shape.batch, first = batch * r / n, end = batch * (r + 1) / n;
    shard = shard_of(full, first, end - first);
    weight = static_cast<double>(end - first) / static_cast<double>(batch);
    model = std::make_unique<Model>(shard);
    if (reduce) {
      reducer = std::make_unique<dist::GradientReducer<float>>(model->parameters(), MPI_COMM_WORLD, bucket_bytes);
      reducer->attach(model->tape());
      reducer->set_local_weight(weight);
      reducer->enable_timing();
    }
  }

  /// forward + backward (+ the all-reduce with a reducer).
  void step() {
    if (!reducer) {
      model->step();
      return;
    }
    model->step(nullptr, [this](remat::Tape<float>& tape, const V& loss) { reducer->backward(tape, loss); });
    reducer->finish();
  }
};

void distributed_step(benchmark::State& state, const Flags& flags, bool reduce) {
  set_threads(flags.threads);
  static std::unique_ptr<Setup> setups[2];  // plain, reducer: built and warmed up once, reused by every repetition
  std::unique_ptr<Setup>& setup = setups[reduce];
  if (!setup) {
    setup = std::make_unique<Setup>(reduce, static_cast<std::size_t>(flags.bucket_mib * (1 << 20)));
    setup->step();  // warm-up: the tape's pool, OpenBLAS's buffers, MPI's connections
    setup->step();
  }
  double busy = 0, hidden = 0, exposed = 0, backward = 0, resolution = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    setup->step();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(slowest(seconds));
    if (setup->reducer) {
      const dist::StepTiming& t = setup->reducer->last_step_timing();
      busy += t.busy_seconds();
      hidden += t.hidden_seconds();
      exposed += t.exposed_wait_seconds();
      backward += t.backward_seconds();
      resolution = std::max(resolution, t.resolution_seconds());
    }
  }
  const double steps = static_cast<double>(state.iterations());
  state.counters["ranks"] = dist::size();
  state.counters["threads"] = flags.threads;
  state.counters["rows_per_rank"] = static_cast<double>(setup->shard.x.rows());
  state.counters["GFLOP/s"] =
      benchmark::Counter(step_flops(W1::shape) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (setup->reducer) {
    const dist::StepTiming& t = setup->reducer->last_step_timing();
    state.counters["hidden_fraction"] = busy > 0 ? hidden / busy : NAN;
    state.counters["busy_ms"] = 1e3 * busy / steps;
    state.counters["exposed_wait_ms"] = 1e3 * exposed / steps;
    state.counters["backward_ms"] = 1e3 * backward / steps;
    state.counters["resolution_ms"] = 1e3 * resolution;
    state.counters["bytes_per_step"] = static_cast<double>(t.bytes());
    state.counters["buckets"] = static_cast<double>(t.buckets.size());
    // The reduced gradients of the last step against one process's on the whole batch.
    static const double error = [&] {
      Model whole(setup->full);
      whole.step();
      return gradient_error(setup->model->parameters(), whole.parameters());
    }();
    state.counters["gradient_error"] = error;
    if (!(error < 1e-4)) state.SkipWithError("the reduced gradients differ from one process's");
  }
}

/// Rank 0 reports; the other ranks run the same benchmarks (they take part in every all-reduce) silently.
class Silent : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

/// The 25th to 75th percentile range (linear interpolation), as Google Benchmark's custom statistic "iqr".
double iqr(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  auto quantile = [&](double q) {
    const double at = q * static_cast<double>(s.size() - 1);
    const auto lo = static_cast<std::size_t>(std::floor(at));
    const std::size_t hi = std::min(lo + 1, s.size() - 1);
    return s[lo] + (at - static_cast<double>(lo)) * (s[hi] - s[lo]);
  };
  return quantile(0.75) - quantile(0.25);
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  remat::distributed::Environment mpi(argc, argv);
  return remat::distributed::run_or_abort("distributed_step", [&] {
    const bench::Flags flags = bench::parse_flags(argc, argv);
    const int rank = remat::distributed::rank(), ranks = remat::distributed::size();
    if (bench::W1::shape.batch < ranks)
      throw std::invalid_argument("W1's batch of 512 rows cannot be split over " + std::to_string(ranks) + " ranks");
    // Only rank 0 writes --benchmark_out (Google Benchmark refuses a file reporter without it).
    if (rank != 0)
      argc = static_cast<int>(
          std::remove_if(argv + 1, argv + argc,
                         [](const char* a) { return std::string(a).rfind("--benchmark_out", 0) == 0; }) -
          argv);
    bench::add_blas_context();
    benchmark::AddCustomContext("ranks", std::to_string(ranks));
    benchmark::AddCustomContext("threads per rank", std::to_string(flags.threads));
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    const std::string name =
        "W1_distributed_step/ranks:" + std::to_string(ranks) + "/threads:" + std::to_string(flags.threads);
    for (bool reduce : {false, true}) {
      if (!reduce && ranks > 1) continue;  // without a reducer the ranks would not train one model
      benchmark::RegisterBenchmark((name + (reduce ? "/reducer" : "/plain")).c_str(), bench::distributed_step, flags,
                                   reduce)
          ->Iterations(flags.steps)
          ->Repetitions(flags.repetitions)
          ->ComputeStatistics("iqr", bench::iqr)
          ->DisplayAggregatesOnly(true)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
    }
    if (rank == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      bench::Silent silent;
      benchmark::RunSpecifiedBenchmarks(&silent);
    }
    benchmark::Shutdown();
    return 0;
  });
}
