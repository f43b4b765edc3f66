// GradientReducer: data-parallel training's gradient averaging, in buckets all-reduced while the backward
// sweep still runs (the design of PyTorch's DistributedDataParallel: Li et al., "PyTorch Distributed:
// Experiences on Accelerating Data Parallel Training", VLDB 2020, §3.2).
#pragma once

#include <mpi.h>

#include <Eigen/Core>
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "remat/distributed/environment.hpp"
#include "remat/distributed/parameters.hpp"
#include "remat/distributed/step_timing.hpp"
#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/parameter.hpp"
#include "remat/tape.hpp"
#include "remat/var.hpp"

namespace remat::distributed {

/// Averages the gradients of a list of Parameters across the ranks of a communicator, so that every rank
/// applies the same update (data parallelism: each rank runs the model on its shard of the global batch).
///
/// Buckets: the parameters are grouped, in reverse order of the list (the order a backward pass finishes
/// their gradients when the list follows the forward pass), into buckets of about `bucket_bytes` bytes of
/// gradient (default 25 MiB, DistributedDataParallel's bucket_cap_mb; a parameter larger than that gets a
/// bucket of its own). attach(tape) registers a gradient-ready callback (Tape::on_gradient_ready): when the
/// tape reports a parameter's gradient final, the reducer copies it, times local_weight(), into its bucket;
/// when a bucket is full it starts a non-blocking MPI_Iallreduce (sum) of it, so communication overlaps the
/// rest of the backward sweep. Buckets are started in the same order on every rank (bucket b only after
/// bucket b − 1), as MPI requires of collectives. Open MPI progresses a non-blocking collective only inside
/// MPI calls: the reducer tests its requests at every gradient-ready event.
///
/// finish(), before the optimizer step, starts the buckets not started yet (with the parameters that
/// reported no gradient in this step: their current gradient, zeros if none), waits for all of them and
/// writes the sums back: every parameter's gradient becomes Σ_ranks local_weight · gradient, the same bits
/// on every rank. With the default weight 1/size() that is the average; when every rank's loss is the mean
/// over its shard of n_r rows of a global batch of B rows, set_local_weight(n_r / B) makes it the gradient of
/// the mean over the global batch even for unequal shards. A parameter no rank has a gradient for keeps no
/// gradient (Parameter::has_grad() false; optimizers skip it).
///
/// Each parameter's gradient is reduced exactly once per finish(): gradient accumulation over micro-batches
/// runs every backward but the last inside no_sync() (DDP's no_sync): the gradients accumulate locally and
/// the last backward reduces the sum. A gradient reported final a second time before finish() (two
/// synchronised backward passes in one step) throws tape_error from that backward.
///
/// Timing (off by default, and then no clock is read): enable_timing() makes every step record when its
/// backward ran (time it with backward(tape, loss) instead of tape.backward(loss)), when each bucket's
/// all-reduce started and was seen complete, and when finish() returned; last_step_timing() gives the
/// step finish() last completed, with the fraction of all-reduce time hidden behind backward (StepTiming).
///
/// Every rank must construct it with the same parameter shapes (checked: shape_error), attach it to the
/// tapes of the same backward passes and call finish() equally often. The reducer must outlive the tapes
/// it is attached to (or be detached: Tape::remove_gradient_ready(key)). Not thread-safe.
template <class T>
class GradientReducer {
 public:
  /// 25 MiB, the default bucket size of PyTorch's DistributedDataParallel.
  static constexpr std::size_t default_bucket_bytes = std::size_t{25} << 20;

