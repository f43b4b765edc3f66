// conv2d's float kernels on oneDNN (Debian's libdnnl-dev, the library LibTorch's CPU convolutions call), when
// remat is built with it (REMAT_USE_ONEDNN, CMake's REMAT_USE_ONEDNN option). oneDNN's fast convolutions read
// and write blocked layouts (nChw16c on AVX-512): remat's NCHW tensors are reordered into them and back, as
// PyTorch's mkldnn_convolution does with plain tensors. Every buffer oneDNN uses — the blocked copies and the
// primitive's own scratchpad (scratchpad_mode::user) — lies in the op's scratch, so memory() counts it.
//
// Here are the plans' cache and the calls that run a plan; a plan itself, what selects it and how it is made, is
// onednn_conv_plan.hpp's.
#pragma once

#ifdef REMAT_USE_ONEDNN

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "remat/detail/onednn_conv_plan.hpp"
#include "remat/shape.hpp"
#include "remat/threads.hpp"

namespace remat::detail::onednn {

/// The plans of the convolutions seen lately, at most capacity() of them, the least recently used evicted first
/// (remat::backends::onednn::set_plan_cache_capacity). A plan is a function of its key, so a plan made again
/// after its eviction is the one evicted: the same primitives (oneDNN picks them from the key on the same CPU) and
/// the same scratch sizes. Callers hold plans by shared_ptr: an evicted plan lives on while a call runs on it.
/// One mutex guards the cache; a plan is made under it, as the map it replaces did (two threads never make the
/// same plan twice).
class PlanCache {
 public:
  /// What a cache holds unless set_capacity says otherwise: 64 plans, about 13 MB at 200 KB a plan.
  static constexpr std::size_t default_capacity = 64;

  /// The plan of `k`, the most recently used from now on; made (and the least recently used plan evicted if the
  /// cache is full) on a miss. Throws dnnl::error if oneDNN cannot run it, std::bad_alloc.
  std::shared_ptr<const ConvPlan> get(const ConvKey& k) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = index_.find(k);
    if (it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return it->second->second;
    }
    std::shared_ptr<const ConvPlan> p = make_plan(k);
    if (capacity_ == 0) return p;
    order_.emplace_front(k, p);
    try {
      index_.emplace(k, order_.begin());
    } catch (...) {
      order_.pop_front();
      throw;
    }
    trim();
    return p;
  }
  /// The number of plans held, ≤ capacity().
  std::size_t size() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return order_.size();
  }
  std::size_t capacity() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return capacity_;
  }
  /// Holds at most `plans` from now on, evicting the least recently used beyond it at once. Never throws.
  void set_capacity(std::size_t plans) {
    const std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = plans;
    trim();
  }

 private:
  using Entry = std::pair<ConvKey, std::shared_ptr<const ConvPlan>>;
  void trim() {
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }
  std::mutex mutex_;
  std::size_t capacity_ = default_capacity;
  std::list<Entry> order_;  // the most recently used first
  std::unordered_map<ConvKey, std::list<Entry>::iterator, ConvKeyHash> index_;
};

/// The process's plan cache.
inline PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

/// The plan of `k` from the process's cache (one per convolution shape and thread count), made on a miss.
/// Hold the shared_ptr for as long as the plan is used: another call may evict it from the cache meanwhile.
/// Throws dnnl::error if oneDNN cannot run it, std::bad_alloc.
inline std::shared_ptr<const ConvPlan> plan(const ConvKey& k) {
  return plan_cache().get(k);
}

/// A oneDNN memory over `data` in the layout `d`.
inline dnnl::memory wrap(const dnnl::memory::desc& d, const float* data) {
  return dnnl::memory(d, cpu_engine(), const_cast<float*>(data));  // oneDNN takes inputs as non-const handles
}

/// What the primitive reads for `s`: the plain tensor, or its copy in the scratch after a reorder.
inline dnnl::memory read(const Staged& s, const float* plain, float* scratch, dnnl::stream& st) {
  if (s.offset < 0) return wrap(s.plain, plain);
  dnnl::memory from = wrap(s.plain, plain), to = wrap(s.blocked, scratch + s.offset);
  s.to_blocked.execute(st, from, to);
  return to;
}

/// Writes (or adds, if `accumulate`) the scratch copy of `s` into the plain tensor `plain`.
inline void write(const Staged& s, float* scratch, float* plain, bool accumulate, dnnl::stream& st) {
  if (s.offset < 0) return;  // the primitive wrote the plain tensor itself
  dnnl::memory from = wrap(s.blocked, scratch + s.offset), to = wrap(s.plain, plain);
  (accumulate ? s.add_to_plain : s.to_plain).execute(st, from, to);
}

inline dnnl::memory where(const Staged& s, float* plain, float* scratch) {
  return s.offset < 0 ? wrap(s.plain, plain) : wrap(s.blocked, scratch + s.offset);
}

