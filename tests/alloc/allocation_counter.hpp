// Counts every heap allocation of the process and injects allocation failures, for the allocation tests
// in this directory.
//
// THIS HEADER DEFINES (not only declares) the replaceable global allocation functions: every form of
// operator new / delete and, outside AddressSanitizer builds, malloc, calloc, realloc, reallocarray, free,
// aligned_alloc, posix_memalign, memalign, valloc and pvalloc (forwarded to glibc's __libc_* entry
// points). Include it in exactly ONE translation unit, and only in a test that is its own executable
// (tests/CMakeLists.txt builds every tests/alloc/*_test.cpp as a separate program for that reason).
//
// Counting (remat_alloc::Count): every malloc-family call of any thread while a Count is active. Under
// AddressSanitizer malloc cannot be interposed; the allocations are counted through
// __sanitizer_install_malloc_and_free_hooks instead (operator new is still replaced: it calls malloc).
// A call made from inside OpenBLAS (a frame of its stack lies in libopenblas's code) is OpenBLAS's and is
// counted apart (Counts::blas_allocations, blas_frees): OpenBLAS 0.3.21's AVX-512 small-matrix sgemm
// kernels (its SKYLAKEX and COOPERLAKE targets, chosen on Zen 4/5 and Intel AVX-512 machines unless
// OPENBLAS_CORETYPE says otherwise) malloc and free a packing buffer on every call (docs/design.md §2.5).
//
// Fault injection (remat_alloc::Injection): on the calling thread, "allocation events" are counted and the
// k-th one fails with std::bad_alloc. An event is
//   - a call of operator new (any form; the nothrow forms return null instead of throwing),
//   - a call of remat::detail::allocation_hook (a pool miss: the tape asks the system for a tensor buffer),
//   - in builds without AddressSanitizer, any other malloc-family call (an Eigen temporary, a Matrix),
//     which fails by returning null (Eigen's aligned_malloc turns that into std::bad_alloc).
// The malloc behind an operator new or behind a pool miss is part of that event, not another one.
// REMAT_ALLOC_TRACE=1 in the environment prints a stack trace of every allocation a Count counts.
#pragma once

#include <execinfo.h>
#include <link.h>
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "remat/detail/buffers.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define REMAT_ALLOC_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REMAT_ALLOC_ASAN 1
#endif
#endif

#ifdef REMAT_ALLOC_ASAN
#include <sanitizer/common_interface_defs.h>
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, std::size_t),
                                                         void (*free_hook)(const volatile void*));
#else
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void* __libc_valloc(std::size_t);
void* __libc_pvalloc(std::size_t);
void __libc_free(void*);
}
#endif

namespace remat_alloc {

/// True in AddressSanitizer builds: plain malloc calls are counted but cannot be made to fail.
#ifdef REMAT_ALLOC_ASAN
inline constexpr bool sanitizer_build = true;
#else
inline constexpr bool sanitizer_build = false;
#endif

/// Allocations counted while a Count was active.
struct Counts {
  long allocations = 0;   ///< malloc-family calls of every thread (operator new included: it calls malloc)
  long this_thread = 0;   ///< those of the thread that made the Count
  long frees = 0;         ///< free calls with a non-null pointer
  std::size_t bytes = 0;  ///< bytes requested by those allocations
  long blas_allocations = 0, blas_frees = 0;  ///< OpenBLAS's own (made inside it): not in the figures above
};

namespace detail {

// Everything here is constant-initialised: malloc runs before any dynamic initialiser.
inline std::atomic<bool> counting{false};
inline std::atomic<long> allocations{0}, frees{0};
inline std::atomic<std::size_t> bytes{0};
inline std::atomic<long> blas_allocations{0}, blas_frees{0};
inline bool trace = false;

// OpenBLAS's code (its executable segments), found at start-up: it is linked, so loaded before any
// dynamic initialiser runs.
struct CodeRange {
  std::uintptr_t begin = 0, end = 0;
};
inline CodeRange blas_code[8];
inline int blas_ranges = 0;
inline int find_blas(dl_phdr_info* info, std::size_t, void*) {
  if (!info->dlpi_name || !std::strstr(info->dlpi_name, "openblas")) return 0;
  for (int i = 0; i < info->dlpi_phnum && blas_ranges < 8; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_LOAD || !(segment.p_flags & PF_X)) continue;
    const std::uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
    blas_code[blas_ranges++] = CodeRange{begin, begin + segment.p_memsz};
  }
  return 0;
}

// Fault injection state of the calling thread (trivial types: no TLS constructor, no malloc).
inline thread_local bool armed = false;        // events are counted
inline thread_local int depth = 0;             // > 0: inside Injection::Scope (events count only there)
inline thread_local int paused = 0;            // > 0: inside Injection::Pause
inline thread_local long events = 0;           // events since arm()
inline thread_local long fail_at = 0;          // event number that fails; 0: never
inline thread_local bool fired = false;        // the failure happened
inline thread_local bool in_new = false;       // inside our operator new: its malloc is part of that event
inline thread_local bool pool_malloc = false;  // allocation_hook ran: the pool's next malloc is that event
inline thread_local bool in_trace = false;
inline thread_local long thread_allocations = 0;
inline thread_local bool in_backtrace = false;

/// Whether the allocation function running now was called from inside OpenBLAS: some frame of the first
/// few (this function's, the counter's, the allocator's, then its caller's) lies in OpenBLAS's code.
inline bool inside_blas() {
  if (blas_ranges == 0 || in_backtrace) return false;
  in_backtrace = true;
  void* frames[10];
  const int n = backtrace(frames, 10);
  in_backtrace = false;
  for (int f = 0; f < n; ++f)
    for (int r = 0; r < blas_ranges; ++r) {
      const auto pc = reinterpret_cast<std::uintptr_t>(frames[f]);
      if (pc >= blas_code[r].begin && pc < blas_code[r].end) return true;
    }
  return false;
}

inline void print_trace(std::size_t size) {
  if (in_trace) return;
  in_trace = true;
  char line[64];
  const int n = std::snprintf(line, sizeof line, "-- allocation of %zu bytes:\n", size);
  if (n > 0) (void)!write(2, line, static_cast<std::size_t>(n));
#ifdef REMAT_ALLOC_ASAN
  __sanitizer_print_stack_trace();
#else
  void* frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), 2);