  /// Collective over `comm`; every rank must pass the same bucket_bytes (it decides which all-reduces the
  /// ranks post). Throws shape_error if the ranks' parameter lists differ (count or shapes), domain_error for
  /// a null or repeated parameter on any rank, a bucket_bytes of 0 or one that differs between ranks, all on
  /// every rank; domain_error for a parameter of more than INT_MAX − 1 elements, mpi_error.
  explicit GradientReducer(const std::vector<Parameter<T>*>& parameters, MPI_Comm comm = MPI_COMM_WORLD,
                           std::size_t bucket_bytes = default_bucket_bytes)
      : comm_(comm) {
    check_same_parameters(parameters, comm, "GradientReducer");
    weight_ = 1.0 / static_cast<double>(size(comm));
    for (Parameter<T>* p : parameters) {
      storages_.push_back(remat::detail::ParameterAccess::storage(*p));
      shapes_.push_back(Shape{p->rows(), p->cols()});
    }
    for (std::size_t k = 0; k < storages_.size(); ++k) lookup_.push_back({storages_[k].get(), k});
    std::sort(lookup_.begin(), lookup_.end());
    check_ranks_agree(bucket_bytes);
    slots_.resize(storages_.size());
    copied_.assign(storages_.size(), 0);
    std::size_t bytes = 0;
    for (std::size_t k = storages_.size(); k-- > 0;) {
      const auto elements = static_cast<std::size_t>(shapes_[k].numel());
      if (elements >= static_cast<std::size_t>(INT_MAX))
        throw domain_error("GradientReducer: parameter " + std::to_string(k) + " " + to_string(shapes_[k]) +
                           " has more elements than one MPI message may carry (INT_MAX)");
      const std::size_t b = elements * sizeof(T);
      if (buckets_.empty() || (bytes > 0 && bytes + b > bucket_bytes) ||
          buckets_.back().values + elements + buckets_.back().members.size() + 1 >= static_cast<std::size_t>(INT_MAX)) {
        buckets_.emplace_back();
        bytes = 0;
      }
      Bucket& bucket = buckets_.back();
      slots_[k] = {buckets_.size() - 1, bucket.values, bucket.members.size()};
      bucket.members.push_back(k);
      bucket.values += elements;
      bytes += b;
    }
    for (Bucket& bucket : buckets_) {
      // The sums of the gradients, then one flag per member: the number of ranks that had a gradient for it.
      bucket.data.assign(bucket.values + bucket.members.size(), T(0));
      bucket.pending = bucket.members.size();
    }
    requests_.assign(buckets_.size(), MPI_REQUEST_NULL);
  }
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;
  /// Waits for all-reduces still in flight (a step abandoned without finish()).
  ~GradientReducer() {
    int finalised = 1;
    MPI_Finalized(&finalised);
    if (finalised) return;
    for (MPI_Request& request : requests_)
      if (request != MPI_REQUEST_NULL) MPI_Wait(&request, MPI_STATUS_IGNORE);
  }

  /// Registers this reducer's gradient-ready callback on `tape`; returns its key (Tape::remove_gradient_ready).
  std::size_t attach(Tape<T>& tape) {
    return tape.on_gradient_ready([this](Parameter<T>& p) { gradient_ready(p); });
  }

  /// tape.backward(loss, retain_graph); with timing on and outside no_sync(), records when it started and
  /// ended (StepTiming::backward_start, backward_end). Throws what tape.backward throws.
  void backward(Tape<T>& tape, const Var<T>& loss, bool retain_graph = false) {
    if (!timing_ || !sync_) return tape.backward(loss, retain_graph);
    current_.backward_start = StepTiming::Clock::now();
    current_.backward_timed = false;
    tape.backward(loss, retain_graph);
    current_.backward_end = StepTiming::Clock::now();
    current_.backward_timed = true;
  }

  /// Turns the per-step timestamps (StepTiming) on or off; call it between steps (before a backward or
  /// after finish()). Off by default: then the reducer reads no clock. Not collective (a rank may time alone).
  void enable_timing(bool on = true) {
    timing_ = on;
    if (!on) return;
    for (StepTiming* t : {&current_, &last_}) {
      t->buckets.resize(buckets_.size());
      for (std::size_t b = 0; b < buckets_.size(); ++b) t->buckets[b].bytes = buckets_[b].data.size() * sizeof(T);
    }
  }
  bool timing_enabled() const { return timing_; }  ///< whether steps are timed (enable_timing())

  /// The timestamps of the step the last finish() completed with timing on. Throws std::logic_error if
  /// timing is off or no step has finished since enable_timing().
  const StepTiming& last_step_timing() const {
    if (!timing_)
      throw std::logic_error("GradientReducer::last_step_timing: timing is off; call enable_timing() before the step");
    if (!timed_step_)
      throw std::logic_error(
          "GradientReducer::last_step_timing: no step has finished (finish()) since enable_timing()");
    return last_;
  }

