// An oracle for the values a tape keeps after the forward pass and the ops a backward replays, computed
// from the STRUCTURE of a recorded graph alone, following docs/design.md §2 ("the spec":
// §2.1 backward reads, §2.2 residence levels, §2.3 replay plans and stored values, §2.5 byte counts). It knows nothing
// of remat: no remat header, no remat type, no call into the tape. The test that uses it (oracle_property_test.cpp)
// describes each graph it records in a Graph and compares tape.memory() with compute(graph).
//
// What a Graph says, per node: the op name (as in the spec's table), which inputs it reads, its output
// and extra shapes (N-D: their element counts make the bytes), whether it is a leaf and of which kind, its innermost
// region, and the decision of every enclosing region's policy (evaluated by the caller: the policies of
// docs/checkpointing.md §4). Per region: its parent and the node ids its function returned. Plus the loss. Everything
// else (requires-grad, residence levels, what is read, replay sets) is derived here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace remat_oracle {

enum class Leaf { none, constant, variable, parameter };  // none = an op node

struct Node {
  std::string op;              // op name, e.g. "tanh", "matmul" (ignored for leaves)
  std::string tag;             // checkpoint_name tag, for printing only
  Leaf leaf = Leaf::none;      // constant / tape variable / Parameter for leaves
  std::vector<int> inputs;     // ids of earlier nodes (at most 3)
  std::vector<long> shape;     // output shape, outermost dimension first (empty: a rank-0 scalar)
  std::vector<long> extra;     // the op's extra buffer's shape; empty = none
  int region = -1;             // innermost enclosing region, -1 = outside every region
  std::vector<bool> saved_by;  // op nodes: saved_by[d-1] = the policy of the enclosing region at
                               // depth d says "may save" (one entry per enclosing region)
};

struct Region {
  int parent = -1;           // enclosing region (an earlier index), -1 = top level
  std::vector<int> outputs;  // node ids the region's function returned
  std::string label;         // e.g. the policy, for printing only
};

/// The number of elements of a shape: the product of its dimensions (1 for rank 0).
inline long numel(const std::vector<long>& shape) {
  long n = 1;
  for (long d : shape) n *= d;
  return n;
}
/// The elements of a node's extra buffer (0: it has none).
inline long extra_numel(const Node& x) {
  return x.extra.empty() ? 0 : numel(x.extra);
}

struct Graph {
  std::vector<Node> nodes;      // in recording order
  std::vector<Region> regions;  // in opening order (a parent before its children)
  int loss = -1;
  std::size_t scalar_bytes = sizeof(float);
};

/// What the backward of one op node reads (spec §2.1).
struct Reads {
  bool input[3] = {false, false, false};
  bool output = false;
  bool extra = false;
};

