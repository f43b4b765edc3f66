// The pooling allocator under Buffers (buffers.hpp): buffers kept by exact size and handed out again, and the
// flat size map it indexes them with (Buffers' dry run counts in one too). Apart from Buffers' accounting
// because it knows nothing of tapes, live bytes or dry runs: only sizes and free lists.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

namespace remat::detail {

/// Test hook: when set, called with the byte count before every system allocation of a tensor buffer
/// (a pool miss); it may throw std::bad_alloc to simulate exhaustion. Null in normal use.
inline thread_local void (*allocation_hook)(std::size_t bytes) = nullptr;

/// A map from a buffer size (elements) to V: a step uses a handful of distinct sizes (W0: 8), so a flat
/// vector, searched linearly, costs less than hashing into a node-based map on every allocate and free
/// (bench/probes/README.md). In front of the search, a direct-mapped table from a hash of the size to where
/// it was last found: a backward alternates between several sizes (W0: a weight's, a bias's and an
/// activation's gradient per layer), which a single last-hit index would serve one time in three.
/// A table slot is only a hint, checked against the entry (entries are never removed), so a collision
/// costs the search, never a wrong entry. References stay valid until the next insertion.
template <class V>
class SizeMap {
 public:
  /// The entry for `count`, or null.
  V* find(std::size_t count) noexcept { return const_cast<V*>(std::as_const(*this).find(count)); }
  /// The hint's test is inlined into every allocate and free; the search is not, so that it does not keep them
  /// from inlining this (with N-D shapes, Buffers::allocate and free outgrew the inliner's limit with it, and
  /// each find became a call).
  const V* find(std::size_t count) const noexcept {
    const std::uint32_t hint = hints_[slot(count)];
    if (hint != 0 && entries_[hint - 1].first == count) return &entries_[hint - 1].second;
    return search(count);
  }
  /// The entry for `count`, or null, by a linear search that updates its hint.
  [[gnu::noinline]] const V* search(std::size_t count) const noexcept {
    std::uint32_t& hint = hints_[slot(count)];
    const std::size_t n = entries_.size();
    for (std::size_t i = 0; i < n; ++i)
      if (entries_[i].first == count) {
        hint = static_cast<std::uint32_t>(i + 1);
        return &entries_[i].second;
      }
    return nullptr;
  }
  /// The entry for `count`, value-initialised if new. Throws std::bad_alloc with the map unchanged.
  V& operator[](std::size_t count) {
    if (V* v = find(count)) return *v;
    return insert(count);
  }
  /// A new entry for `count`, value-initialised (out of line, as search(): the usual call finds its entry).
  [[gnu::noinline]] V& insert(std::size_t count) {
    entries_.emplace_back(count, V{});
    hints_[slot(count)] = static_cast<std::uint32_t>(entries_.size());
    return entries_.back().second;
  }
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.end(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }
  std::size_t size() const { return entries_.size(); }

 private:
  static constexpr int hint_bits = 4;
  static std::size_t slot(std::size_t count) {  // Fibonacci hashing: the top bits of count · 2^64/φ
    return static_cast<std::size_t>((static_cast<std::uint64_t>(count) * 0x9E3779B97F4A7C15ull) >> (64 - hint_bits));
  }
  std::vector<std::pair<std::size_t, V>> entries_;
  mutable std::uint32_t hints_[1u << hint_bits] = {};  // per slot: 1 + the index where a size of it was found, 0: none
};

/// Exact-size free lists: a training loop allocates the same shapes every step, so after the first step
/// every request is served from a list and no malloc happens on the hot path. Every list has room for
/// every buffer of its size that the pool ever handed out, so returning a buffer never allocates.
template <class T>
class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() { trim(); }

  /// A buffer of `count` elements, from the free list or the system. Throws std::bad_alloc.
  T* acquire(std::size_t count) {
    SizeClass& c = classes_[count];
    if (!c.free.empty()) {
      T* p = c.free.back();
      c.free.pop_back();
      cached_bytes_ -= count * sizeof(T);
      return p;
    }
    return system_allocate(c, count);
  }

  /// Returns a buffer that acquire() handed out (or one adopted in exchange, see exchange()). Never throws.
  void release(T* p, std::size_t count) noexcept {
    SizeClass& c = *classes_.find(count);
    c.free.push_back(p);  // within capacity: reserved when the buffer was allocated
    cached_bytes_ += count * sizeof(T);
  }

  /// A buffer of `count` elements leaves the pool for good (a Parameter adopts it as its gradient); `other`,
  /// a buffer of the same size or null, takes its place in the free list. Never throws.
  void exchange(std::size_t count, T* other) noexcept {
    SizeClass& c = *classes_.find(count);
    if (other) {
      c.free.push_back(other);
      cached_bytes_ += count * sizeof(T);
    } else {
      --c.total;
    }
  }

  /// Buffers of `count` elements in the free list now.
  std::size_t available(std::size_t count) const {
    const SizeClass* c = classes_.find(count);
    return c ? c->free.size() : 0;
  }

  /// Adds `n` system-allocated buffers of `count` elements to the free list; all or nothing.
  void reserve(std::size_t count, std::size_t n) {
    SizeClass& c = classes_[count];
    std::size_t added = 0;
    try {
      for (; added < n; ++added) {
        T* p = system_allocate(c, count);
        c.free.push_back(p);
        cached_bytes_ += count * sizeof(T);
      }
    } catch (...) {
      for (; added > 0; --added) {
        Eigen::internal::aligned_free(c.free.back());
        c.free.pop_back();
        --c.total;
        cached_bytes_ -= count * sizeof(T);
      }
      throw;
    }
  }

  /// Returns `n` buffers of `count` elements from the free list to the system (undoes reserve()).
  void discard(std::size_t count, std::size_t n) noexcept {
    SizeClass& c = *classes_.find(count);
    for (std::size_t i = 0; i < n && !c.free.empty(); ++i) {
      Eigen::internal::aligned_free(c.free.back());
      c.free.pop_back();
      --c.total;
      cached_bytes_ -= count * sizeof(T);
    }
  }

  /// Returns every cached buffer to the system.
  void trim() {
    for (auto& [count, c] : classes_) {
      for (T* p : c.free) Eigen::internal::aligned_free(p);
      c.total -= c.free.size();
      c.free.clear();
    }
    cached_bytes_ = 0;
  }

  std::size_t cached_bytes() const { return cached_bytes_; }

 private:
  struct SizeClass {
    std::vector<T*> free;
    std::size_t total = 0;  // buffers of this size handed out and not returned to the system
  };

  T* system_allocate(SizeClass& c, std::size_t count) {
    if (allocation_hook) allocation_hook(count * sizeof(T));
    c.free.reserve(c.total + 1);  // room to return it later without allocating
    T* p = static_cast<T*>(Eigen::internal::aligned_malloc(count * sizeof(T)));
    ++c.total;
    return p;
  }

  SizeMap<SizeClass> classes_;
  std::size_t cached_bytes_ = 0;
};

}  // namespace remat::detail
