// The tape's storage and sweep: nodes, checkpoint regions, value lifetimes, backward and replay.
// Internal: users see it through remat::Tape and remat::Var.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/memory.hpp"
#include "remat/op_info.hpp"
#include "remat/parameter.hpp"

namespace remat::detail {

constexpr int max_inputs = 3;
constexpr int max_region_depth = 62;

/// Which values an op's backward reads (its residuals). An op's extra buffer, if it has one, is
/// always a residual of its own backward.
enum Needs : unsigned {
  needs_nothing = 0,
  needs_input0 = 1u << 0,
  needs_input1 = 1u << 1,
  needs_input2 = 1u << 2,
  needs_output = 1u << 3,
};

/// Per-node attributes that, with the op and the input ids, make a node re-executable.
struct Attributes {
  double scalar = 0;         ///< op-specific (pow exponent, dropout p, layer_norm eps, affine scale)
  double scalar2 = 0;        ///< op-specific (affine shift)
  std::uint64_t seed = 0;    ///< random ops: generator seed
  std::uint64_t offset = 0;  ///< random ops: counter offset of element 0
  std::int32_t labels = -1;  ///< cross_entropy: index into TapeState::labels_
  std::int32_t tag = -1;     ///< checkpoint_name: index into TapeState::tags_
};

template <class T>
using AlignedMap = Eigen::Map<Matrix<T>, Eigen::AlignedMax>;
template <class T>
using ConstAlignedMap = Eigen::Map<const Matrix<T>, Eigen::AlignedMax>;

template <class T>
class TapeState;
template <class T>
struct ForwardContext;
template <class T>
struct BackwardContext;

/// One static table per (op, scalar type): what the tape knows of an op, without knowing its name
/// in code. No virtual call, no std::function per node.
template <class T>
struct OpTable {
  const char* name;
  OpKind kind;
  unsigned needs;
  void (*forward)(const ForwardContext<T>&);
  void (*backward)(const BackwardContext<T>&);
  double (*flops)(const Shape* inputs, int arity, const Shape& output);
};

template <class T>
struct Node {
  const OpTable<T>* op = nullptr;  // null for leaves
  std::int32_t inputs[max_inputs] = {-1, -1, -1};
  std::int8_t arity = 0;
  bool is_variable = false;    // a leaf that receives a gradient
  bool requires_grad = false;  // some input (transitively) is a variable
  bool keep_grad = false;      // the gradient outlives the sweep (variables, gradient() targets)
  Shape shape;
  Shape extra_shape;  // op-specific residual (layer_norm statistics, softmax of a loss), or empty
  T* value = nullptr;
  bool value_owned = true;  // false for a referenced Parameter
  T* extra = nullptr;
  T* grad = nullptr;
  Attributes attributes;
  std::int32_t handles = 0;       // live Var handles
  std::int32_t holds = 0;         // pending needs: backward residual uses and region-input holds
  std::int32_t region_holds = 0;  // the part of holds taken by checkpoint regions
  std::int32_t region = -1;       // innermost checkpoint region, -1 outside any
  std::int32_t tag = -1;          // checkpoint_name tag (index into TapeState::tags_)
  std::uint64_t drop_mask = 0;    // bit d: the enclosing region at depth d does not save this value
  std::uint64_t output_mask = 0;  // bit d: returned by the enclosing region at depth d
  const Parameter<T>* parameter = nullptr;
  std::uint64_t parameter_version = 0;

  bool is_leaf() const { return op == nullptr; }
  /// Shallowest nesting level at which the value is kept: 0 = stored after the forward pass; d =
  /// regenerated when the enclosing region at depth d replays.
  int keep_level() const { return drop_mask == 0 ? 0 : 63 - __builtin_clzll(drop_mask); }
};

/// A checkpoint region: a contiguous range of nodes recorded while a checkpointed function ran.
struct Region {
  std::int32_t begin = 0;
  std::int32_t end = -1;  // one past the last node; -1 while open
  std::int32_t parent = -1;
  int depth = 1;
  bool open = true;
  bool needs_replay = false;
  std::vector<std::int32_t> held;  // values from outside the region that its replay reads
  bool (*policy)(const void*, const OpInfo&) = nullptr;
  const void* policy_object = nullptr;
};

template <class T>
class TapeState {
 public:
  explicit TapeState(std::uint64_t seed) : seed_(seed) {}
  TapeState(const TapeState&) = delete;
  TapeState& operator=(const TapeState&) = delete;
  ~TapeState() { release_all(); }