  /// The callback: parameter `p`'s gradient of this backward is final. Ignored for a parameter not in the
  /// list and inside no_sync(). Throws tape_error if p's gradient was already reported in this step, shape_error
  /// if p was resized, mpi_error.
  void gradient_ready(const Parameter<T>& p) {
    if (!sync_) return;
    const std::size_t k = index_of(remat::detail::ParameterAccess::identity(p));
    if (k == npos) return;
    if (copied_[k])
      throw tape_error("GradientReducer: the gradient of parameter " + std::to_string(k) + " " + to_string(shapes_[k]) +
                       " was reported final twice before finish() (two synchronised backward passes in one step); "
                       "run the backward of every micro-batch but the last inside no_sync()");
    pack(k);
    ++reported_;
    start_full_buckets(/*in_backward=*/true);
    progress();
  }

  /// While the returned guard lives, gradient-ready reports are ignored (gradients accumulate locally), as
  /// DistributedDataParallel.no_sync(); the backward after it reduces the accumulated gradients.
  class NoSync {
   public:
    /// Stops reducing r's gradients until destroyed.
    explicit NoSync(GradientReducer& r) : reducer_(&r), previous_(r.sync_) { r.sync_ = false; }
    /// Takes over other's guard.
    NoSync(NoSync&& other) noexcept : reducer_(std::exchange(other.reducer_, nullptr)), previous_(other.previous_) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync() {
      if (reducer_) reducer_->sync_ = previous_;
    }

   private:
    GradientReducer* reducer_;
    bool previous_;
  };
  /// A guard under which backward passes accumulate gradients locally without reducing them.
  NoSync no_sync() { return NoSync(*this); }

  /// This rank's gradients are multiplied by `w` before the sum over ranks (default 1/size(): the average).
  /// Set it between steps: the gradients reported during a backward are weighted then. Throws, changing
  /// nothing, domain_error for a weight that is not finite or whose magnitude is outside T's normal range
  /// (other than 0), and tape_error once this step has weighted a gradient (after a backward reported one,
  /// before finish()).
  void set_local_weight(double w) {
    const double magnitude = std::abs(w);
    if (!std::isfinite(w) || (w != 0 && (magnitude < static_cast<double>(std::numeric_limits<T>::min()) ||
                                         magnitude > static_cast<double>(std::numeric_limits<T>::max()))))
      throw domain_error("GradientReducer::set_local_weight: the weight " + remat::number_text(w) +
                         " is not 0 or a finite number of magnitude " +
                         remat::number_text(static_cast<double>(std::numeric_limits<T>::min())) + " to " +
                         remat::number_text(static_cast<double>(std::numeric_limits<T>::max())) +
                         " (the gradients' type's normal range)");
    if (std::find(copied_.begin(), copied_.end(), std::uint8_t{1}) != copied_.end())
      throw tape_error("GradientReducer::set_local_weight(" + remat::number_text(w) +
                       "): this step has already weighted gradients by " + remat::number_text(weight_) +
                       "; set the weight before the step's backward, or after finish()");
    weight_ = w;
  }
  double local_weight() const { return weight_; }  ///< the weight set_local_weight() set