/// The plan of `key`, which was made before (an op was recorded on it), from the cache or made again if the cache
/// has evicted it: the same plan, with the same scratch sizes. Throws std::bad_alloc if making it again runs out of
/// memory, std::logic_error if oneDNN refuses what it accepted before (a bug: never seen).
inline std::shared_ptr<const ConvPlan> plan_again(const ConvKey& key) {
  try {
    return plan(key);
  } catch (const dnnl::error& e) {
    if (e.status == dnnl_out_of_memory) throw std::bad_alloc();
    throw std::logic_error(std::string("conv2d: oneDNN refused again a convolution it planned before: ") + e.what());
  }
}

/// The plan of `key` (made when the op was recorded, at the thread count it was recorded with): an op runs every
/// call — its forward, a replay's or a budget's regeneration, its backward — on that plan, so a replay reproduces
/// the recorded value bitwise whatever the thread setting is now. The op's temporary holds `floats` floats, the
/// plan's size when recorded; a plan made again after an eviction has that size too, as it is checked here (a
/// larger one would write past the temporary). Throws what plan_again throws, and std::logic_error if the plan is
/// no longer usable or needs more than `floats` (a bug: never seen).
inline std::shared_ptr<const ConvPlan> recorded_plan(const ConvKey& key, std::int64_t floats) {
  std::shared_ptr<const ConvPlan> p = plan_again(key);
  if (!p->usable || p->floats() > floats)
    throw std::logic_error("conv2d: oneDNN's plan made again needs " + std::to_string(p->floats()) +
                           " floats of scratch, the recorded op has " + std::to_string(floats));
  return p;
}

/// The calling thread's oneDNN stream (CPU streams execute in order on the calling thread).
inline dnnl::stream& stream() {
  static thread_local dnnl::stream s(cpu_engine());
  return s;
}

/// y = conv(x, w) (+ b) into the plain [N, O, Hout, Wout] output `y`; `b` is null without a bias. `scratch`
/// holds `floats` floats.
inline void forward(const ConvKey& key, std::int64_t floats, const float* x, const float* w, const float* b, float* y,
                    float* scratch) {
  const std::shared_ptr<const ConvPlan> held = recorded_plan(key, floats);
  const ConvPlan& p = *held;
  const OmpThreads threads(p.threads);
  dnnl::stream& st = stream();
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, read(p.src, x, scratch, st)},
      {DNNL_ARG_WEIGHTS, read(p.weights, w, scratch, st)},
      {DNNL_ARG_DST, where(p.dst, y, scratch)},
      {DNNL_ARG_SCRATCHPAD, wrap(p.forward_pad, scratch + p.forward_scratchpad)}};
  if (b) args.emplace(DNNL_ARG_BIAS, wrap(p.bias, b));
  p.forward.execute(st, args);
  write(p.dst, scratch, y, false, st);
  st.wait();
}

/// dx of the convolution from dy, written or, with `accumulate`, added into the plain dx. Leaves dY in
/// backward_data's layout in the scratch, where backward_weights may read it.
inline void backward_data(const ConvKey& key, std::int64_t floats, const float* w, const float* dy, float* dx,
                          bool accumulate, float* scratch) {
  const std::shared_ptr<const ConvPlan> held = recorded_plan(key, floats);
  const ConvPlan& p = *held;
  const OmpThreads threads(p.threads);
  dnnl::stream& st = stream();
  p.backward_data.execute(st, {{DNNL_ARG_DIFF_DST, read(p.diff_dst_data, dy, scratch, st)},
                               {DNNL_ARG_WEIGHTS, read(p.weights_data, w, scratch, st)},
                               {DNNL_ARG_DIFF_SRC, where(p.diff_src, dx, scratch)},
                               {DNNL_ARG_SCRATCHPAD, wrap(p.data_pad, scratch + p.data_scratchpad)}});
  write(p.diff_src, scratch, dx, accumulate, st);
  st.wait();
}

/// dw of the convolution from x and dy, written or, with `accumulate`, added into the plain dw. `dy_staged`:
/// backward_data has just run on this scratch, so its copy of dY is there.
inline void backward_weights(const ConvKey& key, std::int64_t floats, const float* x, const float* dy, float* dw,
                             bool accumulate, bool dy_staged, float* scratch) {
  const std::shared_ptr<const ConvPlan> held = recorded_plan(key, floats);
  const ConvPlan& p = *held;
  const OmpThreads threads(p.threads);
  dnnl::stream& st = stream();
  const bool shared = dy_staged && p.diff_dst_weights.offset == p.diff_dst_data.offset;
  const dnnl::memory dy_weights =
      shared ? where(p.diff_dst_weights, const_cast<float*>(dy), scratch) : read(p.diff_dst_weights, dy, scratch, st);
  p.backward_weights.execute(st, {{DNNL_ARG_SRC, read(p.src_weights, x, scratch, st)},
                                  {DNNL_ARG_DIFF_DST, dy_weights},
                                  {DNNL_ARG_DIFF_WEIGHTS, where(p.diff_weights, dw, scratch)},
                                  {DNNL_ARG_SCRATCHPAD, wrap(p.weights_pad, scratch + p.weights_scratchpad)}});
  write(p.diff_weights, scratch, dw, accumulate, st);
  st.wait();
}

}  // namespace remat::detail::onednn

#endif  // REMAT_USE_ONEDNN