  // ---- ownership of the state itself (Tape and every Var hold a reference) ----
  void add_ref() { ++refs_; }
  void drop_ref() {
    if (--refs_ == 0) delete this;
  }

  // ---- buffers ----
  T* allocate(const Shape& s) {
    T* p = pool_.acquire(static_cast<std::size_t>(s.size()));
    live_bytes_ += bytes(s);
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
    return p;
  }
  void deallocate(T*& p, const Shape& s) {
    if (!p) return;
    pool_.release(p, static_cast<std::size_t>(s.size()));
    live_bytes_ -= bytes(s);
    p = nullptr;
  }
  static std::size_t bytes(const Shape& s) { return static_cast<std::size_t>(s.size()) * sizeof(T); }

  void free_value(Node<T>& n) {
    if (n.value_owned) deallocate(n.value, n.shape);
  }
  void free_extra(Node<T>& n) { deallocate(n.extra, n.extra_shape); }
  void free_grad(Node<T>& n) { deallocate(n.grad, n.shape); }

  // ---- value lifetime ----
  /// True when the value must stay: a handle refers to it, or a pending need at this level.
  bool value_wanted(const Node<T>& n) const { return n.handles > 0 || (n.holds > 0 && n.keep_level() <= level_); }
  void acquire_handle(std::int32_t id) { ++nodes_[id].handles; }
  void release_handle(std::int32_t id) {
    Node<T>& n = nodes_[id];
    assert(n.handles > 0);
    if (--n.handles == 0 && !value_wanted(n)) free_value(n);
  }
  void hold(std::int32_t id) { ++nodes_[id].holds; }
  void release_hold(std::int32_t id) {
    Node<T>& n = nodes_[id];
    assert(n.holds > 0);
    if (--n.holds == 0 && n.handles == 0) free_value(n);
  }

  // ---- recording ----
  std::int32_t add_leaf(const Shape& shape, bool variable) {
    if (shape.rows <= 0 || shape.cols <= 0)
      throw shape_error(std::string(variable ? "variable" : "constant") + ": empty matrix " + to_string(shape) +
                        "; every tensor needs at least one row and one column");
    nodes_.emplace_back();
    Node<T>& n = nodes_.back();
    n.shape = shape;
    n.is_variable = variable;
    n.requires_grad = variable;
    n.keep_grad = variable;
    n.region = open_.empty() ? -1 : open_.back();
    n.handles = 1;
    try {
      n.value = allocate(shape);
    } catch (...) {
      nodes_.pop_back();
      throw;
    }
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }

  std::int32_t add_parameter(const Parameter<T>& p) {
    Shape shape{p.rows(), p.cols()};
    if (shape.rows <= 0 || shape.cols <= 0)
      throw shape_error("variable: empty parameter " + to_string(shape) +
                        "; every tensor needs at least one row and one column");
    nodes_.emplace_back();
    Node<T>& n = nodes_.back();
    n.shape = shape;
    n.is_variable = n.requires_grad = n.keep_grad = true;
    n.region = open_.empty() ? -1 : open_.back();
    n.handles = 1;
    n.value = const_cast<T*>(p.value().data());
    n.value_owned = false;
    n.parameter = &p;
    n.parameter_version = p.version();
    return static_cast<std::int32_t>(nodes_.size() - 1);
  }

