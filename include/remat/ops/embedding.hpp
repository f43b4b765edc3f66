// embedding: rows of a table selected by integer ids (a lookup table, torch.nn.functional.embedding).
#pragma once

#include <string>
#include <vector>

#include "remat/op.hpp"

namespace remat {
namespace detail {

struct EmbeddingOp : OpBase {
  static constexpr const char* name = "embedding";
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    Index rows = 0;  ///< number of ids
  };
  /// The gradient scatters rows by id: it reads the ids (kept with the op), no tensor.
  static unsigned reads(GradInputs) { return reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) {
    check_rank(name, "table", in[0], 2);
    return {p.rows, in[0].cols()};
  }
  /// At least one id, each in [0, rows of the table): shape_error, index_error.
  static void check_indices(const Shape* in, const int* ids, std::size_t count) {
    const Shape s = in[0];
    if (count == 0) throw shape_error("embedding: no ids (table " + to_string(s) + "); pass at least one");
    for (std::size_t i = 0; i < count; ++i)
      if (ids[i] < 0 || ids[i] >= s.rows())
        throw index_error("embedding: id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                          " is outside [0, " + std::to_string(s.rows()) + ") for a table of " +
                          std::to_string(s.rows()) + " rows (V = " + std::to_string(s.rows()) + ")");
  }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto table = c.in(0);
    auto y = c.out();
    const int* ids = c.indices();
    for (Index i = 0; i < y.rows(); ++i) y.row(i) = table.row(ids[i]);
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    GradTarget<T> d = c.grad_target(0);
    if (!d.accumulate) d.map.setZero();
    const auto g = c.grad_out();
    const int* ids = c.indices();
    for (Index i = 0; i < g.rows(); ++i) d.map.row(ids[i]) += g.row(i);  // repeated ids accumulate
  }
  /// One per element moved (no arithmetic; the planners' cost of regenerating it).
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

}  // namespace detail

/// Row lookup: y row i = table row ids[i]. table: [V,H], ids: N entries in [0, V) → [N,H].
/// d table row v = Σ over i with ids[i] = v of dy row i (a scatter-add: repeated ids accumulate).
/// The ids are copied to the tape. Throws shape_error for no ids, index_error naming the id, its position
/// and V for an id outside [0, V) (as cross_entropy does for a label).
template <class T>
Var<T> embedding(const Var<T>& table, const std::vector<int>& ids) {
  const Shape s = table.shape();
  detail::EmbeddingOp::check_indices(&s, ids.data(), ids.size());
  OpCall<detail::EmbeddingOp> call;
  call.params.rows = static_cast<Index>(ids.size());
  call.indices = ids.data();
  call.index_count = ids.size();
  return apply_op<detail::EmbeddingOp>(call, table);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::EmbeddingOp)
