// Tape<T>: records the forward pass and runs the reverse sweep.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iomanip>
#include <ostream>
#include <string>
#include <vector>

#include "remat/detail/tape_state.hpp"
#include "remat/var.hpp"

namespace remat {

/// A reverse-mode tape for scalar type T (float or double). One tape per forward/backward pass; reuse
/// it for the next training step with clear(), which keeps its buffer pool so a steady training loop
/// allocates nothing after the first step. A tape is not thread-safe; each thread may run its own.
template <class T>
class Tape {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "remat::Tape<T>: T must be float or double");

 public:
  /// `seed` seeds the tape's random generator (dropout).
  explicit Tape(std::uint64_t seed = 0x5eed) : state_(new detail::TapeState<T>(seed)) {}
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  ~Tape() {
    state_->open_.clear();
    state_->clear();
    state_->pool_.trim();
    state_->drop_ref();
  }

  /// A leaf that receives no gradient; copies `value` [m,n]. Throws shape_error for an empty matrix.
  template <class Derived>
  Var<T> constant(const Eigen::MatrixBase<Derived>& value) {
    return leaf(value, false);
  }

  /// A leaf that receives a gradient; copies `value` [m,n]. Throws shape_error for an empty matrix.
  template <class Derived>
  Var<T> variable(const Eigen::MatrixBase<Derived>& value) {
    return leaf(value, true);
  }

  /// A leaf that receives a gradient and references `p` without copying. If `p` is modified through
  /// Parameter::mutable_value() before backward reads it, backward throws stale_value_error.
  Var<T> variable(const Parameter<T>& p) { return Var<T>::adopt(state_, state_->add_parameter(p)); }

  /// Reverse sweep from `loss` ([1,1]; d loss / d loss = 1). Afterwards Var::grad() of every variable
  /// holds d loss / d variable (each backward computes fresh gradients; they do not accumulate).
  /// Residuals are freed as the sweep passes them unless `retain_graph`, which allows another backward.
  /// Checkpoint regions replay their recorded ops as the sweep enters them.
  /// Throws shape_error (loss not [1,1]), tape_error (Var of another or cleared tape, inside a
  /// checkpointed function), freed_value_error (second backward after one without retain_graph),
  /// stale_value_error (a Parameter changed since it was recorded). Nothing is changed when it throws.
  void backward(const Var<T>& loss, bool retain_graph = false) {
    const std::int32_t id = check_loss("backward", loss);
    std::vector<std::uint8_t> mask(state_->nodes_.size());
    for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = state_->nodes_[i].requires_grad;
    state_->backward(id, retain_graph, mask);
  }