  /// Records and runs one op. Inputs are live (the caller holds their handles). On any exception the
  /// tape is left as it was.
  std::int32_t record(const OpTable<T>* table, const std::int32_t* inputs, int arity, const Attributes& attributes,
                      const Shape& shape, const Shape& extra_shape) {
    for (int k = 0; k < arity; ++k) check_not_escaped(table->name, inputs[k]);
    nodes_.emplace_back();
    const auto id = static_cast<std::int32_t>(nodes_.size() - 1);
    {
      Node<T>& n = nodes_.back();
      n.op = table;
      n.arity = static_cast<std::int8_t>(arity);
      for (int k = 0; k < arity; ++k) {
        n.inputs[k] = inputs[k];
        n.requires_grad = n.requires_grad || nodes_[inputs[k]].requires_grad;
      }
      n.attributes = attributes;
      n.shape = shape;
      n.extra_shape = extra_shape;
      n.tag = attributes.tag;
      n.region = open_.empty() ? -1 : open_.back();
    }
    try {
      Node<T>& n = nodes_.back();
      n.value = allocate(shape);
      if (extra_shape.size() > 0) n.extra = allocate(extra_shape);
      table->forward(ForwardContext<T>{*this, n});
      if (!open_.empty()) apply_region_policies(id);  // may throw (policy, bad_alloc): still undoable
    } catch (...) {
      Node<T>& n = nodes_.back();
      free_value(n);
      free_extra(n);
      nodes_.pop_back();
      throw;
    }
    Node<T>& n = nodes_[id];
    if (n.requires_grad) {
      for (int k = 0; k < arity; ++k)
        if (table->needs & (1u << k)) hold(inputs[k]);
      if (table->needs & needs_output) hold(id);
    } else {
      free_extra(n);  // its backward never runs
    }
    for (int k = 0; k < arity; ++k) hold_for_open_regions(inputs[k]);
    n.handles = 1;
    return id;
  }

  // ---- checkpoint regions ----
  std::int32_t open_region(bool (*policy)(const void*, const OpInfo&), const void* policy_object) {
    if (static_cast<int>(open_.size()) >= max_region_depth)
      throw tape_error("checkpoint: regions nested deeper than " + std::to_string(max_region_depth) + " levels");
    Region r;
    r.begin = static_cast<std::int32_t>(nodes_.size());
    r.parent = open_.empty() ? -1 : open_.back();
    r.depth = static_cast<int>(open_.size()) + 1;
    r.policy = policy;
    r.policy_object = policy_object;
    regions_.push_back(std::move(r));
    open_.push_back(static_cast<std::int32_t>(regions_.size() - 1));
    return open_.back();
  }

  /// True while `region` is the innermost open region (false once the tape was cleared or destroyed).
  bool region_is_innermost(std::int32_t region, std::uint32_t generation) const {
    return generation == generation_ && !open_.empty() && open_.back() == region;
  }

  /// Closes the innermost open region; `outputs` are the ids the checkpointed function returned.
  void close_region(const std::vector<std::int32_t>& outputs) {
    assert(!open_.empty());
    const std::int32_t rid = open_.back();
    open_.pop_back();
    Region& r = regions_[rid];
    r.open = false;
    r.end = static_cast<std::int32_t>(nodes_.size());
    r.policy = nullptr;
    r.policy_object = nullptr;
    const std::uint64_t bit = std::uint64_t{1} << r.depth;
    for (std::int32_t id : outputs) {
      if (id < r.begin || id >= r.end) continue;
      nodes_[id].output_mask |= bit;
      nodes_[id].drop_mask &= ~bit;
    }
    r.needs_replay = false;
    for (std::int32_t i = r.begin; i < r.end; ++i) {
      const Node<T>& n = nodes_[i];
      // An op's extra (layer_norm statistics, cross_entropy softmax) is a residual of its own backward even
      // when no later op holds its output value.
      if (!n.is_leaf() && n.keep_level() == r.depth && (n.holds > 0 || (n.extra_shape.size() > 0 && n.requires_grad)))
        r.needs_replay = true;
    }
    if (!r.needs_replay) release_region_holds(r);
    // What the enclosing level does not keep goes now; values already went when their handles died.
    for (std::int32_t i = r.begin; i < r.end; ++i) {
      Node<T>& n = nodes_[i];
      if (n.keep_level() >= r.depth) {
        free_extra(n);
        if (!value_wanted(n)) free_value(n);
      }
    }
  }

