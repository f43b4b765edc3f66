// What the tape says about what it keeps: print_saved_residuals' rows and the reason each value is kept, and
// the checkpoint diagnostics' findings and texts. Apart from TapeState because none of it runs on a
// recording or a sweep: it only reads the graph and the lifetime rule, to explain them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "remat/detail/buffers.hpp"
#include "remat/detail/compression_formats.hpp"
#include "remat/detail/levels.hpp"
#include "remat/detail/lifetime.hpp"
#include "remat/detail/node.hpp"
#include "remat/diagnostics.hpp"

namespace remat::detail {

/// One line of print_saved_residuals.
struct SavedResidual {
  std::int32_t node;
  std::string op, reason;
  Shape shape;
  std::size_t bytes;
};

template <class T>
class Reports {
 public:
  Reports(Graph<T>& graph, const Lifetime<T>& lifetime) : graph_(graph), lifetime_(lifetime) {}

  /// The buffers memory().saved_bytes counts, with the reason each is kept.
  std::vector<SavedResidual> saved_residuals() const {
    std::vector<SavedResidual> rows;
    for (std::int32_t i = 0; i < graph_.size(); ++i) {
      const Node<T>& n = graph_[i];
      if (lifetime_.saved_value(n)) rows.push_back({i, node_name(i), reason(i), n.shape, Buffers<T>::bytes(n.shape)});
      if (lifetime_.saved_packed(n))
        rows.push_back({i, node_name(i),
                        reason(i) + ", stored as " + compression_of(n.stored).name() + " (" +
                            std::to_string(Buffers<T>::bytes(n.shape)) + " B as it is)",
                        n.shape, lifetime_.packed_bytes(n)});
      if (lifetime_.saved_extra(n))
        rows.push_back({i, node_name(i) + ".extra", "residual of its own backward", n.extra_shape,
                        Buffers<T>::bytes(n.extra_shape)});
    }
    return rows;
  }

  /// Findings about the closed regions, with node `loss` as the loss (CheckpointDiagnostic). Does not
  /// change the tape.
  std::vector<CheckpointDiagnostic> diagnostics(std::int32_t loss) const {
    std::vector<CheckpointDiagnostic> out;
    // The last top-level region before the loss: the first one the sweep replays.
    std::int32_t last = -1;
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(graph_.regions.size()); ++r) {
      const Region& g = graph_.region(r);
      if (!g.open && g.depth == 1 && g.begin <= loss && g.replays && g.plan < 0) last = r;
    }
    for (std::int32_t r = 0; r < static_cast<std::int32_t>(graph_.regions.size()); ++r) {
      const Region& g = graph_.region(r);
      // A chain run by its schedule: the planner chose what it keeps (the findings are about policies).
      if (g.open || g.end == g.begin || g.plan >= 0) continue;
      CheckpointDiagnostic d = diagnostic_base(r);
      if (!region_needs_gradient(g)) {
        d.kind = CheckpointDiagnostic::Kind::needs_no_gradient;
        d.message = region_label(d) +
                    ": nothing in it requires a gradient (its inputs and captured values are constants or "
                    "detached), so its backward never runs and checkpointing it saves nothing";
        out.push_back(d);
      } else if (!g.replays) {
        d.kind = CheckpointDiagnostic::Kind::drops_nothing;
        for (std::int32_t i = g.begin; i < g.end; ++i) d.kept_bytes += saved_bytes_of(graph_[i]);
        d.message = region_label(d) + ": its policy keeps every value its backward reads, so it drops nothing " +
                    "and replays nothing; it keeps " + std::to_string(d.kept_bytes) + " bytes for the backward";
        out.push_back(d);
      } else if (r == last) {
        for (std::int32_t i = g.end; i <= loss && i < graph_.size(); ++i)
          if (!graph_[i].is_leaf()) d.freed_before_replay += saved_bytes_of(graph_[i]);
        if (2 * d.freed_before_replay >= d.replay_bytes) continue;  // it saves at least half of what it drops
        d.kind = CheckpointDiagnostic::Kind::replays_at_once;
        d.loss = loss;
        d.message = region_label(d) +
                    (loss < g.end ? " contains the loss (node #" + std::to_string(loss) + ")"
                                  : " is the last region before the loss (node #" + std::to_string(loss) + ")") +
                    ": the backward sweep replays it first, after freeing " + std::to_string(d.freed_before_replay) +
                    " bytes, so the " + std::to_string(d.replay_bytes) +
                    " bytes its replay regenerates come back while everything else is still saved: checkpointing "
                    "it lowers the peak by at most " +
                    std::to_string(d.freed_before_replay) +
                    " bytes, less than half of that. Leave it unchecked (checkpoint_sequential leaves the last "
                    "segment unchecked)";
        out.push_back(d);
      }
    }
    return out;
  }

