// The tape's records: one Node per value (a leaf or an op's output), one Region per checkpoint call, and
// the static OpTable through which the tape runs an op without knowing its name.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "remat/matrix.hpp"
#include "remat/op_info.hpp"
#include "remat/parameter.hpp"
#include "remat/policies.hpp"

namespace remat {

/// What an op's backward reads (its residuals), as bits: input k's value, its own output, its extra.
enum Reads : unsigned {
  reads_nothing = 0,
  reads_input0 = 1u << 0,
  reads_input1 = 1u << 1,
  reads_input2 = 1u << 2,
  reads_output = 1u << 3,
  reads_extra = 1u << 4,
};
constexpr unsigned reads_input(int k) {
  return 1u << k;
}

/// Bit k set: input k of an op requires a gradient. An op's `reads(GradInputs)` says what its backward
/// reads to produce exactly those gradients (residuals by need: matmul(x, W) with W constant keeps W,
/// not x).
using GradInputs = unsigned;
constexpr bool wants(GradInputs g, int k) {
  return (g >> k) & 1u;
}

/// Most inputs an op takes.
constexpr int max_inputs = 3;
/// Most bytes of an op's Params (its own attributes, stored by value in the node).
constexpr std::size_t max_params_bytes = 40;

template <class T>
class ForwardContext;
template <class T>
class BackwardContext;

}  // namespace remat

namespace remat::detail {

constexpr int max_region_depth = 62;
/// The most bytes one tensor may have (256 TiB): far beyond any machine, and small enough that one size times
/// a small factor, and the memory figures of fewer than 65 536 such tensors at once, fit a std::size_t (a
/// shapes-only tape accepts shapes no machine could allocate). Larger shapes throw shape_error when recorded.
constexpr std::size_t max_value_bytes = std::size_t{1} << 48;

/// Whether every dimension of `shape` is at least 1 (or, when `may_be_none`, every one is 0: Shape{} or [0,0],
/// "none") and it holds at most max_value_bytes (2^48) bytes of `element_bytes` each.
inline bool valid_op_shape(const Shape& shape, bool may_be_none, std::size_t element_bytes) {
  // Rank 2 (most shapes, and Shape{}, an op's "none") without the loops: two tests and one product, as before
  // shapes were N-D (W0 checks three shapes an op and one a leaf, and the loops cost it instructions).
  if (shape.rank() == 2) {
    const Index rows = shape[0], cols = shape[1];
    Index elements = 0;
    if (rows < 1 || cols < 1 || __builtin_mul_overflow(rows, cols, &elements))
      return may_be_none && rows == 0 && cols == 0;
    return static_cast<std::size_t>(elements) <= max_value_bytes / element_bytes;
  }
  // Another rank passes in one loop that stops at the first dimension below 1; only then is "none" looked
  // for (Shape{} stops at its first dimension). It runs on every op's three shapes and every leaf's.
  Index elements = 1;
  for (Index d : shape)
    if (d < 1 || __builtin_mul_overflow(elements, d, &elements)) {
      if (!may_be_none || shape.rank() == 0) return false;
      for (Index e : shape)
        if (e != 0) return false;
      return true;  // none
    }
  return static_cast<std::size_t>(elements) <= max_value_bytes / element_bytes;
}

/// What regenerating an op costs besides its FLOPs, in FLOPs: calling its kernel and the tape's bookkeeping
/// take a fixed time whatever the op's size, about as long as 2^16 FLOPs of a small GEMM on one core. Part of
/// each op's cost for the memory budget's heuristics (Node::cost): without it, an elementwise op on a [16,128]
/// value (2^15 FLOPs or fewer) looks a thousand times cheaper to regenerate than the GEMM behind a gate of W5's
/// LSTM, while regenerating it takes about a tenth of that time, and h_DTR evicts the LSTM's state a step before
/// reading it again, 149 times a step at half the peak.
constexpr double op_overhead_flops = 65536;

/// Per-node attributes that, with the op and the input ids, make a node re-executable. The tape knows
/// none of their meanings: `params` holds the op's own Params struct (trivially copyable, copied in by
/// apply_op), `indices` a range of the tape's integer store (token ids, class labels), `tag` a name any
/// op's output may carry for the name policies (OpInfo::tag).
struct Attributes {
  alignas(8) unsigned char params[max_params_bytes] = {};
  std::int64_t indices_begin = 0;  ///< first entry in Graph::indices
  std::int64_t indices_count = 0;
  std::int32_t tag = -1;  ///< index into Graph::tags, -1 without a name