/// Spec §2.1, the table, row by row. r0, r1, r2: whether input 0, 1, 2 requires grad. Only called
/// for nodes that require grad ("an op whose node does not require grad reads nothing").
///
/// The transformer ops are not in the spec's table; their rows are derived from the derivative each op's
/// header documents (what that formula needs, not what the op's reads() says), one comment per row.
inline Reads backward_reads(const std::string& op, bool r0, bool r1, bool r2) {
  Reads r;
  auto is = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (op == n) return true;
    return false;
  };
  if (is({"abs", "cos", "sin", "log", "gelu", "softplus", "square", "pow"})) {
    r.input[0] = r0;
  } else if (is({"exp", "relu", "sigmoid", "sqrt", "tanh", "softmax", "log_softmax"})) {
    r.output = r0;
  } else if (is({"scalar_divide"})) {
    r.input[0] = r.output = r0;
  } else if (is({"neg", "affine", "checkpoint_name", "sum", "mean", "sum_rows", "add", "subtract", "dropout",
                 "full_like"})) {
    // (sum and mean over a list of dims too: dx is dy broadcast back over the reduced dims, divided by their
    // size for mean; nothing is read.)
    // nothing
  } else if (is({"multiply"})) {
    r.input[0] = r1;
    r.input[1] = r0;
  } else if (is({"divide"})) {
    r.input[1] = r0 || r1;
    r.input[0] = r1;
  } else if (is({"matmul"})) {
    r.input[0] = r1;
    r.input[1] = r0;
  } else if (is({"linear"})) {
    r.input[0] = r1;
    r.input[1] = r0;
  } else if (is({"mse_loss"})) {
    r.input[0] = r.input[1] = r0 || r1;
  } else if (is({"layer_norm"})) {
    r.input[0] = r0 || r1;
    r.input[1] = r0;
    r.extra = r0 || r1;
  } else if (is({"cross_entropy"})) {
    r.extra = r0;
  } else if (is({"embedding", "slice_cols", "concat_cols", "transpose", "reshape", "sum_cols", "mean_cols",
                 "permute"})) {
    // Data movement and column sums: dx is dy scattered by id, placed in its columns, transposed (permuted
    // back by the inverse permutation), read as x's shape or broadcast over the rows; the ids, shapes and
    // permutations are attributes, no tensor is read.
  } else if (is({"detach"})) {
    // dy/dx = 0 and its node never requires grad (stops_gradient below): never asked, reads nothing.
  } else if (is({"max_rows", "max"})) {
    // dx_ij = dy_i if j is the first column with x_ij = y_i, else 0: the indicator compares x with y (as
    // JAX's reduce_max rule compares operand and answer). max over dims (torch.amax): dy shared by the
    // elements equal to their maximum, found by the same comparison of x with y.
    r.input[0] = r.output = r0;
  } else if (is({"attention_scores"})) {
    // S_bh = q_bh k_bh^T / sqrt(d): dq_bh = dS_bh k_bh / sqrt(d) needs k, dk_bh = dS_bh^T q_bh / sqrt(d)
    // needs q (the causal mask is a constant pattern, read from no tensor).
    r.input[0] = r1;
    r.input[1] = r0;
  } else if (is({"attention_values"})) {
    // y_bh = p_bh v_bh: dp_bh = dy_bh v_bh^T needs v, dv_bh = p_bh^T dy_bh needs p.
    r.input[0] = r1;
    r.input[1] = r0;
  } else if (is({"scaled_dot_product_attention"})) {
    // P = exp(scores(q, k) - lse) with lse the extra: dv = P^T dy needs q, k and the extra; dq and dk
    // need dS = P * (dy v^T - rowsum(dy * y)), so v and the output too, then dq = dS k / sqrt(d) and
    // dk = dS^T q / sqrt(d) (k and q, already read).
    const bool qk = r0 || r1;
    r.input[0] = r.input[1] = r.extra = qk || r2;
    r.input[2] = r.output = qk;
  } else {
    throw std::invalid_argument("oracle: op '" + op + "' is not in the spec's table (§2.1)");
  }
  return r;
}

/// Whether the op's output requires no gradient whatever its inputs (stop_gradient): values computed from
/// it alone then require none either (detach's header).
inline bool stops_gradient(const std::string& op) {
  return op == "detach";
}

/// Whether the op's output is its input 0's buffer read with another shape (a view, §2.5): PyTorch's reshape,
/// view, flatten, squeeze and unsqueeze of a contiguous tensor. Its buffer is its root's (below).
inline bool is_view(const std::string& op) {
  return op == "reshape" || op == "view" || op == "flatten" || op == "squeeze" || op == "unsqueeze";
}

/// The oracle's answer for one region.
struct RegionResult {
  int depth = 0;
  std::vector<int> value_targets;  // §2.3 targets: values needed at this region's level
  std::vector<int> extra_targets;  // §2.3 extra targets: nodes whose extra is needed at this level
  std::vector<int> members;        // §2.3 replay: ops the replay re-runs, in forward order
  std::vector<int> sources;        // §2.3 replay: inputs of members kept at an outer level
  bool receives_gradient = false;  // §2.3 replay
  bool replays = false;            // §2.3 replay: has members and receives a gradient
};

