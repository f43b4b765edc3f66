// Independent oracles for the planner tests: an operation-sequence simulator of the Chain cost model, an
// exhaustive optimal search over all schedules (Dijkstra over held-value states), and the
// checkpoint_sequential schedule written as an operation sequence. None of this uses the planner's code.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "remat/schedule/planner.hpp"

namespace remat_test {

struct Simulation {
  bool valid = false;
  std::string error;
  double time = 0;
  std::int64_t peak = 0;
};

/// Runs `ops` in the cost model of docs/schedules.md (with its forward, forward-all and backward overheads and gradient
/// sizes: F_i peaks o_f above its output, Fall_i o_f̄ above its tape, B_i o_b above δ_{i−1}, and B_i leaves g_i held;
/// an activation held weighs its checkpoint size ω_c, its gradient ω_x) and reports total time and peak memory
/// (or the first violation).
inline Simulation simulate(const remat::Chain& c, const std::vector<remat::ScheduleOperation>& ops) {
  const int L = c.length();
  enum Status { none, activation, tape };
  std::vector<int> status(static_cast<std::size_t>(L + 1), none);
  status[0] = activation;
  int delta = -1;              // index of the δ held, -1 before the backward starts
  std::int64_t gradients = 0;  // Σ g of the layers backpropagated so far (held to the end)
  auto overhead = [](const std::vector<std::int64_t>& v, std::size_t u) { return v.empty() ? 0 : v[u - 1]; };
  auto size = [&](int j) -> std::int64_t {
    const auto u = static_cast<std::size_t>(j);
    return status[u] == activation ? c.checkpoint_size_of(j) : status[u] == tape ? c.tape_size[u - 1] : 0;
  };
  auto memory = [&] {
    std::int64_t m = (delta >= 0 ? c.activation_size[static_cast<std::size_t>(delta)] : 0) + gradients;
    for (int j = 0; j <= L; ++j) m += size(j);
    return m;
  };
  Simulation r;
  r.peak = memory();
  auto fail = [&](const std::string& what, std::size_t k) {
    r.error = what + " at operation " + std::to_string(k);
    return r;
  };
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const int i = ops[k].layer;
    const auto u = static_cast<std::size_t>(i);
    switch (ops[k].kind) {
      case remat::ScheduleOperation::forward:
      case remat::ScheduleOperation::forward_all: {
        const bool all = ops[k].kind == remat::ScheduleOperation::forward_all;
        if (i < 1 || i > L) return fail("layer out of range", k);
        if (status[u - 1] == none) return fail("forward without its input", k);
        if (status[u] != none) return fail("forward over a held value", k);
        r.peak = std::max(r.peak, memory() + (all ? c.tape_size[u - 1] + overhead(c.forward_all_overhead, u)
                                                  : c.activation_size[u] + overhead(c.forward_overhead, u)));
        status[u] = all ? tape : activation;
        r.peak = std::max(r.peak, memory());  // what F_i leaves: ω_c may exceed ω_x + o_f
        r.time += c.forward_time[u - 1];
        break;
      }
      case remat::ScheduleOperation::backward: {
        const int expected = delta < 0 ? L : delta;
        if (i != expected) return fail("backward out of order", k);
        if (status[u] != tape) return fail("backward without the layer's tape", k);
        if (status[u - 1] == none) return fail("backward without the layer's input", k);
        r.peak = std::max(r.peak, memory() + (delta < 0 ? c.activation_size[u] : 0) + c.activation_size[u - 1] +
                                      overhead(c.backward_overhead, u));
        status[u] = none;
        delta = i - 1;
        gradients += overhead(c.gradient_size, u);
        r.time += c.backward_time[u - 1];
        break;
      }
      case remat::ScheduleOperation::free_activation:
        if (i < 0 || i > L || status[u] != activation) return fail("free of a value not held as activation", k);
        status[u] = none;
        break;
    }
  }
  if (delta != 0) return fail("backward incomplete", ops.size());
  r.valid = true;
  return r;
}