  template <class P>
  void set_params(const P& p) {
    static_assert(std::is_trivially_copyable_v<P>, "an op's Params must be trivially copyable");
    static_assert(sizeof(P) <= max_params_bytes, "an op's Params must fit in max_params_bytes");
    if constexpr (!std::is_empty_v<P>) std::memcpy(params, &p, sizeof(P));
  }
  template <class P>
  P get_params() const {
    static_assert(std::is_trivially_copyable_v<P> && std::is_default_constructible_v<P>,
                  "an op's Params must be trivially copyable and default-constructible");
    static_assert(sizeof(P) <= max_params_bytes, "an op's Params must fit in max_params_bytes");
    P p{};
    if constexpr (!std::is_empty_v<P>) std::memcpy(&p, params, sizeof(P));
    return p;
  }
};

/// One static table per (op, scalar type): everything the tape knows of an op. No virtual call, no
/// std::function per node.
template <class T>
struct OpTable {
  const char* name;
  OpKind kind;
  bool batch_dims;                ///< a dot with batch dimensions (OpInfo::batch_dims)
  bool stops_gradient;            ///< its output requires no gradient whatever its inputs (detach)
  bool view;                      ///< its output is input 0's buffer, read with another shape (OpBase::view)
  unsigned (*reads)(GradInputs);  ///< residuals its backward reads for these input gradients
  unsigned sign_reads;            ///< the reads of those that need only the value's sign (OpBase::sign_reads)
  void (*forward)(const ForwardContext<T>&);
  void (*backward)(const BackwardContext<T>&);
  double (*flops)(const Shape* inputs, int arity, const Shape& output, const Attributes& attributes);
  /// Throws what the op throws for `count` integer entries (OpCall::indices) given these inputs; null for an op
  /// that declares no check_indices (CapturedStep::set_indices then refuses it).
  void (*check_indices)(const Shape* inputs, const Attributes& attributes, const int* indices, std::size_t count);
};

/// An op's extra residual or temporary as the tape keeps it: the [rows, cols] matrix view of the Shape its
/// extra_shape or scratch_shape returned ([0,0] for none). The op reads those buffers as matrices, and a node
/// carries two of them: the full Shape would triple what they cost every node.
class MatrixShape {
 public:
  MatrixShape() = default;
  MatrixShape(const Shape& s) : rows_(s.numel() == 0 ? 0 : s.rows()), cols_(s.numel() == 0 ? 0 : s.cols()) {}
  Index rows() const { return rows_; }
  Index cols() const { return cols_; }
  Index numel() const { return rows_ * cols_; }
  operator Shape() const { return Shape{rows_, cols_}; }

