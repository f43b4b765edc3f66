// Tensor buffers: every tape-owned buffer comes from here (through the pool, detail/pool.hpp), with exact
// live/peak accounting, the dry run that lets a backward sweep reserve everything it will allocate before it
// changes anything (so a std::bad_alloc leaves the tape as it was), and the shapes-only mode of a tape that
// only counts.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "remat/detail/pool.hpp"
#include "remat/matrix.hpp"

namespace remat::detail {

/// Every tape-owned buffer goes through here: exact live and peak byte counts, and a simulation mode in
/// which the same sequence of allocate/free calls is only counted, to learn how many buffers of each
/// size the pool must hold for that sequence never to reach the system allocator.
///
/// Shapes-only (a tape that estimates, remat::estimate_memory): every buffer is a placeholder that must not
/// be read or written, no pool is used, and live/peak count exactly what the same calls would count on a
/// tape that computes. The tape skips every kernel then; the counting is this class's, shared with the
/// real run, so the two cannot disagree.
template <class T>
class Buffers {
 public:
  explicit Buffers(bool shapes_only = false) : shapes_only_(shapes_only) {}

  template <class S>
  static std::size_t bytes(const S& s) {
    return static_cast<std::size_t>(s.numel()) * sizeof(T);
  }
  /// Placeholders only: nothing may read or write the buffers (the tape runs no kernel).
  bool shapes_only() const { return shapes_only_; }

  /// A buffer for `s` (uninitialised). Throws std::bad_alloc (never in a simulation).
  template <class S>
  T* allocate(const S& s) {
    return allocate_elements(static_cast<std::size_t>(s.numel()));  // numel() once: a loop over an N-D rank
  }
  /// A buffer of `count` elements (uninitialised). Throws std::bad_alloc (never in a simulation).
  T* allocate_elements(std::size_t count) {
    const std::size_t size = count * sizeof(T);
    if (simulating_) {
      Simulated& c = simulated(count);
      if (c.available > 0)
        --c.available;
      else
        ++c.missing;
      if (++c.net > 0) c.high = std::max(c.high, static_cast<std::size_t>(c.net));
      count_in(simulated_live_, simulated_peak_, size);
      simulated_high_ = std::max(simulated_high_, simulated_live_);
      return dummy();
    }
    if (shapes_only_) {
      count_in(live_bytes_, peak_bytes_, size);
      return dummy();
    }
    T* p = pool_.acquire(count);
    count_in(live_bytes_, peak_bytes_, size);
    return p;
  }

  /// Frees `p` (a buffer for `s`, or null) and nulls it. Never throws.
  template <class S>
  void free(T*& p, const S& s) noexcept {
    if (p) free_elements(p, static_cast<std::size_t>(s.numel()));
  }
  /// Frees `p` (a buffer of `count` elements, not null) and nulls it. Never throws.
  void free_elements(T*& p, std::size_t count) noexcept {
    if (simulating_) {
      Simulated& c = simulated(count);
      ++c.available;
      --c.net;
      simulated_live_ -= count * sizeof(T);
    } else {
      if (!shapes_only_) pool_.release(p, count);
      live_bytes_ -= count * sizeof(T);
    }
    p = nullptr;
  }

  /// `p` (a buffer of `count` elements) leaves the tape: its new owner frees it. `replacement`, a buffer of the
  /// same size from the same allocator or null, joins the pool in its place. Never throws.
  ///
  /// Without a replacement (a Parameter's first gradient), the dry run counts one more buffer of this
  /// size as missing, so the reservation before the real pass obtains it and it stays in the pool: the
  /// next step, which hands the tape's buffer over again and only then gets the Parameter's previous one
  /// back, finds it there. Otherwise the second step of a training loop would allocate one buffer per
  /// Parameter.
  void hand_over_elements(T*& p, std::size_t count, T* replacement) noexcept {
    if (simulating_) {
      Simulated& c = simulated(count);
      if (replacement) {
        ++c.available;
        --c.net;  // counted as a free: the replacement joins the free list
      } else {
        ++c.missing;
        ++c.forced;
      }
      simulated_live_ -= count * sizeof(T);
    } else {
      if (!shapes_only_) pool_.exchange(count, replacement);  // shapes-only: the Parameter keeps its buffer
      live_bytes_ -= count * sizeof(T);
    }
    p = nullptr;
  }

