// run_schedule() executes a planned chain schedule as nested checkpoint regions;
// checkpoint_sequential_auto() measures a chain with a probe pass, plans within a byte budget and runs it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "remat/checkpoint.hpp"
#include "remat/errors.hpp"
#include "remat/schedule/planner.hpp"

namespace remat {
namespace detail {

/// The policy of the regions run_schedule() opens: saves the ops recorded while *flag is set (the layer
/// whose full tape the schedule keeps), nothing else.
struct SaveWhileFlagged {
  const bool* flag;
  bool operator()(const OpInfo&) const { return *flag; }
};

template <class Layers, class T>
Var<T> run_plan_node(const Layers& layers, const Schedule& schedule, int index, Var<T> x, bool* flag) {
  const PlanNode& n = schedule.nodes[static_cast<std::size_t>(index)];
  auto layer = [&](int i, Var<T> v) { return layers[static_cast<std::size_t>(i - 1)](std::move(v)); };
  switch (n.kind) {
    case PlanNode::backward: {
      // The layer whose tape the enclosing region keeps: its ops are saved at the enclosing level.
      *flag = true;
      try {
        x = layer(n.last, std::move(x));
      } catch (...) {
        *flag = false;
        throw;
      }
      *flag = false;
      return x;
    }
    case PlanNode::split_tape: {
      if (n.kept == n.source + 1) {
        x = layer(n.kept, std::move(x));  // Fall_kept at this level: its tape is kept here
      } else {
        bool save = false;
        x = checkpoint([&](Var<T> v) { return run_plan_node(layers, schedule, n.left, std::move(v), &save); },
                       SaveWhileFlagged{&save})(x);
      }
      if (n.right < 0) return x;
      return run_plan_node(layers, schedule, n.right, std::move(x), flag);
    }
    case PlanNode::split_activation: {
      if (n.right_first != n.kept + 1) break;
      bool save = false;
      x = checkpoint([&](Var<T> v) { return run_plan_node(layers, schedule, n.left, std::move(v), &save); },
                     SaveWhileFlagged{&save})(x);
      return run_plan_node(layers, schedule, n.right, std::move(x), flag);
    }
    case PlanNode::advance:
    case PlanNode::advance_tape:
      break;
  }
  throw domain_error(
      "run_schedule: the schedule frees a checkpoint before its sub-chain is done (non-persistent); checkpoint "
      "regions keep their input until the backward sweep leaves them, so plan with plan_schedule(chain, budget, "
      "/*persistent=*/true)");
}

}  // namespace detail

/// Runs `layers` (L callables Var<T> → Var<T>) on x following `schedule` (from plan_schedule(chain, budget,
/// /*persistent=*/true) for a chain of the same L) and returns x_L. Each kept activation becomes a checkpoint
/// region boundary, each kept full tape a layer whose ops the region saves; the backward sweep then replays
/// exactly the forward operations of the schedule: layer i is evaluated schedule.forward_counts(L)[i − 1]
/// times in all (first pass included). Gradients are bitwise those of the plain tape.
/// Throws domain_error for an infeasible or non-persistent schedule, or one planned for another length.
template <class Layers, class T>
Var<T> run_schedule(const Layers& layers, const Schedule& schedule, Var<T> x) {
  if (!schedule.feasible || schedule.root < 0) throw domain_error("run_schedule: the schedule is not feasible");
  const auto L = static_cast<int>(std::size(layers));
  if (schedule.nodes[static_cast<std::size_t>(schedule.root)].last != L)
    throw domain_error("run_schedule: the schedule was planned for " +
                       std::to_string(schedule.nodes[static_cast<std::size_t>(schedule.root)].last) + " layers, not " +
                       std::to_string(L));
  return detail::run_plan_node(layers, schedule, schedule.root, std::move(x), static_cast<bool*>(nullptr));
}

/// What checkpoint_sequential_auto measured and planned.
struct AutoScheduleReport {
  Chain chain;             ///< measured chain: times in FLOPs, sizes in units of `unit_bytes`
  std::size_t unit_bytes;  ///< sizes and budget were quantised to this many bytes (sizes rounded up)
  Schedule schedule;       ///< the persistent optimal schedule that ran
};

/// Measures a chain of layers with a probe pass, plans the persistent schedule with the fewest recomputed
/// FLOPs whose activation memory stays within `budget_bytes`, and runs it (run_schedule). Returns x_L.
///
/// The probe runs every layer once inside a checkpoint region that saves nothing (its values are freed
/// layer by layer and it is never replayed: it receives no gradient): for layer i it records the output
/// bytes ω_x, the bytes its backward would keep (the output plus every residual and op-specific buffer of
/// the layer's own ops: ω_x̄), and the FLOP estimates of its ops (u_f; u_b = 2·u_f). Bytes are quantised to
/// units of budget_bytes / resolution, sizes rounded up, so the plan never exceeds the budget in the model.
/// The budget covers what the planner's model counts: the chain's activations, kept tapes and activation
/// gradients (x_0 included), not weights, weight gradients or what comes after the chain.
///
/// Costs one extra forward pass (the probe) and plan_schedule's time O(L³·resolution) (milliseconds for a
/// dozen layers, seconds for 60). In a training loop whose shapes do not change, plan once: pass `report`
/// and run later steps with run_schedule(layers, report->schedule, x). A layer with dropout
/// draws its mask in the probe and again in the real pass, so the masks differ from a run without probe.
/// Throws domain_error when no schedule fits the budget (the message gives the least budget that fits).
template <class Layers, class T>
Var<T> checkpoint_sequential_auto(const Layers& layers, Var<T> x, std::size_t budget_bytes,
                                  AutoScheduleReport* report = nullptr, int resolution = 500) {
  const auto L = static_cast<int>(std::size(layers));
  if (L < 1) throw domain_error("checkpoint_sequential_auto: no layers");
  if (resolution < 1) throw domain_error("checkpoint_sequential_auto: resolution must be ≥ 1");
  x.node("checkpoint_sequential_auto");
  auto* state = x.state();
  const std::size_t unit = std::max<std::size_t>(1, budget_bytes / static_cast<std::size_t>(resolution));
  auto units = [&](std::size_t bytes) { return static_cast<std::int64_t>((bytes + unit - 1) / unit); };

  Chain chain;
  chain.activation_size.push_back(units(detail::Buffers<T>::bytes(x.shape())));
  checkpoint([&](Var<T> v) {
    for (int i = 0; i < L; ++i) {
      const std::int32_t begin = state->size();
      v = layers[static_cast<std::size_t>(i)](std::move(v));
      const std::int32_t end = state->size();
      double flops = 0;
      std::size_t tape = detail::Buffers<T>::bytes(v.shape());
      for (std::int32_t j = begin; j < end; ++j) {
        const detail::NodeCost c = state->cost(j);
        if (c.leaf) continue;
        flops += c.flops;
        if (c.value_read && j != v.id()) tape += c.bytes;  // the layer's output is counted above
        tape += c.extra_read_bytes;
      }
      chain.forward_time.push_back(std::max(flops, 1.0));
      chain.backward_time.push_back(2 * std::max(flops, 1.0));
      chain.activation_size.push_back(units(detail::Buffers<T>::bytes(v.shape())));
      chain.tape_size.push_back(units(tape));
    }
    return v;
  })(x);

  const auto budget = static_cast<std::int64_t>(budget_bytes / unit);
  Schedule schedule = plan_schedule(chain, budget, /*persistent=*/true);
  if (!schedule.feasible) {
    std::int64_t low = budget, high = budget + 1;
    while (!plan_schedule(chain, high, true).feasible) high *= 2;
    while (high - low > 1) {
      const std::int64_t mid = low + (high - low) / 2;
      (plan_schedule(chain, mid, true).feasible ? high : low) = mid;
    }
    throw domain_error("checkpoint_sequential_auto: no schedule of these " + std::to_string(L) + " layers fits in " +
                       std::to_string(budget_bytes) + " bytes; the least budget is about " +
                       std::to_string(static_cast<std::size_t>(high) * unit) + " bytes");
  }
  Var<T> result = run_schedule(layers, schedule, std::move(x));
  if (report) *report = AutoScheduleReport{std::move(chain), unit, std::move(schedule)};
  return result;
}

}  // namespace remat