  /// Collective: starts the buckets not started yet, waits for every bucket and writes the reduced gradients
  /// into the parameters (see the class comment); then the next step begins. Call it on every rank before
  /// the optimizer step. Throws shape_error (a parameter resized since construction), mpi_error; a rank that
  /// throws here leaves the others waiting: end the program (abort_all / run_or_abort).
  void finish() {
    for (std::size_t b = next_start_; b < buckets_.size(); ++b)
      for (std::size_t k : buckets_[b].members)
        if (!copied_[k]) pack(k);
    start_full_buckets(/*in_backward=*/false);
    if (timing_) {
      wait_timed();
    } else {
      for (MPI_Request& request : requests_)
        detail::check(MPI_Wait(&request, MPI_STATUS_IGNORE), "GradientReducer::finish: MPI_Wait");
    }
    // A parameter resized after its gradient was packed: its buffer no longer holds the reduced values.
    for (std::size_t k = 0; k < storages_.size(); ++k) check_shape(k, "GradientReducer::finish");
    for (std::size_t k = 0; k < storages_.size(); ++k) {
      const Slot& s = slots_[k];
      const Bucket& bucket = buckets_[s.bucket];
      if (bucket.data[bucket.values + s.member] == T(0)) continue;  // no rank had a gradient
      remat::detail::ParameterStorage<T>& p = *storages_[k];
      p.reserve_grad();
      std::copy_n(bucket.data.data() + s.offset, static_cast<std::size_t>(shapes_[k].numel()), p.grad);
      p.grad_defined = true;
    }
    for (Bucket& bucket : buckets_) bucket.pending = bucket.members.size();
    std::fill(copied_.begin(), copied_.end(), std::uint8_t{0});
    next_start_ = 0;
    reported_ = 0;
    ++steps_;
    if (timing_) {
      current_.finish_end = StepTiming::Clock::now();
      std::swap(current_, last_);
      current_.backward_timed = false;
      timed_step_ = true;
    }
  }

  /// The number of ranks, and this one's.
  int ranks() const { return size(comm_); }
  int this_rank() const { return rank(comm_); }                 ///< this rank, 0 … ranks() − 1
  std::size_t bucket_count() const { return buckets_.size(); }  ///< the buckets the gradients are packed in
  /// The bucket parameter k belongs to (buckets are started in increasing order).
  std::size_t bucket_of(std::size_t k) const { return slots_.at(k).bucket; }
  /// Buckets whose all-reduce has started in this step (before finish(): the overlap with backward).
  std::size_t started_buckets() const { return next_start_; }
  /// Parameters whose gradient was reported final in this step (by the tape, outside no_sync()).
  std::size_t reported_parameters() const { return reported_; }
  /// The number of finish() calls so far.
  std::uint64_t steps() const { return steps_; }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  struct Slot {
    std::size_t bucket, offset, member;
  };
  struct Bucket {
    std::vector<std::size_t> members;  // parameter indices, in the order the reducer expects them ready
    std::size_t values = 0;            // gradient elements; data holds them, then one flag per member
    std::vector<T> data;
    std::size_t pending = 0;  // members not packed yet in this step
  };

  std::size_t index_of(const remat::detail::ParameterStorage<T>* storage) const {
    auto it = std::lower_bound(lookup_.begin(), lookup_.end(), std::make_pair(storage, std::size_t{0}));
    return it != lookup_.end() && it->first == storage ? it->second : npos;
  }

  /// Throws shape_error naming `who` if parameter k is no longer of the shape it had when the reducer was made.
  void check_shape(std::size_t k, const char* who) const {
    const remat::detail::ParameterStorage<T>& p = *storages_[k];
    if (p.value.rows() != shapes_[k].rows() || p.value.cols() != shapes_[k].cols())
      throw shape_error(std::string(who) + ": parameter " + std::to_string(k) + " is " +
                        to_string(Shape{p.value.rows(), p.value.cols()}) + " but was " + to_string(shapes_[k]) +
                        " when the reducer was made");
  }

  /// Collective (after check_same_parameters): a parameter given twice on any rank, and a bucket_bytes of 0 or
  /// one unlike rank 0's, are refused on every rank, so that no rank is left waiting in the first finish()
  /// (or an all-reduce of another bucket's size) for one that threw here. Throws domain_error.
  void check_ranks_agree(std::size_t bucket_bytes) {
    long long mine[3] = {-1, -1, static_cast<long long>(std::min<std::size_t>(bucket_bytes, LLONG_MAX))};
    for (std::size_t k = 1; k < lookup_.size() && mine[0] < 0; ++k)  // this rank's first repeated pair
      if (lookup_[k].first == lookup_[k - 1].first) {
        mine[0] = static_cast<long long>(std::min(lookup_[k].second, lookup_[k - 1].second));
        mine[1] = static_cast<long long>(std::max(lookup_[k].second, lookup_[k - 1].second));
      }
    const int ranks = size(comm_);
    std::vector<long long> all(3 * static_cast<std::size_t>(ranks));
    detail::check(MPI_Allgather(mine, 3, MPI_LONG_LONG, all.data(), 3, MPI_LONG_LONG, comm_),
                  "GradientReducer: MPI_Allgather");
    for (int r = 0; r < ranks; ++r) {
      const long long* rank_r = &all[3 * static_cast<std::size_t>(r)];
      if (rank_r[0] >= 0)
        throw domain_error("GradientReducer: parameters " + std::to_string(rank_r[0]) + " and " +
                           std::to_string(rank_r[1]) + " are the same parameter on rank " + std::to_string(r));
      if (rank_r[2] == 0) throw domain_error("GradientReducer: bucket_bytes is 0 on rank " + std::to_string(r));
      if (rank_r[2] != all[2])
        throw domain_error("GradientReducer: bucket_bytes is " + std::to_string(all[2]) + " on rank 0 but " +
                           std::to_string(rank_r[2]) + " on rank " + std::to_string(r) +
                           "; every rank must pass the same (it decides the buckets each all-reduce carries)");
    }
  }