  void release_region_holds(Region& r) {
    for (std::int32_t id : r.held) {
      --nodes_[id].region_holds;
      release_hold(id);
    }
    r.held.clear();
  }

  // ---- backward ----
  /// Reverse sweep from `loss`. `mask[i]` says whether node i's gradient is wanted.
  void backward(std::int32_t loss, bool retain_graph, const std::vector<std::uint8_t>& mask) {
    for (Node<T>& n : nodes_) free_grad(n);
    replayed_bytes_ = 0;
    replayed_ops_ = 0;
    Node<T>& l = nodes_[loss];
    l.grad = allocate(l.shape);
    l.grad[0] = T(1);

    std::vector<std::int32_t> entering, leaving;
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(regions_.size()); ++r)
      if (regions_[r].end > regions_[r].begin) {
        entering.push_back(r);
        leaving.push_back(r);
      }
    std::sort(entering.begin(), entering.end(), [&](std::int32_t a, std::int32_t b) {
      const Region &ra = regions_[a], &rb = regions_[b];
      return ra.end != rb.end ? ra.end > rb.end : ra.depth < rb.depth;
    });
    std::sort(leaving.begin(), leaving.end(), [&](std::int32_t a, std::int32_t b) {
      const Region &ra = regions_[a], &rb = regions_[b];
      return ra.begin != rb.begin ? ra.begin > rb.begin : ra.depth > rb.depth;
    });
    auto enter = entering.begin();
    auto leave = leaving.begin();
    level_ = 0;
    for (auto i = static_cast<std::int32_t>(nodes_.size()) - 1; i >= 0; --i) {
      for (; enter != entering.end() && regions_[*enter].end - 1 == i; ++enter) {
        const Region& r = regions_[*enter];
        level_ = r.depth;
        if (r.needs_replay && region_receives_gradient(r, mask)) replay(r);
      }
      sweep_node(i, retain_graph, mask);
      for (; leave != leaving.end() && regions_[*leave].begin == i; ++leave) {
        Region& r = regions_[*leave];
        leave_region(r, retain_graph);
        level_ = r.depth - 1;
      }
    }
    level_ = 0;
    if (!retain_graph) residuals_freed_ = true;
  }

  bool region_receives_gradient(const Region& r, const std::vector<std::uint8_t>& mask) const {
    for (std::int32_t i = r.begin; i < r.end; ++i)
      if (nodes_[i].grad && mask[i]) return true;
    return false;
  }

  void sweep_node(std::int32_t i, bool retain_graph, const std::vector<std::uint8_t>& mask) {
    Node<T>& n = nodes_[i];
    if (n.is_leaf()) {
      if (!n.keep_grad) free_grad(n);  // a constant used as the loss got the seed gradient
      return;
    }
    if (n.grad && mask[i]) {
      check_residuals(i);
      n.op->backward(BackwardContext<T>{*this, n, mask});
    }
    if (!n.keep_grad) free_grad(n);
    if (!retain_graph && n.requires_grad) {
      for (int k = 0; k < n.arity; ++k)
        if (n.op->needs & (1u << k)) release_hold(n.inputs[k]);
      if (n.op->needs & needs_output) release_hold(i);
      free_extra(n);
    }
  }

  void check_residuals(std::int32_t i) const {
    const Node<T>& n = nodes_[i];
    auto missing = [&](const char* what) {
      throw freed_value_error(std::string(n.op->name) + " (node #" + std::to_string(i) + "): its " + what +
                              " was freed before its backward ran; a tape supports one backward unless "
                              "backward(loss, /*retain_graph=*/true) is used");
    };
    for (int k = 0; k < n.arity; ++k)
      if ((n.op->needs & (1u << k)) && !nodes_[n.inputs[k]].value) missing("input value");
    if ((n.op->needs & needs_output) && !n.value) missing("output value");
    if (n.extra_shape.size() > 0 && !n.extra) missing("saved residual");
  }

