// Stale-Parameter detection: a Parameter's version must be the one recorded whenever its value is read.
// The checks run on every input of every record and on every node before a sweep: the tests inline, the
// messages (throw_*) do not.
#pragma once

#include <cstdint>
#include <string>

#include "remat/detail/node.hpp"
#include "remat/errors.hpp"

namespace remat::detail {

template <class T>
[[noreturn]] void throw_parameter_modified(const Graph<T>& graph, std::int32_t id, const char* op) {
  const Node<T>& n = graph[id];
  const Shape now{n.parameter->value.rows(), n.parameter->value.cols()};
  throw stale_value_error(std::string(op) + ": the Parameter " + to_string(n.shape) + " recorded as node #" +
                          std::to_string(id) + " was modified after it was recorded (version " +
                          std::to_string(n.parameter->version) + ", recorded at version " +
                          std::to_string(n.parameter_version) + (now != n.shape ? ", now " + to_string(now) : "") +
                          "); run the forward pass again after updating parameters");
}
/// The node whose buffer node `id`'s value is: `id`, or for a view (OpBase::view) whose value is there, its input
/// 0's owner (a view of a view of a Parameter reads the Parameter's storage).
template <class T>
inline std::int32_t buffer_owner(const Graph<T>& graph, std::int32_t id) {
  while (graph[id].is_view() && graph[id].value) id = graph[id].inputs[0];
  return id;
}
/// Throws stale_value_error naming `op` if node `id` references a Parameter modified since it was recorded, or is
/// a view of one (its storage may have been reallocated, so reading the node's value would read freed memory).
template <class T>
inline void check_parameter_current(const Graph<T>& graph, std::int32_t id, const char* op) {
  const Node<T>& v = graph[id];
  // Most inputs: a leaf (a Parameter's or not) or an op that is no view, whose buffer is its own. Only a leaf
  // references a Parameter, so such an op's value is none's.
  if (v.op && !v.op->view) return;
  const std::int32_t owner = buffer_owner(graph, id);
  const Node<T>& n = graph[owner];
  if (n.parameter && n.parameter->version != n.parameter_version) throw_parameter_modified(graph, owner, op);
}

template <class T>
[[noreturn]] void throw_parameter_reassigned(const Graph<T>& graph, std::int32_t id, const char* op) {
  throw stale_value_error(std::string(op) + ": the Parameter " + to_string(graph[id].shape) + " recorded as node #" +
                          std::to_string(id) +
                          " was assigned to or moved from after it was recorded (std::swap, vector::erase and "
                          "sort assign), so its gradient has no place to go; run the forward pass again");
}
/// Throws stale_value_error naming `op` if node `id` references a Parameter that was assigned to or moved
/// from since it was recorded: its gradient would go to whatever value replaced the recorded one.
template <class T>
inline void check_parameter_not_reassigned(const Graph<T>& graph, std::int32_t id, const char* op) {
  const Node<T>& n = graph[id];
  if (n.parameter && n.parameter->assignments != n.parameter_assignments) throw_parameter_reassigned(graph, id, op);
}

template <class T>
[[noreturn]] void throw_parameter_resized(const Graph<T>& graph, std::int32_t id, const char* op) {
  const Node<T>& n = graph[id];
  throw stale_value_error(std::string(op) + ": the Parameter " + to_string(n.shape) + " recorded as node #" +
                          std::to_string(id) + " was resized to " +
                          to_string(Shape{n.parameter->value.rows(), n.parameter->value.cols()}) +
                          " after it was recorded, so its gradient (of the recorded shape) has no place to go; clear() "
                          "the tape and run the forward pass again");
}
/// Throws stale_value_error naming `op` if node `id` references a Parameter whose shape is no longer the
/// recorded one: a backward would hand it a gradient of the recorded shape.
template <class T>
inline void check_parameter_same_shape(const Graph<T>& graph, std::int32_t id, const char* op) {
  const Node<T>& n = graph[id];
  if (n.parameter && (n.parameter->value.rows() != n.shape.rows() || n.parameter->value.cols() != n.shape.cols()))
    throw_parameter_resized(graph, id, op);
}

}  // namespace remat::detail