  // ---- all-or-nothing allocation for recording ----
  /// Buffers make_room() obtained from the system, per size, so that give_back() can return them.
  struct Room {
    std::size_t count[3] = {0, 0, 0};
    std::size_t added[3] = {0, 0, 0};
  };

  /// Makes the free lists hold a buffer for each non-empty shape of `shapes` (an op's value, extra and
  /// temporary), so that allocating them cannot throw. All or nothing: throws std::bad_alloc with the pool
  /// as it was. Not during a simulation. Nothing to do when shapes-only.
  Room make_room(const Shape& a, const Shape& b, const Shape& c = Shape{}) {
    if (shapes_only_) return Room{};
    return make_room(static_cast<std::size_t>(a.numel()), static_cast<std::size_t>(b.numel()),
                     static_cast<std::size_t>(c.numel()));
  }
  /// The same for buffers of `a`, `b` and `c` elements (0: none).
  Room make_room(std::size_t a, std::size_t b, std::size_t c) {
    if (b == 0 && c == 0) return make_room(a);  // most ops, inlined: no call on every record
    return make_room_of_three(a, b, c);
  }

  /// The same for a single buffer of `count` elements (most ops: a value and nothing else), with one
  /// free-list lookup in the usual case where the pool holds one.
  Room make_room(std::size_t count) {
    Room r;
    if (shapes_only_ || count == 0 || pool_.available(count) > 0) return r;
    pool_.reserve(count, 1);  // all or nothing
    r.count[0] = count;
    r.added[0] = 1;
    return r;
  }

  /// Makes the free lists hold a buffer for every one of `outputs[0 … n)` at once (the values of an op
  /// recorded as several nodes, such as concat_cols of k parts), so that none of those records can miss.
  /// All or nothing: throws std::bad_alloc with the pool as it was. The buffers stay cached once used.
  void make_room(const Shape* outputs, std::size_t n) {
    if (shapes_only_) return;
    // Member scratch, kept with its capacity: a steady training loop's joins allocate nothing here.
    std::vector<std::pair<std::size_t, std::size_t>>& wanted = join_wanted_;  // (elements, buffers)
    std::vector<std::size_t>& added = join_added_;
    wanted.clear();
    wanted.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto count = static_cast<std::size_t>(outputs[i].numel());
      auto it = std::find_if(wanted.begin(), wanted.end(), [count](const auto& w) { return w.first == count; });
      if (it == wanted.end())
        wanted.emplace_back(count, 1);  // within capacity
      else
        ++it->second;
    }
    added.assign(wanted.size(), 0);
    std::size_t done = 0;
    try {
      for (; done < wanted.size(); ++done) {
        const std::size_t have = pool_.available(wanted[done].first);
        added[done] = wanted[done].second > have ? wanted[done].second - have : 0;
        pool_.reserve(wanted[done].first, added[done]);  // all or nothing
      }
    } catch (...) {
      for (std::size_t i = 0; i < done; ++i) pool_.discard(wanted[i].first, added[i]);
      throw;
    }
  }

  /// Undoes make_room() once the buffers allocated since have been freed again: the pool, and so
  /// cached_bytes(), are as before it. Never throws.
  void give_back(const Room& r) noexcept {
    for (int i = 0; i < 3; ++i)
      if (r.added[i] > 0) pool_.discard(r.count[i], r.added[i]);
  }

  /// Puts peak_bytes() back to `peak` (≥ live_bytes()) after undoing allocations. Never throws.
  void restore_peak(std::size_t peak) noexcept {
    assert(peak >= live_bytes_);
    peak_bytes_ = peak;
  }

  // ---- simulation (a dry run of a backward sweep) ----
  /// Makes room to simulate buffers of `count` elements. Throws std::bad_alloc; call it for every size
  /// the simulated sequence uses before changing anything.
  void prepare_simulation(std::size_t count) { simulated_[count]; }