  /// Leaving a region in the sweep: drop what its replay regenerated and, unless the graph is kept,
  /// the values it held for that replay.
  void leave_region(Region& r, bool retain_graph) {
    for (std::int32_t i = r.begin; i < r.end; ++i) {
      Node<T>& n = nodes_[i];
      if (n.keep_level() >= r.depth) {
        free_extra(n);
        if (n.handles == 0) free_value(n);
      }
    }
    if (!retain_graph) release_region_holds(r);
  }

  /// Regenerates the values of region r that its backward needs, by re-running the recorded ops
  /// (never the user's function). Values of deeper regions are computed only where needed as inputs
  /// and released as soon as their last consumer in this replay ran.
  void replay(const Region& r) {
    const int d = r.depth;
    const std::int32_t count = r.end - r.begin;
    std::vector<std::int32_t> uses(static_cast<std::size_t>(count), 0);
    std::vector<std::uint8_t> marked(static_cast<std::size_t>(count), 0);
    auto kept_here = [&](const Node<T>& n) { return n.keep_level() <= d && n.holds > 0; };
    for (std::int32_t i = r.end - 1; i >= r.begin; --i) {
      const Node<T>& n = nodes_[i];
      if (n.is_leaf()) continue;
      const bool need_value = !n.value && (kept_here(n) || uses[i - r.begin] > 0);
      const bool need_extra = n.extra_shape.size() > 0 && !n.extra && n.requires_grad && n.keep_level() <= d;
      if (!need_value && !need_extra) continue;
      marked[i - r.begin] = 1;
      for (int k = 0; k < n.arity; ++k) {
        const std::int32_t j = n.inputs[k];
        if (!nodes_[j].value) {
          assert(j >= r.begin && "a region input was released before the region replayed");
          ++uses[j - r.begin];
        }
      }
    }
    for (std::int32_t i = r.begin; i < r.end; ++i) {
      if (!marked[i - r.begin]) continue;
      Node<T>& n = nodes_[i];
      check_parameter_inputs(n);
      if (!n.value) n.value = allocate(n.shape);
      if (n.extra_shape.size() > 0 && !n.extra) n.extra = allocate(n.extra_shape);
      n.op->forward(ForwardContext<T>{*this, n});
      replayed_bytes_ += bytes(n.shape) + bytes(n.extra_shape);
      ++replayed_ops_;
      for (int k = 0; k < n.arity; ++k) {
        const std::int32_t j = n.inputs[k];
        if (j < r.begin || !marked[j - r.begin]) continue;
        Node<T>& in = nodes_[j];
        if (--uses[j - r.begin] == 0 && !kept_here(in) && in.handles == 0) {
          free_value(in);
          if (in.keep_level() > d || !in.requires_grad) free_extra(in);  // else its own backward reads it
        }
      }
      if (n.keep_level() > d || !n.requires_grad) free_extra(n);
      // Recomputed only for its extra: the value itself is read by no one.
      if (uses[i - r.begin] == 0 && !kept_here(n) && n.handles == 0) free_value(n);
    }
  }

  void check_parameter_inputs(const Node<T>& n) const {
    for (int k = 0; k < n.arity; ++k) check_parameter(n.inputs[k], "backward");
  }
  /// A Parameter whose storage moved or changed shape since it was recorded: reading the node's value
  /// would read freed memory.
  bool parameter_moved(const Node<T>& n) const {
    return n.parameter && (n.parameter->value().data() != n.value || n.parameter->rows() != n.shape.rows ||
                           n.parameter->cols() != n.shape.cols);
  }
  void check_parameter(std::int32_t id, const char* op) const {
    const Node<T>& n = nodes_[id];
    if (parameter_moved(n))
      throw stale_value_error(std::string(op) + ": the Parameter " + to_string(n.shape) + " recorded as node #" +
                              std::to_string(id) + " was reallocated or resized (now [" +
                              std::to_string(n.parameter->rows()) + "," + std::to_string(n.parameter->cols()) +
                              "]) after it was recorded; record it again with tape.variable()");
    if (n.parameter && n.parameter->version() != n.parameter_version)
      throw stale_value_error(std::string(op) + ": the Parameter " + to_string(n.shape) + " recorded as node #" +
                              std::to_string(id) + " was modified after it was recorded (version " +
                              std::to_string(n.parameter->version()) + ", recorded at version " +
                              std::to_string(n.parameter_version) +
                              "); run the forward pass again after updating parameters");
  }