 private:
  Index rows_ = 0, cols_ = 0;
};

/// The shapes apply_op infers for an op: its output, its extra residual, its temporary (empty: none).
struct OpShapes {
  Shape output, extra, scratch;
};

/// A node's state that only the memory budget uses (detail/eviction.hpp, eviction_classes.hpp): its scans'
/// scratch, the union-find of h_DTR^eq and the trials' journal marks. Graph::budget holds one per node, but only
/// from the first Tape::set_memory_budget (or regeneration) until a clear() without a budget: every node of
/// every tape carried these 60-odd bytes when they were Node's, and the per-op cost of a tape without a budget
/// grew with the node (bench W0).
struct BudgetFields {
  std::int8_t evict_memo = 0;      // with evict_mark: 1 regenerable, 2 not, 0 being decided
  std::uint8_t decoded = 0;        // bit k: input k was read decoded (packed) when it was last computed
  std::uint32_t bound_epoch = 0;   // cache of the victim scans: `bound` holds in this epoch
  std::int32_t class_parent = -1;  // union-find over evicted values (h_DTR^eq); -1: a root
  std::int32_t class_size = 1;     // at a root: members of the class
  double class_cost = 0;           // at a root: the summed cost of its members evicted now
  std::uint32_t evict_mark = 0;    // scratch of the eviction scans (stamp)
  std::uint32_t class_mark = 0;    // scratch of h_DTR^eq: a class root counted by a walk (stamp)
  std::uint32_t walk_mark = 0;     // scratch of a neighbourhood or eviction walk (stamp)
  std::uint32_t regen_mark = 0;    // scratch of a regeneration: a member of the one of this stamp
  std::int32_t regen_uses = 0;     // with regen_mark: its readers in that regeneration not yet run
  std::uint32_t journal_mark = 0;  // saved in the journal of the trial of this stamp
  double bound = 0;                // with bound_epoch: Evictor::bound
};

/// One recorded value. The counters are the inputs of the lifetime rule (detail/lifetime.hpp).
template <class T>
struct Node {
  const OpTable<T>* op = nullptr;  // null for leaves
  std::int32_t inputs[max_inputs] = {-1, -1, -1};
  std::int8_t arity = 0;
  bool is_variable = false;    // a leaf that receives a gradient
  bool requires_grad = false;  // a variable, or some input requires grad
  std::uint8_t reads = 0;      // Reads bits of its backward (0 unless requires_grad)
  std::int8_t level = 0;       // residence level: deepest enclosing region that drops it (0: none)
  Shape shape;
  MatrixShape extra_shape;    // op-specific residual (layer_norm statistics, cross_entropy softmax), or empty
  MatrixShape scratch_shape;  // op temporary, from the pool only while its forward or backward runs, or empty
  T* value = nullptr;
  T* extra = nullptr;
  T* scratch = nullptr;  // set only while a kernel runs
  T* grad = nullptr;
  // Its value stored compressed (Compression `stored`, a policy's save_as): while it is kept only for pending readers,
  // the buffer is this encoding and `value` is null; a read decodes it into `value` (compressed_values.hpp).
  T* packed = nullptr;
  bool grad_assigned = false;  // grad holds a value: the next contribution adds to it
  Attributes attributes;

  // Lifetime counters (lifetime.hpp): a value is kept while a handle refers to it or, at its level,
  // a pending reader needs it.
  std::int32_t handles = 0;         // live Var handles
  std::int32_t backward_reads = 0;  // pending backwards that read the value (its own included)
  std::int32_t replay_reads = 0;    // checkpoint replays that read it (sources of a replay)
  bool pending = false;             // held until the outermost open region decides its replay reads
  bool extra_read = false;          // its own pending backward reads the extra

  std::int32_t region = -1;       // innermost enclosing checkpoint region, -1 outside any
  std::uint64_t drop_mask = 0;    // bit d: the enclosing region at depth d drops this value
  std::uint64_t output_mask = 0;  // bit d: returned by the enclosing region at depth d
  // A value returned by a checkpoint region that drops it has readers at two or more levels: its region's
  // backward reads it at its level (`level`), a reader outside the region at the level of the regions that
  // enclose both (lifetime.hpp, "tiers"). Then `tiers` indexes Graph::tier_holds: one count per common
  // depth c below the value's own depth, of the holds of readers whose deepest region enclosing both is at
  // depth c. -1 for every other value.
  std::int32_t tiers = -1;
  std::uint32_t mark = 0;  // scratch for region analyses (stamp of the last analysis that marked it)

  // Memory budget (detail/eviction.hpp: Dynamic Tensor Rematerialization, Kirisame et al. 2021): the fields that
  // passes other than the budget's read or keep up to date. The budget's own state is in BudgetFields, a side
  // table that a tape without a budget does not have.
  bool evicted = false;             // wanted by the lifetime rule but without a buffer: regenerated when read
  std::int32_t pins = 0;            // running ops (forward, regeneration, backward) that read it now
  std::int32_t regen_reads = 0;     // evicted values whose regeneration reads it (the lifetime rule reads it)
  std::int32_t schedule_holds = 0;  // an executed chain schedule keeps it (ChainPlan): at every level
  std::int32_t view_holds = 0;      // views (OpBase::view) whose value is its buffer now: at every level
  bool view_kept = false;           // its value stayed only for views of it, not recomputed since: absent for a replay
  std::uint8_t stored = 0;          // how its value is kept for readers: compression_code(), 0 (full) but for save_as
  // Kept on every tape, as touch() keeps it: a budget set halfway through a recording ranks the values recorded
  // before it by their staleness all the same.
  std::uint64_t last_access = 0;  // the tape's logical clock at its last read or write (staleness)
  double cost = 0;  // forward FLOP estimate, rounded up, + op_overhead_flops: regenerating it alone (replays count it)
  std::int32_t first_use = -1;  // consumers, as edges id·max_inputs + k (input k of op id reads it), listed
  std::int32_t next_use[max_inputs] = {-1, -1, -1};  // from first_use through next_use[k] of each consumer