/// The least total time over all schedules with peak ≤ budget, by Dijkstra over states (next backward
/// layer k, status of x_0 … x_k ∈ {none, x_j, x̄_j}); +∞ when none fits. Exponential: for L ≤ 8.
inline double brute_force_optimum(const remat::Chain& c, std::int64_t budget) {
  const int L = c.length();
  // State: k in the low 4 bits, then 2 bits per position j = 0…L (0 none, 1 activation, 2 tape).
  using State = std::uint64_t;
  auto status = [](State s, int j) { return static_cast<int>((s >> (4 + 2 * j)) & 3u); };
  auto with = [](State s, int j, int v) {
    return (s & ~(State{3} << (4 + 2 * j))) | (static_cast<State>(v) << (4 + 2 * j));
  };
  auto next = [](State s) { return static_cast<int>(s & 15u); };
  auto term = [](const std::vector<std::int64_t>& v, std::size_t u) { return v.empty() ? 0 : v[u - 1]; };
  auto memory = [&](State s) {
    const int k = next(s);
    std::int64_t m = k < L ? c.activation_size[static_cast<std::size_t>(k)] : 0;
    for (int j = k + 1; j <= L; ++j) m += term(c.gradient_size, static_cast<std::size_t>(j));
    for (int j = 0; j <= k; ++j) {
      const int v = status(s, j);
      if (v == 1) m += c.checkpoint_size_of(j);
      if (v == 2) m += c.tape_size[static_cast<std::size_t>(j - 1)];
    }
    return m;
  };
  const State start = with(static_cast<State>(L), 0, 1);
  if (memory(start) > budget) return std::numeric_limits<double>::infinity();
  std::unordered_map<State, double> best;
  using Item = std::pair<double, State>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> queue;
  best[start] = 0;
  queue.push({0, start});
  while (!queue.empty()) {
    const double d = queue.top().first;  // (not a structured binding: lambdas below capture it)
    const State s = queue.top().second;
    queue.pop();
    if (d > best[s]) continue;
    const int k = next(s);
    if (k == 0) return d;
    const std::int64_t m = memory(s);
    auto relax = [&](State t, double cost) {
      auto it = best.find(t);
      if (it == best.end() || d + cost < it->second) {
        best[t] = d + cost;
        queue.push({d + cost, t});
      }
    };
    for (int j = 1; j <= k; ++j) {  // free (x_0 is never recomputable, freeing it only loses)
      if (status(s, j) != 0) relax(with(s, j, 0), 0);
    }
    for (int j = 1; j <= k; ++j) {
      if (status(s, j - 1) == 0 || status(s, j) != 0) continue;
      const auto u = static_cast<std::size_t>(j);
      if (j < k && m + std::max(c.activation_size[u] + term(c.forward_overhead, u), c.checkpoint_size_of(j)) <= budget)
        relax(with(s, j, 1), c.forward_time[u - 1]);
      if (m + c.tape_size[u - 1] + term(c.forward_all_overhead, u) <= budget)
        relax(with(s, j, 2), c.forward_time[u - 1]);
    }
    if (status(s, k) == 2 && status(s, k - 1) != 0) {
      const auto u = static_cast<std::size_t>(k);
      const std::int64_t peak =
          m + (k == L ? c.activation_size[u] : 0) + c.activation_size[u - 1] + term(c.backward_overhead, u);
      if (peak <= budget) {
        State t = with(s, k, 0);
        t = (t & ~State{15}) | static_cast<State>(k - 1);
        relax(t, c.backward_time[u - 1]);
      }
    }
  }
  return std::numeric_limits<double>::infinity();
}

/// checkpoint_sequential(layers, segments) (PyTorch semantics: groups of ⌊L/segments⌋ layers, the last takes
/// the rest; each group but the last keeps only its input and is recomputed with its full tape before
/// its backward) as an operation sequence of the cost model.
inline std::vector<remat::ScheduleOperation> sequential_operations(int L, int segments) {
  using Op = remat::ScheduleOperation;
  std::vector<Op> ops;
  const int size = L / segments;
  std::vector<int> start;  // x_start is each group's input
  for (int g = 0; g < segments; ++g) start.push_back(g * size);
  for (int g = 0; g + 1 < segments; ++g)
    for (int j = start[g] + 1; j <= start[g + 1]; ++j) {
      ops.push_back({Op::forward, j});
      if (j - 1 != start[g]) ops.push_back({Op::free_activation, j - 1});
    }
  for (int j = start.back() + 1; j <= L; ++j) ops.push_back({Op::forward_all, j});
  for (int j = L; j > start.back(); --j) ops.push_back({Op::backward, j});
  for (int g = segments - 2; g >= 0; --g) {
    ops.push_back({Op::free_activation, start[g + 1]});
    for (int j = start[g] + 1; j <= start[g + 1]; ++j) ops.push_back({Op::forward_all, j});
    for (int j = start[g + 1]; j > start[g]; --j) ops.push_back({Op::backward, j});
  }
  return ops;
}

}  // namespace remat_test
