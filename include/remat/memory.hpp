// Memory statistics and the pooling allocator every tape-owned tensor buffer goes through.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <unordered_map>
#include <vector>

namespace remat {

/// Exact byte counts of tape-owned tensor buffers (rows * cols * sizeof(T) each; pool rounding and
/// bookkeeping are not included). Parameters referenced with Tape::variable(Parameter&) are not
/// tape-owned and are not counted.
struct MemoryStats {
  std::size_t live_bytes = 0;      ///< buffers allocated now: values, op residual extras, gradients
  std::size_t peak_bytes = 0;      ///< maximum of live_bytes since the tape was created or cleared
  std::size_t saved_bytes = 0;     ///< buffers held now because a pending backward (or replay) needs them
  std::size_t replayed_bytes = 0;  ///< bytes recomputed by checkpoint replay in the last backward
  std::size_t replayed_ops = 0;    ///< ops re-executed by checkpoint replay in the last backward
  std::size_t cached_bytes = 0;    ///< bytes kept in the pool's free lists for reuse
};

namespace detail {

/// Exact-size free lists: a training loop allocates the same shapes every step, so after the first
/// step every request is served from a list and no malloc happens on the hot path.
template <class T>
class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() { trim(); }

  T* acquire(std::size_t count) {
    auto it = free_.find(count);
    if (it != free_.end() && !it->second.empty()) {
      T* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= count * sizeof(T);
      return p;
    }
    return static_cast<T*>(Eigen::internal::aligned_malloc(count * sizeof(T)));
  }

  void release(T* p, std::size_t count) {
    free_[count].push_back(p);
    cached_bytes_ += count * sizeof(T);
  }

  /// Returns every cached buffer to the system.
  void trim() {
    for (auto& [count, list] : free_)
      for (T* p : list) Eigen::internal::aligned_free(p);
    free_.clear();
    cached_bytes_ = 0;
  }

  std::size_t cached_bytes() const { return cached_bytes_; }

 private:
  std::unordered_map<std::size_t, std::vector<T*>> free_;
  std::size_t cached_bytes_ = 0;
};

}  // namespace detail
}  // namespace remat