  /// Sends the findings about regions not reported yet to the diagnostics handler, if there is one;
  /// each region is reported once per recording. Before a backward (changes nothing else); what the
  /// handler throws propagates, and its regions are reported again next time.
  void report(std::int32_t loss) {
    if (!diagnostics_handler_) return;
    bool any = false;
    for (const Region& g : graph_.regions) any = any || (!g.open && !g.diagnosed);
    if (!any) return;
    for (const CheckpointDiagnostic& d : diagnostics(loss))
      if (!graph_.region(d.region).diagnosed) diagnostics_handler_(d);
    for (Region& g : graph_.regions)
      if (!g.open) g.diagnosed = true;
  }
  void set_handler(std::function<void(const CheckpointDiagnostic&)> handler) {
    diagnostics_handler_ = std::move(handler);
  }

 private:
  std::string node_name(std::int32_t id) const { return graph_.node_name(id); }
  bool region_needs_gradient(const Region& g) const {
    for (std::int32_t i = g.begin; i < g.end; ++i)
      if (!graph_[i].is_leaf() && graph_[i].requires_grad) return true;
    return false;
  }
  std::size_t saved_bytes_of(const Node<T>& n) const {
    return (lifetime_.saved_value(n) ? Buffers<T>::bytes(n.shape) : 0) +
           (lifetime_.saved_extra(n) ? Buffers<T>::bytes(n.extra_shape) : 0);
  }
  CheckpointDiagnostic diagnostic_base(std::int32_t r) const {
    const Region& g = graph_.region(r);
    CheckpointDiagnostic d;
    d.region = r;
    d.first_node = g.begin;
    d.end_node = g.end;
    d.depth = g.depth;
    d.replay_bytes = g.replay_bytes;
    return d;
  }
  static std::string region_label(const CheckpointDiagnostic& d) {
    return "checkpoint region #" + std::to_string(d.region) + " (nodes #" + std::to_string(d.first_node) + "–#" +
           std::to_string(d.end_node - 1) + (d.depth > 1 ? ", nested at depth " + std::to_string(d.depth) : "") + ")";
  }

  /// Why print_saved_residuals lists node `id` (kept for a reader at the current level): the reader that
  /// keeps it, or for a value a policy decided on, that the policy allowed it.
  std::string reason(std::int32_t id) const {
    const Node<T>& n = graph_[id];
    const int level = lifetime_.level();
    std::string why;
    if (n.is_leaf() && n.region >= 0) {
      // Not a policy's decision: a leaf's data is the user's, and nothing could regenerate it.
      why = std::string(n.is_variable ? "variable" : "constant") +
            " recorded inside a checkpointed function (a leaf's data is kept, never regenerated)";
    } else if (n.tiers >= 0 && kept_by_tier(n, level)) {
      why = "region output, read outside its region";  // its own region dropped it
    } else if (n.replay_reads > 0 && n.level <= level) {
      why = read_by_enclosing_replay(id) ? "allowed by policy, read by a replay" : "region input";
    } else if (n.schedule_holds > 0) {
      why = "checkpoint of a chain schedule";
    } else if (!lifetime_.held_for_reader(n) && n.view_holds > 0) {
      const std::int32_t v = lifetime_.saving_view(n);
      why = "buffer of view #" + std::to_string(v) + " (" + graph_.node_name(v) + "), which is kept";
    } else if (n.regen_reads > 0 && !read_at_or_below(graph_, n, level)) {
      why = "read by the regeneration of an evicted value";
    } else if (n.region < 0) {
      why = "outside any region";
    } else if (((n.output_mask >> graph_.region(n.region).depth) & 1u) != 0) {
      why = "region output";
    } else {
      why = "allowed by policy";
    }
    if (n.attributes.tag >= 0) why += ", named '" + graph_.tags[static_cast<std::size_t>(n.attributes.tag)] + "'";
    return why;
  }
  /// Whether a reader from outside a region that returned n keeps it at `level` (and none of its own does).
  bool kept_by_tier(const Node<T>& n, int level) const {
    if (n.backward_reads + n.replay_reads > 0 && n.level <= level) return false;
    const std::int32_t* count = tier_counts(graph_, n);
    for (int c = 0, depth = depth_of(graph_, n); c < depth; ++c)
      if (count[c] > 0 && level_at_depth(n.drop_mask, c) <= level) return true;
    return false;
  }
  /// True when a region containing `id` reads it as a replay source (else only regions it is an input of).
  bool read_by_enclosing_replay(std::int32_t id) const {
    for (const Region& r : graph_.regions)
      if (id >= r.begin && id < r.end)
        for (std::int32_t k = r.sources_begin; k < r.sources_end; ++k)
          if (graph_.region_sources[static_cast<std::size_t>(k)] == id) return true;
    return false;
  }

  Graph<T>& graph_;
  const Lifetime<T>& lifetime_;
  std::function<void(const CheckpointDiagnostic&)> diagnostics_handler_;
};

}  // namespace remat::detail