  /// From now on allocate/free only count, starting from the pool's current free lists. Never throws.
  void begin_simulation() noexcept {
    for (auto& [count, c] : simulated_) c = Simulated{pool_.available(count)};
    simulated_live_ = live_bytes_;
    simulated_peak_ = peak_bytes_;
    simulated_high_ = live_bytes_;
    simulated_start_ = live_bytes_;
    simulating_ = true;
  }
  /// Ends the simulation; returns the peak live bytes the simulated sequence would reach.
  std::size_t end_simulation() noexcept {
    simulating_ = false;
    return simulated_peak_;
  }
  /// Makes the pool hold what the last simulation found missing, all or nothing. Throws std::bad_alloc.
  void reserve_simulated() {
    if (shapes_only_) return;  // placeholders: nothing to reserve
    std::size_t done = 0;
    try {
      for (auto& [count, c] : simulated_) {
        if (c.missing > 0) pool_.reserve(count, c.missing);
        ++done;
      }
    } catch (...) {
      // Undo the size classes already reserved so the pool is as it was.
      for (auto& [count, c] : simulated_) {
        if (done-- == 0) break;
        if (c.missing > 0) pool_.discard(count, c.missing);
      }
      throw;
    }
  }
  /// True between begin_simulation() and end_simulation().
  bool simulating() const { return simulating_; }

  // ---- what the last simulated sequence needs, whatever the pool held (Sweep: skipping a dry run) ----
  /// The allocate/free sequence never reads the pool, so what it needs of it is a property of the sequence
  /// alone: per size, `high` buffers at once (the most allocated and not yet freed at any point: with A in
  /// the free list it misses max(0, high − A) times) and `forced` hand-overs without a replacement (each
  /// one a buffer the reservation adds whatever A is). The sequence also raises live bytes by at most
  /// `rise` above where it started.
  struct Demand {
    std::size_t count = 0, high = 0, forced = 0;
    bool operator==(const Demand& o) const { return count == o.count && high == o.high && forced == o.forced; }
  };
  /// Calls f(Demand) for every size prepared for simulation.
  template <class F>
  void for_each_simulated_demand(F&& f) const {
    for (const auto& [count, c] : simulated_) f(Demand{count, c.high, c.forced});
  }
  /// How many sizes are prepared for simulation (Demands for_each_simulated_demand calls f with).
  std::size_t simulated_sizes() const { return simulated_.size(); }
  std::size_t simulated_rise() const { return simulated_high_ - simulated_start_; }
  /// Whether a sequence with demand `d` would find every buffer in the pool now (the reservation after
  /// its simulation would add none).
  bool covers(const Demand& d) const { return d.forced == 0 && pool_.available(d.count) >= d.high; }
  /// The peak a sequence that raises live bytes by at most `rise` leaves, run from now: what its
  /// simulation's end_simulation() would return.
  std::size_t peak_after_rise(std::size_t rise) const { return std::max(peak_bytes_, live_bytes_ + rise); }
  /// The live bytes at this point of the running sequence: simulated ones during a simulation.
  std::size_t current_live_bytes() const { return simulating_ ? simulated_live_ : live_bytes_; }
  std::size_t live_bytes() const { return live_bytes_; }
  std::size_t peak_bytes() const { return peak_bytes_; }
  /// memory().peak_bytes: in a measured stretch, its peak so far (peak_bytes() is its current segment's).
  std::size_t reported_peak_bytes() const { return measuring_ ? std::max(earlier_peak_, peak_bytes_) : peak_bytes_; }
  void reset_peak() { peak_bytes_ = live_bytes_; }