#endif
  in_trace = false;
}

inline void note_allocation(std::size_t size) {
  if (!counting.load(std::memory_order_relaxed) || in_trace || in_backtrace) return;
  if (inside_blas()) {
    blas_allocations.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  allocations.fetch_add(1, std::memory_order_relaxed);
  ++thread_allocations;
  bytes.fetch_add(size, std::memory_order_relaxed);
  if (trace) print_trace(size);
}
inline void note_free(const volatile void* p) {
  if (!p || !counting.load(std::memory_order_relaxed) || in_trace || in_backtrace) return;
  (inside_blas() ? blas_frees : frees).fetch_add(1, std::memory_order_relaxed);
}

/// One allocation event on this thread; true if it must fail.
inline bool event() {
  if (!armed || depth == 0 || paused > 0) return false;
  ++events;
  if (events != fail_at) return false;
  fired = true;
  armed = false;  // one failure per arm(): the retry and the exception object allocate normally
  pool_malloc = false;
  return true;
}

/// A malloc-family call: an event of its own unless it belongs to an operator new or a pool miss.
inline bool malloc_event() {
  if (in_new) return false;
  if (pool_malloc) {
    pool_malloc = false;
    return false;
  }
  return event();
}

inline void pool_hook(std::size_t) {
  if (event()) throw std::bad_alloc();
  pool_malloc = true;
}

#ifdef REMAT_ALLOC_ASAN
inline void asan_malloc_hook(const volatile void*, std::size_t size) {
  note_allocation(size);
}
inline void asan_free_hook(const volatile void* p) {
  note_free(p);
}
#endif

struct Init {
  Init() {
    dl_iterate_phdr(&find_blas, nullptr);
    void* frames[2];
    backtrace(frames, 2);  // loads libgcc before the first counted allocation
    const char* t = std::getenv("REMAT_ALLOC_TRACE");
    if (t && *t && *t != '0') trace = true;
#ifdef REMAT_ALLOC_ASAN
    __sanitizer_install_malloc_and_free_hooks(&asan_malloc_hook, &asan_free_hook);
#endif
  }
};
inline Init init;

inline void* new_impl(std::size_t size, std::size_t alignment, bool nothrow) {
  if (size == 0) size = 1;
  for (;;) {
    if (event()) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    in_new = true;
    void* p = nullptr;
    if (alignment <= alignof(std::max_align_t)) {
      p = std::malloc(size);
    } else if (posix_memalign(&p, alignment, size) != 0) {
      p = nullptr;
    }
    in_new = false;
    if (p) return p;
    std::new_handler handler = std::get_new_handler();
    if (!handler) {
      if (nothrow) return nullptr;
      throw std::bad_alloc();
    }
    handler();
  }
}

/// operator delete's free, out of line: inlined, GCC warns that free() gets memory from operator new.
[[gnu::noinline]] inline void release(void* p) noexcept {
  std::free(p);
}

}  // namespace detail

/// Counts every heap allocation of the process (all threads) from construction to stop().
class Count {
 public:
  Count() {
    detail::allocations = 0;
    detail::frees = 0;
    detail::bytes = 0;
    detail::blas_allocations = 0;
    detail::blas_frees = 0;
    detail::thread_allocations = 0;
    detail::counting = true;
  }
  Count(const Count&) = delete;
  Count& operator=(const Count&) = delete;
  ~Count() { detail::counting = false; }
  Counts stop() {
    detail::counting = false;
    return Counts{detail::allocations.load(), detail::thread_allocations,      detail::frees.load(),
                  detail::bytes.load(),       detail::blas_allocations.load(), detail::blas_frees.load()};
  }
};