  /// d loss / d v for each v in `wrt` (any Vars on this tape, variables or interior values), computed by
  /// one sweep that skips work not leading to them. Returns matrices of the shapes of `wrt`. Frees
  /// residuals unless `retain_graph`; throws as backward() does, and tape_error for a `wrt` value that
  /// depends on no variable.
  std::vector<Matrix<T>> gradient(const Var<T>& loss, std::initializer_list<Var<T>> wrt, bool retain_graph = false) {
    return gradient(loss, std::vector<Var<T>>(wrt), retain_graph);
  }
  std::vector<Matrix<T>> gradient(const Var<T>& loss, const std::vector<Var<T>>& wrt, bool retain_graph = false) {
    const std::int32_t id = check_loss("gradient", loss);
    auto& nodes = state_->nodes_;
    std::vector<std::uint8_t> target(nodes.size(), 0), mask(nodes.size(), 0);
    for (const Var<T>& v : wrt) {
      check_own("gradient", v);
      // Ops on constants-only values keep no residuals, so their backward could not run.
      if (!v.requires_grad())
        throw tape_error("gradient: node #" + std::to_string(v.id()) + " (" + state_->node_name(v.id()) + " " +
                         to_string(v.shape()) +
                         ") does not depend on any variable; record it with tape.variable() to differentiate by it");
      target[static_cast<std::size_t>(v.id())] = 1;
    }
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      bool m = target[i] != 0;
      for (int k = 0; k < nodes[i].arity && !m; ++k) m = mask[static_cast<std::size_t>(nodes[i].inputs[k])] != 0;
      mask[i] = m;
    }
    std::vector<bool> kept(nodes.size());
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      kept[i] = nodes[i].keep_grad;
      nodes[i].keep_grad = nodes[i].keep_grad || target[i];
    }
    state_->backward(id, retain_graph, mask);
    std::vector<Matrix<T>> result;
    result.reserve(wrt.size());
    for (const Var<T>& v : wrt) {
      const auto& n = nodes[static_cast<std::size_t>(v.id())];
      if (n.grad)
        result.emplace_back(MatrixView<T>(n.grad, n.shape.rows, n.shape.cols));
      else
        result.push_back(Matrix<T>::Zero(n.shape.rows, n.shape.cols));
    }
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      nodes[i].keep_grad = kept[i];
      if (!kept[i]) state_->free_grad(nodes[i]);
    }
    return result;
  }

  /// Forgets every recorded node for the next step; keeps the buffer pool. Existing Vars become
  /// invalid (using them throws tape_error). Resets peak_bytes to the bytes still live.
  void clear() { state_->clear(); }

  /// Returns the pool's cached buffers to the system.
  void release_cached_memory() { state_->pool_.trim(); }

  /// Restarts the tape's random generator (dropout) at `seed`: the masks drawn after this call are a
  /// pure function of `seed` and the order of the random ops, so a training loop that seeds each step
  /// (e.g. from its step number) draws the same masks when it is resumed. Existing nodes keep theirs.
  void seed(std::uint64_t seed) {
    state_->seed_ = seed;
    state_->random_offset_ = 0;
  }

  /// Exact byte counts of tape-owned buffers; see MemoryStats.
  MemoryStats memory() const { return state_->memory(); }

  /// Number of recorded nodes (leaves and ops).
  std::size_t size() const { return state_->nodes_.size(); }

  /// One line per saved residual (like JAX's print_saved_residuals): node id, op, shape, bytes and why
  /// it is held — "region input" (kept for a checkpoint replay), "allowed by policy" (inside a region
  /// whose policy saves it), "region output", "outside any region" (no region drops it), with
  /// ", named 'x'" for a checkpoint_name tag; an op's extra buffer is listed as "<op>.extra". Then the
  /// total, which equals memory().saved_bytes. Columns are aligned to the longest entry.
  void print_saved_residuals(std::ostream& os) const {
    const auto& s = *state_;
    struct Row {
      std::string node, op, shape, bytes, why;
    };
    std::vector<Row> rows;
    std::size_t total = 0;
    for (std::size_t i = 0; i < s.nodes_.size(); ++i) {
      const auto& n = s.nodes_[i];
      const auto id = static_cast<std::int32_t>(i);
      if (n.value && n.value_owned && n.holds > 0 && n.keep_level() <= s.level_) {
        const std::size_t b = detail::TapeState<T>::bytes(n.shape);
        rows.push_back({"#" + std::to_string(i), s.node_name(id), to_string(n.shape), std::to_string(b), reason(n)});
        total += b;
      }
      if (n.extra) {
        const std::size_t b = detail::TapeState<T>::bytes(n.extra_shape);
        rows.push_back({"#" + std::to_string(i), s.node_name(id) + ".extra", to_string(n.extra_shape),
                        std::to_string(b), "residual of its own backward"});
        total += b;
      }
    }
    std::size_t w_node = 4, w_op = 2, w_shape = 5, w_bytes = 5;
    for (const Row& r : rows) {
      w_node = std::max(w_node, r.node.size());
      w_op = std::max(w_op, r.op.size());
      w_shape = std::max(w_shape, r.shape.size());
      w_bytes = std::max(w_bytes, r.bytes.size());
    }
    auto line = [&](const std::string& node, const std::string& op, const std::string& shape, const std::string& b,
                    const char* unit, const std::string& why) {
      os << "  " << std::left << std::setw(static_cast<int>(w_node)) << node << "  "
         << std::setw(static_cast<int>(w_op)) << op << "  " << std::setw(static_cast<int>(w_shape)) << shape << "  "
         << std::right << std::setw(static_cast<int>(w_bytes)) << b << unit << why << "\n";
    };
    os << "saved residuals (" << rows.size() << " buffers; tape of " << s.nodes_.size() << " nodes):\n";
    line("node", "op", "shape", "bytes", "    ", "reason");
    for (const Row& r : rows) line(r.node, r.op, r.shape, r.bytes, " B  ", r.why);
    os << "  total " << total << " B\n";
  }

  detail::TapeState<T>* state() const { return state_; }

 private:
  template <class Derived>
  Var<T> leaf(const Eigen::MatrixBase<Derived>& value, bool variable) {
    const std::int32_t id = state_->add_leaf(Shape{value.rows(), value.cols()}, variable);
    auto& n = state_->nodes_[static_cast<std::size_t>(id)];
    detail::AlignedMap<T>(n.value, n.shape.rows, n.shape.cols) = value.template cast<T>();
    return Var<T>::adopt(state_, id);
  }

  void check_own(const char* op, const Var<T>& v) const {
    v.node(op);
    if (v.state() != state_) throw tape_error(std::string(op) + ": the Var belongs to another tape");
  }

  std::int32_t check_loss(const char* op, const Var<T>& loss) const {
    check_own(op, loss);
    if (!state_->open_.empty())
      throw tape_error(std::string(op) + ": called inside a checkpointed function; call it after the function returns");
    const auto& n = state_->nodes_[static_cast<std::size_t>(loss.id())];
    if (n.shape.rows != 1 || n.shape.cols != 1)
      throw shape_error(std::string(op) + ": the loss must be [1,1] but is " + to_string(n.shape) +
                        "; reduce it with sum() or mean() first");
    if (state_->residuals_freed_)
      throw freed_value_error(std::string(op) +
                              ": the residuals were freed by the previous backward; pass retain_graph = true to the "
                              "first backward to run another one, or record the forward pass again");
    for (std::size_t i = 0; i < state_->nodes_.size(); ++i)
      if (state_->nodes_[i].holds > 0) state_->check_parameter(static_cast<std::int32_t>(i), op);
    return loss.id();
  }

  std::string reason(const detail::Node<T>& n) const {
    const auto& s = *state_;
    std::string why;
    // A region input is kept for the replay whatever else reads it, so that is the reason given.
    if (n.region_holds > 0) why = "region input";
    if (why.empty()) {
      if (n.region < 0)
        why += "outside any region";
      else if (n.output_mask != 0 && n.drop_mask == 0 && n.region >= 0 &&
               !s.regions_[static_cast<std::size_t>(n.region)].open &&
               (n.output_mask >> s.regions_[static_cast<std::size_t>(n.region)].depth) & 1u)
        why += "region output";
      else
        why += "allowed by policy";
    }
    if (n.tag >= 0) why += ", named '" + s.tags_[static_cast<std::size_t>(n.tag)] + "'";
    return why;
  }

  detail::TapeState<T>* state_;
};

}  // namespace remat
