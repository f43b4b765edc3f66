// StepTiming: the timestamps a GradientReducer records of one step when asked (enable_timing), and the
// overlap of its all-reduces with the backward sweep that follows from them (docs/distributed.md
// §Measuring the overlap). No MPI here: the arithmetic is plain, and testable without ranks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>
#include <vector>

namespace remat::distributed {

/// One step of a GradientReducer, on this rank's std::chrono::steady_clock: when the synchronised backward
/// started and ended, when each bucket's MPI_Iallreduce started and when it was seen complete, and when
/// finish() returned. Durations are in seconds, sizes in bytes.
///
/// Resolution: Open MPI reports a non-blocking all-reduce complete only from inside an MPI call, so a
/// completion time is the time of the first MPI_Test (at a gradient-ready report, during backward) or
/// MPI_Waitany return (in finish()) that saw it; the all-reduce ended somewhere in (last_pending, done].
/// resolution_seconds() is the widest such window of the step. Those calls are also where Open MPI moves
/// the all-reduce along (it has no progress thread here), so "busy" means "started and not yet seen
/// complete", which includes the time the operation waited for the next MPI call.
struct StepTiming {
  using Clock = std::chrono::steady_clock;  ///< the clock of every time point here

  /// One bucket's all-reduce.
  struct Bucket {
    std::size_t bytes = 0;             ///< bytes it sums (its gradients and one flag per parameter)
    Clock::time_point start;           ///< just before MPI_Iallreduce
    Clock::time_point last_pending;    ///< the last MPI_Test that found it unfinished (start if none did)
    Clock::time_point done;            ///< the first MPI_Test / MPI_Waitany return that found it complete
    bool started_in_backward = false;  ///< started by a gradient-ready report (false: by finish())
  };

  Clock::time_point backward_start;  ///< GradientReducer::backward() called tape.backward()
  Clock::time_point backward_end;    ///< tape.backward() returned
  Clock::time_point finish_end;      ///< finish() done: every reduced gradient written back
  bool backward_timed = false;       ///< false if the step's backward did not run through GradientReducer::backward()
  std::vector<Bucket> buckets;       ///< in the order they were started (bucket order)

  /// backward_end − backward_start; NaN if the backward was not timed.
  double backward_seconds() const {
    return backward_timed ? seconds(backward_end - backward_start) : std::numeric_limits<double>::quiet_NaN();
  }
  /// finish_end − backward_end: what the reduction added after the backward sweep (packing the gradients no
  /// report delivered, waiting for the all-reduces, copying the sums back); NaN if the backward was not timed.
  double exposed_wait_seconds() const {
    return backward_timed ? seconds(finish_end - backward_end) : std::numeric_limits<double>::quiet_NaN();
  }
  /// Length of the union of the buckets' [start, done] intervals: the time at least one all-reduce was
  /// in flight.
  double busy_seconds() const { return busy_before(Clock::time_point::max()); }
  /// The part of busy_seconds() before backward_end (0 if the backward was not timed).
  double hidden_seconds() const { return backward_timed ? busy_before(backward_end) : 0.0; }
  /// hidden_seconds() / busy_seconds(): the fraction of all-reduce time hidden behind the backward sweep;
  /// NaN when nothing was reduced or the backward was not timed.
  double hidden_fraction() const {
    const double busy = busy_seconds();
    return backward_timed && busy > 0 ? hidden_seconds() / busy : std::numeric_limits<double>::quiet_NaN();
  }
  /// The widest window (last_pending, done] in which a bucket's completion is known to lie.
  double resolution_seconds() const {
    double r = 0;
    for (const Bucket& b : buckets) r = std::max(r, seconds(b.done - b.last_pending));
    return r;
  }
  /// Bytes all-reduced in the step (each rank sends and receives about 2(N − 1)/N times this in a ring).
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const Bucket& b : buckets) n += b.bytes;
    return n;
  }

 private:
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  /// Length of the union of [start, min(done, end)] over the buckets.
  double busy_before(Clock::time_point end) const {
    std::vector<std::pair<Clock::time_point, Clock::time_point>> spans;
    for (const Bucket& b : buckets)
      if (b.start < end) spans.emplace_back(b.start, std::min(b.done, end));
    std::sort(spans.begin(), spans.end());
    double total = 0;
    for (std::size_t i = 0; i < spans.size();) {
      Clock::time_point lo = spans[i].first, hi = spans[i].second;
      for (++i; i < spans.size() && spans[i].first <= hi; ++i) hi = std::max(hi, spans[i].second);
      total += seconds(hi - lo);
    }
    return total;
  }
};

}  // namespace remat::distributed