  std::shared_ptr<ParameterStorage<T>> parameter;  // a referenced Parameter (value not tape-owned)
  std::uint64_t parameter_version = 0;
  std::uint64_t parameter_assignments = 0;

  bool is_leaf() const { return op == nullptr; }
  /// The tape allocated its buffer and frees it: not a Parameter's storage, not a view of another value's.
  bool value_owned() const { return parameter == nullptr && !is_view(); }
  /// Its value is input 0's buffer (OpBase::view).
  bool is_view() const { return op != nullptr && op->view; }
  std::int32_t holds() const { return backward_reads + replay_reads + (pending ? 1 : 0); }
  /// The format its value is kept in for readers (a policy's save_as; full otherwise).
  StoredFormat stored_format() const { return static_cast<StoredFormat>(stored & 3u); }
};

/// A checkpoint region: the contiguous range of nodes recorded while a checkpointed function ran.
struct Region {
  std::int32_t begin = 0;
  std::int32_t end = -1;  // one past the last node; -1 while open
  std::int32_t parent = -1;
  int depth = 1;
  bool open = true;
  bool replays = false;          // its backward needs values it dropped (set when it closes)
  std::size_t replay_bytes = 0;  // what its replay regenerates, as planned when it closed (diagnostics)
  bool diagnosed = false;        // its findings went to the diagnostics handler (once per recording)
  // Sources of its replay: [sources_begin, sources_end) in Graph::region_sources.
  std::int32_t sources_begin = 0, sources_end = 0;
  policies::Decision (*policy)(const void*, const OpInfo&) = nullptr;
  const void* policy_object = nullptr;
  std::int32_t plan = -1;  // a chain executed by its schedule: index into Graph::chain_plans; -1 otherwise
};

/// A chain of layers recorded as one region whose backward follows a planned schedule's operations
/// (run_schedule with a non-persistent schedule) instead of one replay: layer i (1…L) is the nodes
/// [layer_begin[i − 1], layer_begin[i]) and returns the `width` nodes output(i, 0 … width − 1) (one state of the
/// chain: a Var, or the Vars of a tuple); output(0, ·) is the chain's input.
struct ChainPlan {
  struct Operation {
    enum Kind : std::uint8_t { forward, forward_all, backward, free_activation } kind;
    std::int32_t layer;
  };
  std::vector<std::int32_t> layer_begin;  // L + 1 entries
  std::vector<std::int32_t> outputs;      // (L + 1) · width entries: state i at [i · width, (i + 1) · width)
  std::vector<Operation> operations;      // from the first backward on
  std::vector<std::uint8_t> held;         // L + 1: x_i kept by the forward pass for the first backward
  std::vector<std::uint8_t> tapes;        // L + 1: layer i's residuals kept by it (its ops saved)
  int width = 1;                          // Vars in one state
  int length() const { return static_cast<int>(held.size()) - 1; }
  std::int32_t& output(int i, int k) { return outputs[static_cast<std::size_t>(i * width + k)]; }
  std::int32_t output(int i, int k) const { return outputs[static_cast<std::size_t>(i * width + k)]; }
};

/// The recorded graph: nodes, regions and the side stores their attributes index into. Every vector
/// keeps its capacity across Tape::clear(), so a steady training loop does not allocate here.
template <class T>
class Trace;

template <class T>
struct Graph {
  std::vector<Node<T>> nodes;
  std::vector<Region> regions;
  std::vector<std::int32_t> open;            // open regions, outermost first
  std::vector<std::int32_t> region_sources;  // flat lists of replay sources, one range per region
  std::vector<std::int32_t> source_readers;  // parallel to region_sources: the member op that reads the source
  std::vector<std::int32_t> tier_holds;      // Node::tiers indexes it
  std::vector<std::int32_t> pending;         // values with Node::pending set
  std::vector<ChainPlan> chain_plans;        // Region::plan indexes it
  std::vector<int> indices;                  // ops' integer side data (Attributes::indices_begin), flat
  std::vector<std::string> tags;             // names of tagged values, interned (kept across clear())
  Trace<T>* trace = nullptr;                 // a CapturedStep's log while its first step runs (detail/trace.hpp)
  bool grad_enabled = true;                  // false: ops record no gradient (Tape::set_grad_enabled)
  bool sign_stored = false;                  // an open region recorded a value a policy stores as sign
  bool compressed_stored = false;  // a value was recorded that a policy stores compressed (Node::stored; until clear())
  bool detect_anomaly = false;     // check every value and gradient for NaN and ±inf (Tape::set_detect_anomaly)

