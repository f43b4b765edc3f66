// conv2d's float kernels on oneDNN (Debian's libdnnl-dev, the library LibTorch's CPU convolutions call), when
// remat is built with it (REMAT_USE_ONEDNN, CMake's REMAT_USE_ONEDNN option). oneDNN's fast convolutions read
// and write blocked layouts (nChw16c on AVX-512): remat's NCHW tensors are reordered into them and back, as
// PyTorch's mkldnn_convolution does with plain tensors. Every buffer oneDNN uses — the blocked copies and the
// primitive's own scratchpad (scratchpad_mode::user) — lies in the op's scratch, so memory() counts it.
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

#include "remat/shape.hpp"
#include "remat/threads.hpp"

namespace remat::detail::onednn {

/// What selects a plan: the sizes, the attributes and the thread count it runs on (oneDNN sizes its
/// scratchpad for that many threads).
struct ConvKey {
  std::int64_t n, c, h, w, o, kh, kw, groups;
  std::int32_t stride[2], padding[2], dilation[2], bias, threads;
  bool operator==(const ConvKey& k) const { return std::memcmp(this, &k, sizeof k) == 0; }
};
static_assert(std::has_unique_object_representations_v<ConvKey>, "ConvKey is compared and hashed by its bytes");

struct ConvKeyHash {
  std::size_t operator()(const ConvKey& k) const {
    std::size_t h = 1469598103934665603ull;  // FNV-1a over the key's bytes
    const auto* p = reinterpret_cast<const unsigned char*>(&k);
    for (std::size_t i = 0; i < sizeof k; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
  }
};

/// The calling thread's OpenMP thread count set to `n` while it lives: oneDNN's OpenMP runtime sizes its
/// primitives and parallel regions by omp_get_max_threads(), and remat's thread setting is its own.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) {
    if (n != saved_) omp_set_num_threads(n);
  }
  ~OmpThreads() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

inline const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// Scratch offsets are whole 64-byte lines (16 floats), where oneDNN's kernels want their buffers.
constexpr std::int64_t line_floats = 16;
inline std::int64_t round_up(std::int64_t floats) {
  return (floats + line_floats - 1) / line_floats * line_floats;
}
inline std::int64_t floats_of(const dnnl::memory::desc& d) {
  return static_cast<std::int64_t>(d.get_size() / sizeof(float));
}

/// One tensor a primitive reads or writes: remat's plain layout, the primitive's, and where in the scratch a
/// copy in the primitive's layout lives (-1: the primitive reads the plain tensor in place).
struct Staged {
  dnnl::memory::desc plain, blocked;
  std::int64_t offset = -1;
  dnnl::reorder to_blocked, to_plain, add_to_plain;  // only those its Direction uses
};

/// The three primitives of one convolution and the scratch layout of its forward and backward.
struct ConvPlan {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  Staged src, weights, dst;                      // the forward's
  Staged diff_dst_data, weights_data, diff_src;  // backward_data's
  Staged src_weights, diff_dst_weights, diff_weights;
  dnnl::memory::desc bias, forward_pad, data_pad, weights_pad;  // the bias's and the primitives' scratchpads
  std::int64_t forward_scratchpad = 0, data_scratchpad = 0, weights_scratchpad = 0;  // their offsets
  int threads = 1;                                       // the OpenMP thread count it was made for
  std::int64_t forward_floats = 0, backward_floats = 0;  // the scratch each direction needs
  // False when remat runs this convolution on im2col instead (see make_plan).
  bool usable = true;
  std::int64_t floats() const { return std::max(forward_floats, backward_floats); }
};

inline dnnl::memory::desc plain_desc(const dnnl::memory::dims& dims, dnnl::memory::format_tag tag) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, tag);
}
inline dnnl::memory::desc any_desc(const dnnl::memory::dims& dims) {
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, dnnl::memory::format_tag::any);
}

/// Which way a staged tensor's reorders go: an input is copied into the primitive's layout; an output is copied
/// back, or added back when it is a gradient that may accumulate.
enum class Direction { in, out, out_or_add };

/// Places `s` in the scratch at `next` (advancing it) unless the primitive takes the plain layout and the tensor
/// is not `always` staged; makes the reorders `direction` needs (each is a JIT compile: only those).
inline void stage(Staged& s, const dnnl::memory::desc& plain, const dnnl::memory::desc& blocked, Direction direction,
                  bool always, std::int64_t& next) {
  const dnnl::engine& e = cpu_engine();
  s.plain = plain;
  s.blocked = blocked;
  if (!always && plain == blocked) return;
  s.offset = next;
  next += round_up(floats_of(blocked));
  if (direction == Direction::in) {
    s.to_blocked = dnnl::reorder(dnnl::reorder::primitive_desc(e, plain, e, blocked));
    return;
  }
  s.to_plain = dnnl::reorder(dnnl::reorder::primitive_desc(e, blocked, e, plain));
  if (direction == Direction::out) return;
  dnnl::post_ops sum;
  sum.append_sum(1.0f);
  dnnl::primitive_attr add;
  add.set_post_ops(sum);
  s.add_to_plain = dnnl::reorder(dnnl::reorder::primitive_desc(e, blocked, e, plain, add));
}

inline std::int64_t scratchpad_floats(const dnnl::memory::desc& d) {
  return round_up(floats_of(d));
}

