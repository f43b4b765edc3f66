// TapeCore<T>: the state a Tape and its Vars share — the graph, its buffers, the lifetime rule, the recorder, the
// sweep, the reports and the tape's flags — and the guards every entry point runs. TapeSweeps adds the backward
// sweeps (detail/tape_sweeps.hpp), TapeFigures what the tape reports (detail/tape_figures.hpp), TapeState the rest
// of the interface (detail/tape_state.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/eviction.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/detail/non_finite.hpp"
#include "remat/detail/parameter_check.hpp"
#include "remat/detail/recorder.hpp"
#include "remat/detail/reports.hpp"
#include "remat/detail/sweep.hpp"
#include "remat/diagnostics.hpp"
#include "remat/errors.hpp"
#include "remat/memory.hpp"

namespace remat::detail {

/// What a schedule may learn of a recorded node (checkpoint_sequential_auto's probe). A view (OpBase::view:
/// reshape, view, flatten, squeeze, unsqueeze) allocates nothing: its value is the buffer of `buffer`, which the
/// tape counts once (docs/design.md §2.5), so its `bytes` are 0 and a planner counts that buffer's bytes instead.
struct NodeCost {
  bool leaf = true;
  double flops = 0;                  ///< forward FLOP estimate
  std::size_t bytes = 0;             ///< bytes its value allocates: its shape's, 0 for a view
  std::int32_t buffer = -1;          ///< the node whose buffer its value is: itself, or a view's input's, through views
  bool value_read = false;           ///< a backward reads its value
  std::size_t extra_read_bytes = 0;  ///< bytes of its extra if its backward reads it
};

template <class T>
class TapeCore {
 public:
  /// Throws tape_error naming `op` while a gradient-ready callback runs inside this tape's backward: the
  /// sweep is half-way through the tape's nodes, which nothing may change then.
  void check_not_in_callback(const char* op) const {
    if (frozen_) throw_frozen(op);
    if (sweep_.running())
      throw tape_error(std::string(op) +
                       ": called on the tape from one of its gradient-ready callbacks while its backward sweep runs; "
                       "a callback may read and write the Parameter's gradient, not record on or change the tape");
  }

 protected:
  /// `shapes_only`: the tape records shapes and counts bytes but computes nothing (Tape(remat::shapes_only)).
  TapeCore(std::uint64_t seed, bool shapes_only) : buffers_(shapes_only), seed_(seed) {}
  TapeCore(const TapeCore&) = delete;
  TapeCore& operator=(const TapeCore&) = delete;
  ~TapeCore() { release_all(); }

  [[noreturn]] static void throw_frozen(const char* op) {
    throw tape_error(std::string(op) +
                     ": the tape belongs to a CapturedStep, whose recorded step is fixed; a Var from it may be read "
                     "(value(), item(), grad()) but not recorded on, swept or changed");
  }
  void free_grad(Node<T>& n) {
    if (!n.parameter) buffers_.free(n.grad, n.shape);
    n.grad_assigned = false;
  }
  void release_all() noexcept {
    for (Node<T>& n : graph_.nodes) {
      lifetime_.free_value(n);
      if (n.packed) lifetime_.free_packed(n);
      buffers_.free(n.extra, n.extra_shape);
      if (!n.parameter) buffers_.free(n.grad, n.shape);
    }
  }

  Graph<T> graph_;
  Buffers<T> buffers_;
  Lifetime<T> lifetime_{graph_, buffers_};
  Evictor<T> evictor_{graph_, buffers_, lifetime_};
  Recorder<T> recorder_{graph_, buffers_, lifetime_, evictor_};
  Sweep<T> sweep_{graph_, buffers_, lifetime_, evictor_};
  Reports<T> reports_{graph_, lifetime_};
  std::vector<std::int32_t> outputs_;
  GradientReadyCallbacks<T> ready_callbacks_;
  std::size_t next_callback_key_ = 1;
  std::uint32_t generation_ = 0;
  bool residuals_freed_ = false;       // a sweep without retain_graph ran since the last clear()
  std::int32_t nodes_when_freed_ = 0;  // the nodes recorded then: a loss recorded later is a step without clear()
  const char* freed_by_ = "backward";  // that sweep: "backward" or "gradient()"
  std::uint64_t seed_;
  std::uint64_t random_offset_ = 0;
  bool training_ = true;
  bool frozen_ = false;                    // a CapturedStep's tape after its capture
  std::vector<T> frozen_zeros_;            // then: the gradient of a variable no run reaches
  bool capture_function_running_ = false;  // a CapturedStep's function runs (begin_capture)
};

}  // namespace remat::detail