  // The memory budget's side table (BudgetFields): parallel to `nodes` while budget_on, else empty.
  std::vector<BudgetFields> budget;
  bool budget_on = false;

  Node<T>& operator[](std::int32_t id) { return nodes[static_cast<std::size_t>(id)]; }
  const Node<T>& operator[](std::int32_t id) const { return nodes[static_cast<std::size_t>(id)]; }
  std::int32_t size() const { return static_cast<std::int32_t>(nodes.size()); }
  Region& region(std::int32_t id) { return regions[static_cast<std::size_t>(id)]; }
  const Region& region(std::int32_t id) const { return regions[static_cast<std::size_t>(id)]; }
  int open_depth() const { return static_cast<int>(open.size()); }

  /// Index of `name` in the tag store, adding it the first time.
  std::int32_t intern_tag(std::string_view name) {
    for (std::size_t i = 0; i < tags.size(); ++i)
      if (tags[i] == name) return static_cast<std::int32_t>(i);
    tags.emplace_back(name);
    return static_cast<std::int32_t>(tags.size() - 1);
  }

  /// Node `id`'s entry of the budget's side table (budget_on).
  BudgetFields& budget_of(std::int32_t id) { return budget[static_cast<std::size_t>(id)]; }
  const BudgetFields& budget_of(std::int32_t id) const { return budget[static_cast<std::size_t>(id)]; }

  /// Starts (or keeps) the budget's side table, one entry per node, with room for `capacity` nodes. Throws
  /// std::bad_alloc with the graph unchanged.
  void track_budget(std::size_t capacity) {
    budget.reserve(std::max({capacity, nodes.capacity(), budget.capacity()}));  // what reserve_nodes() made room for
    budget.resize(nodes.size());  // a node recorded before the budget starts with nothing evicted
    budget_on = true;
  }
  /// Drops the side table (a cleared tape without a budget: nothing is evicted).
  void untrack_budget() noexcept {
    budget = {};
    budget_on = false;
  }

  /// Appends a node (and its side-table entry). Throws std::bad_alloc with the graph unchanged, never once
  /// reserve_nodes() made room for it.
  Node<T>& add_node() {
    if (budget_on && budget.size() == budget.capacity()) budget.reserve(std::max<std::size_t>(8, 2 * budget.size()));
    nodes.emplace_back();
    if (budget_on) budget.emplace_back();  // within capacity
    return nodes.back();
  }
  /// Removes the last node (add_node() undone). Never throws.
  void pop_node() noexcept {
    nodes.pop_back();
    if (budget_on) budget.pop_back();
  }
  /// Room for `n` nodes in all, so that add_node() cannot throw until then. Throws std::bad_alloc.
  void reserve_nodes(std::size_t n) {
    if (nodes.capacity() < n) nodes.reserve(std::max(n, 2 * nodes.capacity()));
    if (budget_on && budget.capacity() < n) budget.reserve(std::max(n, 2 * budget.capacity()));
  }

  std::string node_name(std::int32_t id) const {
    const Node<T>& n = (*this)[id];
    if (n.is_leaf()) return n.is_variable ? "variable" : "constant";
    return n.op->name;
  }
};

}  // namespace remat::detail