  // ---- whole-tape operations ----
  void release_all() {
    for (Node<T>& n : nodes_) {
      free_value(n);
      free_extra(n);
      free_grad(n);
    }
  }
  void clear() {
    if (!open_.empty())
      throw tape_error("clear: a checkpoint region is still open (clear() called inside a checkpointed function)");
    release_all();
    nodes_.clear();
    regions_.clear();
    labels_.clear();
    tags_.clear();
    ++generation_;
    residuals_freed_ = false;
    peak_bytes_ = live_bytes_;
    replayed_bytes_ = 0;
    replayed_ops_ = 0;
  }

  MemoryStats memory() const {
    MemoryStats m;
    m.live_bytes = live_bytes_;
    m.peak_bytes = peak_bytes_;
    for (const Node<T>& n : nodes_) {
      if (n.value && n.value_owned && n.holds > 0 && n.keep_level() <= level_) m.saved_bytes += bytes(n.shape);
      if (n.extra) m.saved_bytes += bytes(n.extra_shape);
    }
    m.replayed_bytes = replayed_bytes_;
    m.replayed_ops = replayed_ops_;
    m.cached_bytes = pool_.cached_bytes();
    return m;
  }

  std::uint64_t next_random_offset(std::uint64_t count) {
    const std::uint64_t o = random_offset_;
    random_offset_ += count;
    return o;
  }

  std::string node_name(std::int32_t id) const {
    const Node<T>& n = nodes_[id];
    if (n.is_leaf()) return n.is_variable ? "variable" : "constant";
    return n.op->name;
  }

  // ---- internals used by record() ----
  OpInfo op_info(const Node<T>& n) const {
    OpInfo info;
    info.name = n.op->name;
    info.kind = n.op->kind;
    if (n.tag >= 0) info.tag = tags_[static_cast<std::size_t>(n.tag)];
    info.shape = n.shape;
    info.bytes = bytes(n.shape);
    Shape in[max_inputs];
    for (int k = 0; k < n.arity; ++k) in[k] = nodes_[n.inputs[k]].shape;
    info.flops = n.op->flops(in, n.arity, n.shape);
    return info;
  }

  void apply_region_policies(std::int32_t id) {
    Node<T>& n = nodes_[id];
    const OpInfo info = op_info(n);
    std::uint64_t mask = 0;
    for (std::int32_t rid : open_) {
      const Region& r = regions_[rid];
      if (!r.policy(r.policy_object, info)) mask |= std::uint64_t{1} << r.depth;
    }
    n.drop_mask = mask;
  }

  /// A value computed inside a closed region may be used outside it only if the region returned it.
  void check_not_escaped(const char* op, std::int32_t id) const {
    for (std::int32_t r = nodes_[id].region; r != -1 && !regions_[r].open; r = regions_[r].parent) {
      if (!(nodes_[id].output_mask & (std::uint64_t{1} << regions_[r].depth)))
        throw tape_error(std::string(op) + ": its input (node #" + std::to_string(id) + ", " + node_name(id) + " " +
                         to_string(nodes_[id].shape) +
                         ") was computed inside a checkpointed function that did not return it; return every "
                         "value used outside the function from it");
    }
  }

  void hold_for_open_regions(std::int32_t id) {
    for (std::int32_t rid : open_) {
      Region& r = regions_[rid];
      if (id >= r.begin && !nodes_[id].is_leaf()) continue;
      if (std::find(r.held.begin(), r.held.end(), id) != r.held.end()) continue;
      r.held.push_back(id);
      hold(id);
      ++nodes_[id].region_holds;
    }
  }