/// Builds the plan of `k` (oneDNN's primitive descriptors for the format `any`, so that it picks its fastest
/// layout). Throws dnnl::error if oneDNN cannot run this convolution. The plan is not `usable` (im2col runs the
/// op) when oneDNN would run it on other than its direct JIT kernels (jit, jit_1x1, jit_dw): its GEMM-based
/// convolution, which it picks for dilated, oddly grouped or rectangular-kernel shapes, rounds the value
/// differently at different thread counts; or when its temporary would exceed 4× the sizes of x, y and w together
/// (channels padded to its 16-channel blocks: a one-channel input's copies are 16× its size).
inline std::unique_ptr<ConvPlan> make_plan(const ConvKey& k) {
  using dnnl::algorithm;
  using dnnl::memory;
  using tag = memory::format_tag;
  const OmpThreads threads(k.threads);
  const dnnl::engine& e = cpu_engine();
  const std::int64_t oh = (k.h + 2 * k.padding[0] - k.dilation[0] * (k.kh - 1) - 1) / k.stride[0] + 1;
  const std::int64_t ow = (k.w + 2 * k.padding[1] - k.dilation[1] * (k.kw - 1) - 1) / k.stride[1] + 1;
  const memory::dims src{k.n, k.c, k.h, k.w}, dst{k.n, k.o, oh, ow};
  // PyTorch's [O, C/G, kH, kW] is oneDNN's [G, O/G, C/G, kH, kW] with the same bytes.
  const memory::dims weights = k.groups == 1 ? memory::dims{k.o, k.c, k.kh, k.kw}
                                             : memory::dims{k.groups, k.o / k.groups, k.c / k.groups, k.kh, k.kw};
  const tag weights_tag = k.groups == 1 ? tag::oihw : tag::goihw;
  const memory::dims strides{k.stride[0], k.stride[1]}, dilates{k.dilation[0] - 1, k.dilation[1] - 1},
      padding{k.padding[0], k.padding[1]};
  const memory::desc bias = k.bias ? plain_desc({k.o}, tag::a) : memory::desc();
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);

  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algorithm::convolution_direct, any_desc(src),
                                      any_desc(weights), bias, any_desc(dst), strides, dilates, padding, padding),
      attr, e);
  const dnnl::convolution_backward_data::primitive_desc bwd_data(
      dnnl::convolution_backward_data::desc(algorithm::convolution_direct, any_desc(src), any_desc(weights),
                                            any_desc(dst), strides, dilates, padding, padding),
      attr, e, fwd);
  const dnnl::convolution_backward_weights::primitive_desc bwd_weights(
      dnnl::convolution_backward_weights::desc(algorithm::convolution_direct, any_desc(src), any_desc(weights),
                                               any_desc(dst), strides, dilates, padding, padding),
      attr, e, fwd);

  auto p = std::make_unique<ConvPlan>();
  p->threads = k.threads;
  p->bias = bias;
  p->forward_pad = fwd.scratchpad_desc();
  p->data_pad = bwd_data.scratchpad_desc();
  p->weights_pad = bwd_weights.scratchpad_desc();
  p->forward = dnnl::convolution_forward(fwd);
  p->backward_data = dnnl::convolution_backward_data(bwd_data);
  p->backward_weights = dnnl::convolution_backward_weights(bwd_weights);
  const memory::desc plain_src = plain_desc(src, tag::nchw), plain_dst = plain_desc(dst, tag::nchw),
                     plain_weights = plain_desc(weights, weights_tag);
  // Forward: the output is written in place when its layout is plain (the tape's fresh buffer).
  std::int64_t next = 0;
  stage(p->src, plain_src, fwd.src_desc(), Direction::in, false, next);
  stage(p->weights, plain_weights, fwd.weights_desc(), Direction::in, false, next);
  stage(p->dst, plain_dst, fwd.dst_desc(), Direction::out, false, next);
  p->forward_scratchpad = next;
  p->forward_floats = next + scratchpad_floats(fwd.scratchpad_desc());
  // Backward: dY in each primitive's layout first (both read it), then the two gradients one after the other
  // over the same bytes. A gradient is always computed in the scratch: it may be added to what the target holds.
  next = 0;
  stage(p->diff_dst_data, plain_dst, bwd_data.diff_dst_desc(), Direction::in, false, next);
  if (bwd_weights.diff_dst_desc() == bwd_data.diff_dst_desc())
    p->diff_dst_weights = p->diff_dst_data;
  else
    stage(p->diff_dst_weights, plain_dst, bwd_weights.diff_dst_desc(), Direction::in, false, next);
  const std::int64_t gradients = next;
  stage(p->weights_data, plain_weights, bwd_data.weights_desc(), Direction::in, false, next);
  stage(p->diff_src, plain_src, bwd_data.diff_src_desc(), Direction::out_or_add, true, next);
  p->data_scratchpad = next;
  const std::int64_t data_end = next + scratchpad_floats(bwd_data.scratchpad_desc());
  next = gradients;
  stage(p->src_weights, plain_src, bwd_weights.src_desc(), Direction::in, false, next);
  stage(p->diff_weights, plain_weights, bwd_weights.diff_weights_desc(), Direction::out_or_add, true, next);
  p->weights_scratchpad = next;
  const std::int64_t weights_end = next + scratchpad_floats(bwd_weights.scratchpad_desc());
  p->backward_floats = std::max(data_end, weights_end);
  auto direct = [](const char* impl) { return std::string(impl).rfind("jit", 0) == 0; };
  const std::int64_t tensors = k.n * k.c * k.h * k.w + k.n * k.o * oh * ow + k.o * (k.c / k.groups) * k.kh * k.kw;
  p->usable = direct(fwd.impl_info_str()) && direct(bwd_data.impl_info_str()) && direct(bwd_weights.impl_info_str()) &&
              p->floats() <= 4 * tensors;
  return p;
}

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
