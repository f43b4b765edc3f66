// What examples/mlp and examples/gpt share for --distributed (data parallelism over MPI ranks,
// docs/distributed.md) and --timing: main()'s MPI frame, each rank's shard of a global batch, the gradient
// reducer, and the per-step timing they print. Built with MPI when REMAT_EXAMPLES_MPI is defined (the
// examples' CMakeLists do it when remat::mpi exists); without it --distributed is refused and --timing
// times one process.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <remat/remat.hpp>

#ifdef REMAT_EXAMPLES_MPI
#include <remat/distributed/distributed.hpp>
#endif

#include "report.hpp"

namespace examples {

/// This process's place in a --distributed run (rank 0 of 1 otherwise).
struct Ranks {
  int rank = 0, size = 1;
  bool distributed = false;
  /// Rows [begin(m), end(m)) of a global batch of m rows are this rank's: contiguous shards whose sizes differ
  /// by at most one.
  std::size_t begin(std::size_t m) const { return m * static_cast<std::size_t>(rank) / static_cast<std::size_t>(size); }
  std::size_t end(std::size_t m) const {
    return m * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(size);
  }
};

/// main()'s frame of an example called `program`. Without `distributed`: returns f(Ranks{}), and an exception
/// becomes "<program>: error: <message>" on stderr and exit code 2. With it: MPI_Init (MPI_Finalize on return),
/// every rank's stdout but rank 0's goes to /dev/null (progress only on rank 0; stderr stays), and a rank
/// whose f throws prints "<program>: rank r of N: error: <message>" and ends every rank (MPI_Abort; mpirun
/// exits non-zero) instead of leaving the others waiting in an all-reduce it will never join.
template <class F>
int run_main(const char* program, bool distributed, int& argc, char**& argv, F&& f) {
  Ranks ranks;
#ifdef REMAT_EXAMPLES_MPI
  std::optional<remat::distributed::Environment> mpi;
  if (distributed) {
    mpi.emplace(argc, argv);
    ranks.rank = remat::distributed::rank();
    ranks.size = remat::distributed::size();
    ranks.distributed = true;
    if (ranks.rank != 0 && !std::freopen("/dev/null", "w", stdout))
      std::fprintf(stderr, "%s: warning: cannot silence stdout on rank %d\n", program, ranks.rank);
  }
  auto fail = [&](const std::string& message) {
    if (distributed) remat::distributed::abort_all(program, message, 2);
    std::fprintf(stderr, "%s: error: %s\n", program, message.c_str());
  };
#else
  (void)argc;
  (void)argv;
  auto fail = [&](const std::string& message) { std::fprintf(stderr, "%s: error: %s\n", program, message.c_str()); };
  if (distributed) {
    fail(std::string("--distributed: this ") + program +
         " was built without MPI (install libopenmpi-dev and openmpi-bin, then reconfigure)");
    return 2;
  }
#endif
  try {
    return f(static_cast<const Ranks&>(ranks));
  } catch (const std::bad_alloc&) {
    fail("out of memory");
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::fflush(stdout);
  return 2;
}

/// What --timing prints for a run of steps (an epoch, a window of steps): sums over the steps, in seconds
/// and bytes.
struct TimingTotals {
  std::size_t steps = 0;
  double step_seconds = 0;        ///< whole steps: forward, backward, reduction, optimizer
  double backward_seconds = 0;    ///< tape.backward() (with the reducer's reports and all-reduce starts)
  std::size_t reduced_steps = 0;  ///< steps whose gradients were all-reduced (--distributed)
  double busy_seconds = 0;        ///< time at least one all-reduce was in flight (StepTiming::busy_seconds)
  double hidden_seconds = 0;      ///< the part of it before backward ended
  double exposed_seconds = 0;     ///< finish() end − backward end
  double resolution_seconds = 0;  ///< the widest completion window seen (StepTiming::resolution_seconds)
  std::size_t bytes_per_step = 0, buckets = 0;

  /// Adds the steps of `other` (a later window of the same run).
  TimingTotals& operator+=(const TimingTotals& other) {
    steps += other.steps;
    step_seconds += other.step_seconds;
    backward_seconds += other.backward_seconds;
    reduced_steps += other.reduced_steps;
    busy_seconds += other.busy_seconds;
    hidden_seconds += other.hidden_seconds;
    exposed_seconds += other.exposed_seconds;
    resolution_seconds = std::max(resolution_seconds, other.resolution_seconds);
    if (other.reduced_steps > 0) {
      bytes_per_step = other.bytes_per_step;
      buckets = other.buckets;
    }
    return *this;
  }

  /// hidden_seconds / busy_seconds over all the steps (NaN if nothing was reduced).
  double hidden_fraction() const {
    return busy_seconds > 0 ? hidden_seconds / busy_seconds : std::numeric_limits<double>::quiet_NaN();
  }

  /// "timing <what>: 12.34 ms/step, backward 8.00 ms/step; all-reduce of 66.45 MB/step in 3 buckets: busy
  /// 5.00 ms/step, 45.6% hidden behind backward, exposed wait 1.20 ms/step (completions seen within 0.50 ms)".
  std::string line(const std::string& what) const {
    const double n = static_cast<double>(std::max<std::size_t>(steps, 1));
    char s[400];
    int used = std::snprintf(s, sizeof s, "timing %s: %zu steps, %.2f ms/step, backward %.2f ms/step", what.c_str(),
                             steps, 1e3 * step_seconds / n, 1e3 * backward_seconds / n);
    if (reduced_steps == 0) {
      std::snprintf(s + used, sizeof s - static_cast<std::size_t>(used), "; one process, nothing all-reduced");
      return s;
    }
    const double r = static_cast<double>(reduced_steps);
    std::snprintf(s + used, sizeof s - static_cast<std::size_t>(used),
                  "; all-reduce of %s/step in %zu bucket%s: busy %.2f ms/step, %.1f%% hidden behind backward, "
                  "exposed wait %.2f ms/step (completions seen within %.2f ms)",
                  megabytes(bytes_per_step).c_str(), buckets, buckets == 1 ? "" : "s", 1e3 * busy_seconds / r,
                  100 * hidden_fraction(), 1e3 * exposed_seconds / r, 1e3 * resolution_seconds);
    return s;
  }

  /// The same figures as one JSON object (seconds per step, bytes per step, the hidden fraction in [0, 1]).
  std::string json() const {
    const double n = static_cast<double>(std::max<std::size_t>(steps, 1));
    const double r = static_cast<double>(std::max<std::size_t>(reduced_steps, 1));
    const double fraction = hidden_fraction();
    return "{\"steps\":" + std::to_string(steps) + ",\"step_seconds\":" + number(step_seconds / n) +
           ",\"backward_seconds\":" + number(backward_seconds / n) +
           ",\"reduced_steps\":" + std::to_string(reduced_steps) + ",\"busy_seconds\":" + number(busy_seconds / r) +
           ",\"hidden_fraction\":" + (std::isnan(fraction) ? std::string("null") : number(fraction)) +
           ",\"exposed_wait_seconds\":" + number(exposed_seconds / r) +
           ",\"resolution_seconds\":" + number(resolution_seconds) +
           ",\"bytes_per_step\":" + std::to_string(bytes_per_step) + ",\"buckets\":" + std::to_string(buckets) + "}";
  }
};

/// A training loop's gradients, averaged over the ranks in a --distributed run: every rank starts from rank
/// 0's parameters (broadcast_parameters, which fails on every rank if their parameter lists differ), and a
/// GradientReducer attached to the loop's tape all-reduces the gradients in buckets while backward runs. With
/// `timing`, each step's times are summed for --timing (TimingTotals). In one process it only times.
///
/// A step: start_step(), record the loss, backward(tape, loss) (the backward and the reduction), the
/// optimizer step, end_step().
class DataParallel {
 public:
  DataParallel(const Ranks& ranks, const std::vector<remat::Parameter<float>*>& parameters, remat::Tape<float>& tape,
               bool timing)
      : ranks_(ranks), timing_(timing) {
#ifdef REMAT_EXAMPLES_MPI
    if (ranks.distributed) {
      remat::distributed::broadcast_parameters(parameters, 0);
      reducer_ = std::make_unique<remat::distributed::GradientReducer<float>>(parameters);
      reducer_->attach(tape);
      reducer_->enable_timing(timing);
    }
#else
    (void)parameters;
    (void)tape;
#endif
  }

  const Ranks& ranks() const {
    return ranks_;
  }

  /// This rank trains on `rows` of a global batch of `global` rows, its loss the mean over them: its gradient
  /// weighs rows / global, so the sum over the ranks is the gradient of the global batch's mean loss.
  void set_shard(std::size_t rows, std::size_t global) {
#ifdef REMAT_EXAMPLES_MPI
    if (reducer_) reducer_->set_local_weight(static_cast<double>(rows) / static_cast<double>(global));
#endif
    (void)rows;
    (void)global;
  }

  void start_step() {
    if (timing_) step_start_ = Clock::now();
  }

  /// tape.backward(loss), then (distributed) waits for the all-reduced gradients: after it every rank's
  /// parameters hold the same gradient.
  void backward(remat::Tape<float>& tape, const remat::Var<float>& loss) {
#ifdef REMAT_EXAMPLES_MPI
    if (reducer_) {
      reducer_->backward(tape, loss);
      reducer_->finish();
      if (timing_) {
        const remat::distributed::StepTiming& t = reducer_->last_step_timing();
        totals_.backward_seconds += t.backward_seconds();
        totals_.busy_seconds += t.busy_seconds();
        totals_.hidden_seconds += t.hidden_seconds();
        totals_.exposed_seconds += t.exposed_wait_seconds();
        totals_.resolution_seconds = std::max(totals_.resolution_seconds, t.resolution_seconds());
        totals_.bytes_per_step = t.bytes();
        totals_.buckets = t.buckets.size();
        ++totals_.reduced_steps;
      }
      return;
    }
#endif
    if (!timing_) return tape.backward(loss);
    const Clock::time_point start = Clock::now();
    tape.backward(loss);
    totals_.backward_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }

  void end_step() {
    if (!timing_) return;
    totals_.step_seconds += std::chrono::duration<double>(Clock::now() - step_start_).count();
    ++totals_.steps;
  }

  /// The timing of the steps since the last call (all zero without `timing`), and starts a new sum.
  TimingTotals take_timing() {
    return std::exchange(totals_, TimingTotals{});
  }

  /// Adds every rank's `values` element by element, in place (collective; nothing in one process).
  void sum_over_ranks(double* values, int count) const {
#ifdef REMAT_EXAMPLES_MPI
    if (ranks_.distributed)
      remat::distributed::detail::check(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD),
                                        "sum_over_ranks: MPI_Allreduce");
#endif
    (void)values;
    (void)count;
  }

  /// Throws std::runtime_error, on every rank alike, unless every rank passes the same `value` (collective):
  /// "<what>: rank 0 has 100 but rank 1 has 0; <hint>".
  void check_same_on_every_rank(std::uint64_t value, const std::string& what, const std::string& hint) const {
#ifdef REMAT_EXAMPLES_MPI
    if (!ranks_.distributed) return;
    std::vector<unsigned long long> all(static_cast<std::size_t>(ranks_.size));
    unsigned long long mine = value;
    remat::distributed::detail::check(
        MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD),
        "check_same_on_every_rank: MPI_Allgather");
    for (std::size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0])
        throw std::runtime_error(what + ": rank 0 has " + std::to_string(all[0]) + " but rank " + std::to_string(r) +
                                 " has " + std::to_string(all[r]) + "; " + hint);
#else
    (void)value;
    (void)what;
    (void)hint;
#endif
  }

  /// Throws std::runtime_error, on every rank alike, unless every rank's parameters are bitwise equal to
  /// rank 0's (compared by CRC-32 `crc` of their bytes; collective). Data-parallel ranks apply the same
  /// averaged gradient to the same values, so they must be.
  void check_same_parameters_bitwise(std::uint32_t crc) const {
    check_same_on_every_rank(crc, "the parameters' CRC-32 after training",
                             "the ranks' parameters diverged (they must stay bitwise identical)");
  }

 private:
  using Clock = std::chrono::steady_clock;
  Ranks ranks_;
  bool timing_;
  Clock::time_point step_start_{};
  TimingTotals totals_;
#ifdef REMAT_EXAMPLES_MPI
  std::unique_ptr<remat::distributed::GradientReducer<float>> reducer_;
#endif
};

}  // namespace examples