/// Fault injection on the calling thread (see the header comment). Events count only inside a Scope
/// and outside a Pause, so a test's own bookkeeping never fails.
class Injection {
 public:
  /// Installs remat::detail::allocation_hook for this thread and starts counting events; the
  /// `fail_at`-th fails (0: none, only count).
  explicit Injection(long fail_at) {
    detail::events = 0;
    detail::fail_at = fail_at;
    detail::fired = false;
    detail::pool_malloc = false;
    detail::armed = true;
    remat::detail::allocation_hook = &detail::pool_hook;
  }
  Injection(const Injection&) = delete;
  Injection& operator=(const Injection&) = delete;
  ~Injection() {
    detail::armed = false;
    detail::pool_malloc = false;
    remat::detail::allocation_hook = nullptr;
  }
  /// Events counted so far (up to and including the failing one).
  long events() const { return detail::events; }
  /// True once the failure was injected.
  bool fired() const { return detail::fired; }

  /// Events are counted while at least one Scope is alive (the calls under test).
  struct Scope {
    Scope() { ++detail::depth; }
    ~Scope() { --detail::depth; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };
  /// Suspends event counting (the test's own allocations inside a Scope).
  struct Pause {
    Pause() { ++detail::paused; }
    ~Pause() { --detail::paused; }
    Pause(const Pause&) = delete;
    Pause& operator=(const Pause&) = delete;
  };
};

}  // namespace remat_alloc

// ---- the replaced global allocation functions ----

void* operator new(std::size_t n) {
  return remat_alloc::detail::new_impl(n, 0, false);
}
void* operator new[](std::size_t n) {
  return remat_alloc::detail::new_impl(n, 0, false);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return remat_alloc::detail::new_impl(n, 0, true);
  } catch (...) {
    return nullptr;  // a new_handler threw
  }
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return operator new(n, t);
}
void* operator new(std::size_t n, std::align_val_t a) {
  return remat_alloc::detail::new_impl(n, static_cast<std::size_t>(a), false);
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return remat_alloc::detail::new_impl(n, static_cast<std::size_t>(a), false);
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return remat_alloc::detail::new_impl(n, static_cast<std::size_t>(a), true);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept {
  return operator new(n, a, t);
}
void operator delete(void* p) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete[](void* p) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete(void* p, std::size_t) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  remat_alloc::detail::release(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  remat_alloc::detail::release(p);
}

#ifndef REMAT_ALLOC_ASAN
// glibc supports replacing malloc in the executable ("Replacing malloc" in its manual): these count and
// forward to its own implementation. Eigen's aligned_malloc, the tape's pool and OpenBLAS call malloc.
extern "C" {
void* malloc(std::size_t n) noexcept {
  if (remat_alloc::detail::malloc_event()) return nullptr;
  remat_alloc::detail::note_allocation(n);
  return __libc_malloc(n);
}
void* calloc(std::size_t count, std::size_t n) noexcept {
  if (remat_alloc::detail::malloc_event()) return nullptr;
  remat_alloc::detail::note_allocation(count * n);
  return __libc_calloc(count, n);
}
void* realloc(void* p, std::size_t n) noexcept {
  if (remat_alloc::detail::malloc_event()) return nullptr;
  remat_alloc::detail::note_allocation(n);
  return __libc_realloc(p, n);
}
void* reallocarray(void* p, std::size_t count, std::size_t n) noexcept {
  std::size_t total;
  if (__builtin_mul_overflow(count, n, &total)) return nullptr;
  return realloc(p, total);
}
void free(void* p) noexcept {
  remat_alloc::detail::note_free(p);
  __libc_free(p);
}
void* memalign(std::size_t alignment, std::size_t n) noexcept {
  if (remat_alloc::detail::malloc_event()) return nullptr;
  remat_alloc::detail::note_allocation(n);
  return __libc_memalign(alignment, n);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) noexcept {
  return memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) noexcept {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return 22;  // EINVAL
  void* p = memalign(alignment, n);
  if (!p) return 12;  // ENOMEM
  *out = p;
  return 0;
}
void* valloc(std::size_t n) noexcept {
  if (remat_alloc::detail::malloc_event()) return nullptr;
  remat_alloc::detail::note_allocation(n);
  return __libc_valloc(n);
}
void* pvalloc(std::size_t n) noexcept {
  if (remat_alloc::detail::malloc_event()) return nullptr;
  remat_alloc::detail::note_allocation(n);
  return __libc_pvalloc(n);
}
}
#endif