  std::vector<Node<T>> nodes_;
  std::vector<Region> regions_;
  std::vector<std::int32_t> open_;  // open regions, outermost first
  std::vector<std::vector<int>> labels_;
  std::vector<std::string> tags_;
  Pool<T> pool_;
  std::size_t live_bytes_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t replayed_bytes_ = 0;
  std::size_t replayed_ops_ = 0;
  std::uint32_t generation_ = 0;
  int level_ = 0;  // nesting level of the sweep: values with keep_level() <= level_ are kept
  bool residuals_freed_ = false;
  std::uint64_t seed_;
  std::uint64_t random_offset_ = 0;
  long refs_ = 1;
};

/// What an op's forward sees: its inputs, its output, its extra buffer and attributes.
template <class T>
struct ForwardContext {
  TapeState<T>& tape;
  const Node<T>& node;

  ConstAlignedMap<T> in(int k) const {
    const Node<T>& n = tape.nodes_[node.inputs[k]];
    return ConstAlignedMap<T>(n.value, n.shape.rows, n.shape.cols);
  }
  Shape in_shape(int k) const { return tape.nodes_[node.inputs[k]].shape; }
  AlignedMap<T> out() const { return AlignedMap<T>(node.value, node.shape.rows, node.shape.cols); }
  AlignedMap<T> extra() const { return AlignedMap<T>(node.extra, node.extra_shape.rows, node.extra_shape.cols); }
  const Attributes& attributes() const { return node.attributes; }
  const std::vector<int>& labels() const { return tape.labels_[static_cast<std::size_t>(node.attributes.labels)]; }
};

/// What an op's backward sees: residuals, the output gradient, and add_grad() for each input.
template <class T>
struct BackwardContext {
  TapeState<T>& tape;
  const Node<T>& node;
  const std::vector<std::uint8_t>& mask;

  ConstAlignedMap<T> in(int k) const {
    const Node<T>& n = tape.nodes_[node.inputs[k]];
    return ConstAlignedMap<T>(n.value, n.shape.rows, n.shape.cols);
  }
  Shape in_shape(int k) const { return tape.nodes_[node.inputs[k]].shape; }
  ConstAlignedMap<T> out() const { return ConstAlignedMap<T>(node.value, node.shape.rows, node.shape.cols); }
  ConstAlignedMap<T> extra() const {
    return ConstAlignedMap<T>(node.extra, node.extra_shape.rows, node.extra_shape.cols);
  }
  ConstAlignedMap<T> grad_out() const { return ConstAlignedMap<T>(node.grad, node.shape.rows, node.shape.cols); }
  const Attributes& attributes() const { return node.attributes; }
  const std::vector<int>& labels() const { return tape.labels_[static_cast<std::size_t>(node.attributes.labels)]; }

  /// Whether input k's gradient is wanted (skip computing it otherwise).
  bool wants_grad(int k) const { return mask[static_cast<std::size_t>(node.inputs[k])] != 0; }

  /// Adds `e` (an Eigen matrix or array expression of input k's shape) to input k's gradient. The
  /// first contribution is assigned, so no zero fill is needed; products accumulate in the GEMM.
  template <class E>
  void add_grad(int k, const E& e) const {
    const std::int32_t id = node.inputs[k];
    if (!mask[static_cast<std::size_t>(id)]) return;
    Node<T>& in = tape.nodes_[id];
    const bool first = in.grad == nullptr;
    if (first) in.grad = tape.allocate(in.shape);
    AlignedMap<T> g(in.grad, in.shape.rows, in.shape.cols);
    if constexpr (std::is_base_of_v<Eigen::ArrayBase<E>, E>) {
      if (first)
        g.array() = e;
      else
        g.array() += e;
    } else {
      if (first)
        g.noalias() = e;
      else
        g.noalias() += e;
    }
  }
};

}  // namespace remat::detail