  /// Copies parameter k's gradient × weight (zeros if it has none) into its bucket slot.
  void pack(std::size_t k) {
    remat::detail::ParameterStorage<T>& p = *storages_[k];
    check_shape(k, "GradientReducer");
    p.check_grad_size("GradientReducer");
    const Slot& s = slots_[k];
    Bucket& bucket = buckets_[s.bucket];
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> slot(bucket.data.data() + s.offset, shapes_[k].numel());
    if (p.grad_defined) {
      slot = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(p.grad, shapes_[k].numel()) * static_cast<T>(weight_);
      bucket.data[bucket.values + s.member] = T(1);
    } else {
      slot.setZero();
      bucket.data[bucket.values + s.member] = T(0);
    }
    copied_[k] = 1;
    --bucket.pending;
  }

  /// Starts, in bucket order, every bucket whose members are all packed; `in_backward`: from a report.
  void start_full_buckets(bool in_backward) {
    for (; next_start_ < buckets_.size() && buckets_[next_start_].pending == 0; ++next_start_) {
      Bucket& bucket = buckets_[next_start_];
      if (timing_) {
        StepTiming::Bucket& t = current_.buckets[next_start_];
        t.start = t.last_pending = StepTiming::Clock::now();
        t.started_in_backward = in_backward;
      }
      detail::check(MPI_Iallreduce(MPI_IN_PLACE, bucket.data.data(), static_cast<int>(bucket.data.size()),
                                   detail::datatype<T>(), MPI_SUM, comm_, &requests_[next_start_]),
                    "GradientReducer: MPI_Iallreduce");
    }
  }

  /// Lets MPI advance the all-reduces in flight; with timing on, notes when each is seen complete.
  void progress() {
    for (std::size_t b = 0; b < next_start_; ++b) {
      if (requests_[b] == MPI_REQUEST_NULL) continue;
      int done = 0;
      detail::check(MPI_Test(&requests_[b], &done, MPI_STATUS_IGNORE), "GradientReducer: MPI_Test");
      if (timing_) (done ? current_.buckets[b].done : current_.buckets[b].last_pending) = StepTiming::Clock::now();
    }
  }

  /// finish()'s wait with timing on: MPI_Test on every request in flight until none is, so that each
  /// completion is seen within one round of tests (MPI_Wait spins the same way inside Open MPI).
  void wait_timed() {
    while (std::any_of(requests_.begin(), requests_.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; }))
      progress();
  }

  MPI_Comm comm_;
  double weight_ = 1;
  bool sync_ = true;
  std::vector<std::shared_ptr<remat::detail::ParameterStorage<T>>> storages_;
  std::vector<Shape> shapes_;
  std::vector<std::pair<const remat::detail::ParameterStorage<T>*, std::size_t>> lookup_;  // sorted by storage
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<MPI_Request> requests_;  // one per bucket; MPI_REQUEST_NULL when none is in flight
  std::vector<std::uint8_t> copied_;
  std::size_t next_start_ = 0, reported_ = 0;
  std::uint64_t steps_ = 0;
  bool timing_ = false, timed_step_ = false;
  StepTiming current_, last_;  // the step in progress, the one finish() last completed
};

}  // namespace remat::distributed