struct Result {
  std::vector<bool> requires_grad;  // per node (Terms)
  std::vector<int> level;           // per node: L(v) (§2.2)
  std::vector<int> saved_values;    // §2.3 stored values
  std::vector<int> saved_extras;    // §2.3 stored values (node ids whose extra is saved)
  std::size_t saved_bytes = 0;      // §2.3 stored values
  std::vector<RegionResult> regions;
  std::size_t replayed_ops = 0;    // §2.5
  std::size_t replayed_bytes = 0;  // §2.5
};

inline Result compute(const Graph& g) {
  const int n = static_cast<int>(g.nodes.size());
  const int regions = static_cast<int>(g.regions.size());
  Result res;
  auto fail = [](const std::string& what) { throw std::invalid_argument("oracle: malformed graph: " + what); };
  if (g.loss < 0 || g.loss >= n) fail("no loss node");

  // Region depths (depth 1 = outermost) and membership: `inside(v, r)` = v was recorded while r was open.
  std::vector<int> depth(static_cast<std::size_t>(regions));
  for (int r = 0; r < regions; ++r) {
    const int p = g.regions[static_cast<std::size_t>(r)].parent;
    if (p >= r) fail("region " + std::to_string(r) + " opened before its parent");
    depth[static_cast<std::size_t>(r)] = p < 0 ? 1 : depth[static_cast<std::size_t>(p)] + 1;
  }
  auto inside = [&](int v, int r) {
    for (int q = g.nodes[static_cast<std::size_t>(v)].region; q >= 0; q = g.regions[static_cast<std::size_t>(q)].parent)
      if (q == r) return true;
    return false;
  };
  auto node = [&](int v) -> const Node& { return g.nodes[static_cast<std::size_t>(v)]; };
  auto is_op = [&](int v) { return node(v).leaf == Leaf::none; };

  // Terms: a node requires grad iff it is a variable (tape variable or Parameter) or some input does, unless
  // its op stops the gradient (then no gradient reaches its inputs through it either).
  res.requires_grad.assign(static_cast<std::size_t>(n), false);
  for (int v = 0; v < n; ++v) {
    const Node& x = node(v);
    if (!is_op(v)) {
      if (!x.inputs.empty()) fail("leaf #" + std::to_string(v) + " has inputs");
      res.requires_grad[static_cast<std::size_t>(v)] = x.leaf == Leaf::variable || x.leaf == Leaf::parameter;
      continue;
    }
    if (x.inputs.empty() || x.inputs.size() > 3) fail("op #" + std::to_string(v) + " has no or more than 3 inputs");
    for (int w : x.inputs) {
      if (w < 0 || w >= v) fail("op #" + std::to_string(v) + " reads a later node");
      if (res.requires_grad[static_cast<std::size_t>(w)] && !stops_gradient(x.op))
        res.requires_grad[static_cast<std::size_t>(v)] = true;
    }
  }
  auto rg = [&](int v) { return static_cast<bool>(res.requires_grad[static_cast<std::size_t>(v)]); };

  // Section 2: D(v) = the depths of the enclosing regions whose policy drops v (returning v does not change
  // it: a checkpointed function's outputs are its values like any other, JAX's rule). A reader p reads v at
  // level e(v, p) = the deepest depth in D(v) of a region that encloses p too (0 if none): v's own backward and
  // its extra at L(v) = max D(v); a reader outside a region that returned v sees only the regions enclosing
  // both. Leaves are never dropped.
  std::vector<std::vector<int>> dropped_at(static_cast<std::size_t>(n));
  res.level.assign(static_cast<std::size_t>(n), 0);
  for (int v = 0; v < n; ++v) {
    const Node& x = node(v);
    const std::size_t enclosing =
        x.region < 0 ? 0 : static_cast<std::size_t>(depth[static_cast<std::size_t>(x.region)]);
    if (!is_op(v)) continue;
    if (x.saved_by.size() != enclosing)
      fail("op #" + std::to_string(v) + " has " + std::to_string(x.saved_by.size()) + " policy decisions for " +
           std::to_string(enclosing) + " enclosing regions");
    for (int q = x.region; q >= 0; q = g.regions[static_cast<std::size_t>(q)].parent) {
      const int d = depth[static_cast<std::size_t>(q)];
      if (!x.saved_by[static_cast<std::size_t>(d - 1)]) {
        dropped_at[static_cast<std::size_t>(v)].push_back(d);
        res.level[static_cast<std::size_t>(v)] = std::max(res.level[static_cast<std::size_t>(v)], d);
      }
    }
  }
  auto L = [&](int v) { return res.level[static_cast<std::size_t>(v)]; };
  // The deepest region enclosing both v and p (p = v or recorded after v): its depth, 0 if none.
  auto common = [&](int v, int p) {
    for (int q = node(v).region; q >= 0; q = g.regions[static_cast<std::size_t>(q)].parent)
      if (inside(p, q)) return depth[static_cast<std::size_t>(q)];
    return 0;
  };
  auto e = [&](int v, int p) {
    const int c = common(v, p);
    int level = 0;
    for (int d : dropped_at[static_cast<std::size_t>(v)])
      if (d <= c) level = std::max(level, d);
    return level;
  };

  // Section 1: which values (and extras) some backward reads, and at which levels. Static: every node that
  // requires grad. read_levels[v]: the level of each read of v (a backward's, then the replays' below).
  std::vector<std::vector<int>> read_levels(static_cast<std::size_t>(n));
  std::vector<bool> extra_read(static_cast<std::size_t>(n), false);
  for (int v = 0; v < n; ++v) {
    const Node& x = node(v);
    if (!is_op(v) || !rg(v)) continue;
    bool r[3] = {false, false, false};
    for (std::size_t k = 0; k < x.inputs.size(); ++k) r[k] = rg(x.inputs[k]);
    const Reads reads = backward_reads(x.op, r[0], r[1], r[2]);
    for (std::size_t k = 0; k < x.inputs.size(); ++k)
      if (reads.input[k]) read_levels[static_cast<std::size_t>(x.inputs[k])].push_back(e(x.inputs[k], v));
    if (reads.output) read_levels[static_cast<std::size_t>(v)].push_back(L(v));
    if (reads.extra) {
      if (extra_numel(x) == 0) fail("op #" + std::to_string(v) + " (" + x.op + ") reads an extra it lacks");
      extra_read[static_cast<std::size_t>(v)] = true;
    }
  }
  auto read_at = [&](int v, int level) {
    const auto& levels = read_levels[static_cast<std::size_t>(v)];
    return std::find(levels.begin(), levels.end(), level) != levels.end();
  };

  // Section 4 ("R receives a gradient"): a node has a gradient when it requires grad and is the loss or an
  // input of a node that has one (every op's backward passes a gradient to each input that requires grad).
  std::vector<bool> has_gradient(static_cast<std::size_t>(n), false);
  has_gradient[static_cast<std::size_t>(g.loss)] = rg(g.loss);
  for (int v = g.loss; v >= 0; --v)
    if (has_gradient[static_cast<std::size_t>(v)])
      for (int w : node(v).inputs)
        if (rg(w)) has_gradient[static_cast<std::size_t>(w)] = true;

  // Sections 3 and 4, region by region from the deepest outwards (a source read at level d' < d is found
  // before the region at depth d' is processed).
  std::vector<int> order(static_cast<std::size_t>(regions));
  for (int r = 0; r < regions; ++r) order[static_cast<std::size_t>(r)] = r;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return depth[static_cast<std::size_t>(a)] > depth[static_cast<std::size_t>(b)];
  });
  res.regions.assign(static_cast<std::size_t>(regions), RegionResult{});
  for (int r : order) {
    RegionResult& out = res.regions[static_cast<std::size_t>(r)];
    const int d = depth[static_cast<std::size_t>(r)];
    out.depth = d;
    // Section 3: targets = values inside R that some reader reads at level d (a backward, or the replay of a
    // region nested in R); extras of nodes inside R with L = d whose own backward reads them.
    std::vector<bool> value_target(static_cast<std::size_t>(n), false), member(static_cast<std::size_t>(n), false);
    std::vector<int> work;
    for (int v = 0; v < n; ++v) {
      if (!inside(v, r)) continue;
      if (read_at(v, d)) {
        value_target[static_cast<std::size_t>(v)] = true;
        out.value_targets.push_back(v);
      }
      if (extra_read[static_cast<std::size_t>(v)] && L(v) == d) out.extra_targets.push_back(v);
      if (value_target[static_cast<std::size_t>(v)] || (extra_read[static_cast<std::size_t>(v)] && L(v) == d)) {
        member[static_cast<std::size_t>(v)] = true;  // a target is produced by re-running its op
        work.push_back(v);
      }
    }
    // Section 4: walk back from the targets. An input w of a member m is available if m reads it at a level
    // below d (then it is a SOURCE, read by R's replay at that level) or w is a target; otherwise it is a
    // member too (a transient).
    std::vector<bool> source(static_cast<std::size_t>(n), false);
    std::vector<std::pair<int, int>> source_reads;  // (w, the level of the first member's read)
    while (!work.empty()) {
      const int m = work.back();
      work.pop_back();
      for (int w : node(m).inputs) {
        const int level = e(w, m);
        if (level < d) {
          if (!source[static_cast<std::size_t>(w)]) {
            out.sources.push_back(w);
            source_reads.emplace_back(w, level);
          }
          source[static_cast<std::size_t>(w)] = true;
          // The level names a region at that depth enclosing w; it must enclose R too, or no replay would
          // regenerate w before R's.
          if (level > 0) {
            int q = r;
            while (q >= 0 && depth[static_cast<std::size_t>(q)] > level)
              q = g.regions[static_cast<std::size_t>(q)].parent;
            if (q < 0 || !inside(w, q))
              fail("source #" + std::to_string(w) + " of region " + std::to_string(r) +
                   " is kept by no region enclosing it");
          }
        } else if (!value_target[static_cast<std::size_t>(w)] && !member[static_cast<std::size_t>(w)]) {
          if (!is_op(w) || !inside(w, r)) fail("transient #" + std::to_string(w) + " is not an op of the region");
          member[static_cast<std::size_t>(w)] = true;
          work.push_back(w);
        }
      }
    }
    for (const auto& [w, level] : source_reads) read_levels[static_cast<std::size_t>(w)].push_back(level);
    for (int v = 0; v < n; ++v)
      if (member[static_cast<std::size_t>(v)]) out.members.push_back(v);  // forward (recording) order
    std::sort(out.sources.begin(), out.sources.end());
    // Section 4: a replay runs only if R has members and receives a gradient (some node of R has one).
    for (int v = 0; v < n && !out.receives_gradient; ++v)
      out.receives_gradient = inside(v, r) && has_gradient[static_cast<std::size_t>(v)];
    out.replays = !out.members.empty() && out.receives_gradient;
  }

  // Section 6: replayed_ops = ops re-run by the replays of this backward; replayed_bytes = their output
  // plus extra bytes, where a view's output is no new buffer (§2.5).
  for (const RegionResult& rr : res.regions) {
    if (!rr.replays) continue;
    for (int m : rr.members) {
      const Node& x = node(m);
      ++res.replayed_ops;
      res.replayed_bytes +=
          static_cast<std::size_t>((is_view(x.op) ? 0 : numel(x.shape)) + extra_numel(x)) * g.scalar_bytes;
    }
  }

  // Section 5: after the forward pass the tape keeps the values some reader reads at level 0 (a backward, a
  // replay's source), and the extras of L = 0 nodes whose own backward reads them. Parameters: 0 bytes. A
  // view's value is its root's buffer (the first non-view up its chain of inputs 0): each buffer counts once,
  // when its root or any view of it is kept.
  auto root = [&](int v) {
    while (is_op(v) && is_view(node(v).op)) v = node(v).inputs[0];
    return v;
  };
  std::vector<bool> buffer_kept(static_cast<std::size_t>(n), false);
  for (int v = 0; v < n; ++v) {
    const Node& x = node(v);
    if (read_at(v, 0)) {
      res.saved_values.push_back(v);
      const int b = root(v);
      if (node(b).leaf != Leaf::parameter && !buffer_kept[static_cast<std::size_t>(b)])
        res.saved_bytes += static_cast<std::size_t>(numel(node(b).shape)) * g.scalar_bytes;
      buffer_kept[static_cast<std::size_t>(b)] = true;
    }
    if (extra_read[static_cast<std::size_t>(v)] && L(v) == 0) {
      res.saved_extras.push_back(v);
      res.saved_bytes += static_cast<std::size_t>(extra_numel(x)) * g.scalar_bytes;
    }
  }
  return res;
}