  // ---- a measured stretch (checkpoint_sequential_auto's probe) ----
  /// What a stretch of recording measures: its peak, and the peak it would have reached had the buffers
  /// freed in it that a region saving its ops keeps (retained: values a backward reads, op extras) stayed.
  struct Measure {
    std::size_t peak = 0, retained_peak = 0;
    // The stretch's state (saved by begin_measure for an enclosing stretch): the peak before the current
    // segment (a segment ends at each retained free), the retained bytes so far, whether measuring.
    std::size_t earlier_peak = 0, retained = 0;
    bool measuring = false;
  };
  /// Starts a stretch: peak_bytes() drops to live_bytes(). Returns what end_measure() restores.
  Measure begin_measure() noexcept {
    Measure saved{peak_bytes_, retained_peak_, earlier_peak_, retained_, measuring_};
    peak_bytes_ = live_bytes_;
    retained_peak_ = earlier_peak_ = retained_ = 0;
    measuring_ = true;
    return saved;
  }
  /// Ends the stretch begun by the begin_measure() that returned `saved` and returns its two peaks; an
  /// enclosing stretch goes on with this one counted in it, and peak_bytes() keeps the larger peak.
  Measure end_measure(const Measure& saved) noexcept {
    Measure m;
    m.peak = std::max(earlier_peak_, peak_bytes_);
    m.retained_peak = std::max(retained_peak_, peak_bytes_ + retained_);
    measuring_ = saved.measuring;
    if (measuring_) {  // the enclosing stretch: its segment before this one, then this one's frees
      retained_peak_ = std::max({saved.retained_peak, saved.peak + saved.retained, m.retained_peak + saved.retained});
      earlier_peak_ = std::max({saved.earlier_peak, saved.peak, m.peak});
      retained_ = saved.retained + retained_;
      peak_bytes_ = live_bytes_;
    } else {
      retained_peak_ = earlier_peak_ = retained_ = 0;
      peak_bytes_ = std::max(saved.peak, m.peak);
    }
    return m;
  }
  bool measuring() const { return measuring_; }
  /// In a stretch, after freeing `b` bytes a saving region would have kept. Never throws.
  void count_retained(std::size_t b) noexcept {
    if (simulating_) return;  // an eviction's trial: the real pass frees it again
    // live + retained only rises at an allocation: its peak over a segment is the segment's peak + retained.
    earlier_peak_ = std::max(earlier_peak_, peak_bytes_);
    retained_peak_ = std::max(retained_peak_, peak_bytes_ + retained_);
    retained_ += b;
    peak_bytes_ = live_bytes_;
  }
  std::size_t cached_bytes() const { return pool_.cached_bytes(); }
  void trim() { pool_.trim(); }

 private:
  /// make_room(a, b, c) with an extra or a temporary: all or nothing, as make_room.
  [[gnu::noinline]] Room make_room_of_three(std::size_t a, std::size_t b, std::size_t c) {
    if (shapes_only_) return Room{};
    const std::size_t sizes[3] = {a, b, c};
    Room r;
    int used = 0;
    try {
      for (int i = 0; i < 3; ++i) {
        if (sizes[i] == 0) continue;
        bool seen = false;
        for (int j = 0; j < i; ++j) seen = seen || sizes[j] == sizes[i];
        if (seen) continue;
        std::size_t want = 0;
        for (int j = 0; j < 3; ++j) want += sizes[j] == sizes[i] ? 1 : 0;
        const std::size_t have = pool_.available(sizes[i]);
        const std::size_t need = want > have ? want - have : 0;
        pool_.reserve(sizes[i], need);  // all or nothing
        r.count[used] = sizes[i];
        r.added[used] = need;
        ++used;
      }
    } catch (...) {
      give_back(r);
      throw;
    }
    return r;
  }

  struct Simulated {
    std::size_t available = 0;  // buffers in the free list at this point of the simulated sequence
    std::size_t missing = 0;    // allocations the free list could not have served
    std::size_t high = 0;       // the most of net, over the sequence so far (Demand)
    std::size_t forced = 0;     // hand-overs without a replacement (Demand)
    std::ptrdiff_t net = 0;     // allocated minus freed so far (negative: it freed buffers of before)
  };

  static void count_in(std::size_t& live, std::size_t& peak, std::size_t b) {
    live += b;
    peak = std::max(peak, live);
  }
  static T* dummy() {
    alignas(64) static T slot[1];
    return slot;
  }
  Simulated& simulated(std::size_t count) noexcept {
    Simulated* c = simulated_.find(count);
    assert(c && "prepare_simulation() was not called for this size");
    return *c;
  }

  Pool<T> pool_;
  bool shapes_only_;
  std::size_t live_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  bool measuring_ = false;  // a measured stretch (Measure)
  std::size_t earlier_peak_ = 0, retained_ = 0, retained_peak_ = 0;
  bool simulating_ = false;
  SizeMap<Simulated> simulated_;
  std::size_t simulated_live_ = 0, simulated_peak_ = 0;
  std::size_t simulated_high_ = 0, simulated_start_ = 0;          // the most live bytes, where they started
  std::vector<std::pair<std::size_t, std::size_t>> join_wanted_;  // make_room(outputs, n)'s scratch
  std::vector<std::size_t> join_added_;
};

}  // namespace remat::detail
