// Switches between kernel libraries, as torch.backends.mkldnn: whether remat was built with oneDNN, whether
// the ops that can use it do, and how many oneDNN convolution plans are kept.
#pragma once

#include <atomic>
#include <cstddef>

#include "remat/detail/onednn_conv.hpp"

namespace remat::backends::onednn {

namespace detail {
#ifdef REMAT_USE_ONEDNN
inline std::atomic<bool> enabled_flag{true};
#else
inline std::atomic<bool> enabled_flag{false};
inline std::atomic<std::size_t> plan_capacity{64};  // kept for plan_cache_capacity() alone: there are no plans
#endif
}  // namespace detail

/// Whether remat was built with oneDNN (CMake's REMAT_USE_ONEDNN, on when Debian's libdnnl-dev is found), as
/// torch.backends.mkldnn.is_available().
constexpr bool is_available() {
#ifdef REMAT_USE_ONEDNN
  return true;
#else
  return false;
#endif
}

/// Whether ops recorded from now on run their float kernels on oneDNN where they can (conv2d); true by
/// default when is_available(). Double-precision ops never do (oneDNN has no f64 convolution on CPUs).
inline bool enabled() {
  return detail::enabled_flag.load(std::memory_order_relaxed);
}

/// Turns oneDNN on or off for ops recorded from now on (as torch.backends.mkldnn.enabled = on): an op keeps the
/// kernels it was recorded with, in its backward and any replay. Process-wide. Turning it on without
/// is_available() changes nothing.
inline void set_enabled(bool on) {
  detail::enabled_flag.store(on && is_available(), std::memory_order_relaxed);
}

/// How many oneDNN convolution plans the process keeps at most (64 unless set_plan_cache_capacity changed it). A
/// plan is what conv2d needs to run one convolution shape (batch, channels, image and kernel sizes, options) at
/// one thread count on oneDNN: its primitives (JIT-compiled kernels) and its scratch layout, about 200 KB. Plans
/// are kept in least-recently-used order; a program that sees more distinct shapes than this makes an evicted
/// plan again when it meets its shape again: oneDNN's primitive creation, cheaper while oneDNN's own primitive
/// cache (dnnl::set_primitive_cache_capacity) still holds the kernels than when it compiles them again. A plan
/// made again is the evicted one — the same kernels and scratch sizes, so the same values bitwise and the same bytes in
/// memory()'s peak — so an op whose plan was evicted between its record and its backward or replay runs as it would
/// have. Thread-safe.
inline std::size_t plan_cache_capacity() {
#ifdef REMAT_USE_ONEDNN
  return ::remat::detail::onednn::plan_cache().capacity();
#else
  return detail::plan_capacity.load(std::memory_order_relaxed);
#endif
}

/// Keeps at most `plans` oneDNN convolution plans from now on (see plan_cache_capacity), evicting the least
/// recently used beyond that at once; 0 keeps none, so every conv2d call makes its plan again (slow: for
/// tests). Process-wide and thread-safe; never throws. Without oneDNN it only sets what plan_cache_capacity()
/// returns.
inline void set_plan_cache_capacity(std::size_t plans) {
#ifdef REMAT_USE_ONEDNN
  ::remat::detail::onednn::plan_cache().set_capacity(plans);
#else
  detail::plan_capacity.store(plans, std::memory_order_relaxed);
#endif
}

/// How many oneDNN convolution plans the process keeps now, at most plan_cache_capacity(); 0 without oneDNN.
/// Thread-safe.
inline std::size_t cached_plans() {
#ifdef REMAT_USE_ONEDNN
  return ::remat::detail::onednn::plan_cache().size();
#else
  return 0;
#endif
}

}  // namespace remat::backends::onednn