/// The graph and the oracle's sets as text, for a failure report.
inline std::string describe(const Graph& g, const Result& r) {
  std::ostringstream os;
  auto dims = [](const std::vector<long>& shape) {
    std::string s = "[";
    for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? "," : "") + std::to_string(shape[d]);
    return s + "]";
  };
  auto list = [&](const std::vector<int>& ids) {
    std::string s;
    for (int v : ids) s += (s.empty() ? "#" : " #") + std::to_string(v);
    return s.empty() ? std::string("-") : s;
  };
  const char* leaf_names[] = {"op", "constant", "variable", "parameter"};
  os << "  (saved_by: the policy decision of each enclosing region, outermost first, S = may save, d = drops;"
        " rg = requires grad; L = residence level)\n";
  for (std::size_t v = 0; v < g.nodes.size(); ++v) {
    const Node& x = g.nodes[v];
    os << "  #" << v << " = " << (x.leaf == Leaf::none ? x.op : leaf_names[static_cast<int>(x.leaf)]);
    if (!x.inputs.empty()) os << "(" << list(x.inputs) << ")";
    if (!x.tag.empty()) os << " '" << x.tag << "'";
    os << " " << dims(x.shape);
    if (extra_numel(x) > 0) os << " extra " << dims(x.extra);
    if (x.region >= 0) os << " region " << x.region;
    if (!x.saved_by.empty()) {
      os << " saved_by ";
      for (bool s : x.saved_by) os << (s ? 'S' : 'd');
    }
    os << (r.requires_grad[v] ? " rg" : "") << " L=" << r.level[v] << (static_cast<int>(v) == g.loss ? "  <- loss" : "")
       << "\n";
  }
  for (std::size_t q = 0; q < g.regions.size(); ++q) {
    const Region& reg = g.regions[q];
    const RegionResult& rr = r.regions[q];
    os << "  region " << q << " (depth " << rr.depth << ", parent " << reg.parent << ", " << reg.label << ") outputs "
       << list(reg.outputs) << ": targets " << list(rr.value_targets) << ", extra targets " << list(rr.extra_targets)
       << ", members " << list(rr.members) << ", sources " << list(rr.sources)
       << (rr.receives_gradient ? ", receives a gradient" : ", no gradient") << (rr.replays ? ", REPLAYS" : "") << "\n";
  }
  os << "  oracle: saved values " << list(r.saved_values) << ", saved extras " << list(r.saved_extras) << " = "
     << r.saved_bytes << " B; replayed " << r.replayed_ops << " ops / " << r.replayed_bytes << " B\n";
  return os.str();
}

}  // namespace remat_oracle
