// Switches between kernel libraries, as torch.backends.mkldnn: whether remat was built with oneDNN and whether
// the ops that can use it do.
#pragma once

#include <atomic>

namespace remat::backends::onednn {

namespace detail {
#ifdef REMAT_USE_ONEDNN
inline std::atomic<bool> enabled_flag{true};
#else
inline std::atomic<bool> enabled_flag{false};
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

}  // namespace remat::backends::onednn
