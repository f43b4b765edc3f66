// conv2d's oneDNN plans (run by detail/onednn_conv.hpp): what selects a plan (ConvKey), and making one (make_plan):
// oneDNN's three primitives of a convolution in the layouts it runs fastest, the reorders into and out of them, and
// where each blocked copy and each primitive's scratchpad lies in the op's scratch. Only with REMAT_USE_ONEDNN.
#pragma once

#ifdef REMAT_USE_ONEDNN

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <type_traits>

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

}  // namespace remat::detail::onednn

#endif  // REMAT_USE_ONEDNN
