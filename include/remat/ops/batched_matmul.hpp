// matmul beyond two matrices, with torch.matmul's rules: vectors promoted and the added dimension removed again,
// batched products over broadcast batch dimensions. matmul() (ops/matmul.hpp) records this op unless both
// operands are matrices.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "remat/detail/broadcast.hpp"
#include "remat/detail/direct_gemm.hpp"
#include "remat/op.hpp"

namespace remat {
namespace detail {

/// How torch.matmul reads A and B: each a batch of [m,k] and [k,n] matrices (a vector A is [1,k], a vector B
/// [k,1]), their batch dimensions broadcast to `batch`.
struct MatmulLayout {
  Index m = 0, k = 0, n = 0;
  Shape a_batch, b_batch, batch;  // each with a trailing 1, so that BroadcastRows maps batch entries
  Shape out;

  Index batches() const { return batch.numel(); }
};

/// The shape of the `n` dims at `d`, without a heap allocation (the kernels call matmul_layout during a sweep,
/// where an allocation that fails cannot be recovered from).
inline MatmulLayout matmul_layout(const Shape& a, const Shape& b) {
  const char* op = "matmul";
  if (a.rank() == 0 || b.rank() == 0)
    throw shape_error(std::string(op) + ": A is " + to_string(a) + " and B " + to_string(b) +
                      "; both need at least one dimension (multiply scalars with *)");
  MatmulLayout l;
  const bool a_vector = a.rank() == 1, b_vector = b.rank() == 1;
  l.m = a_vector ? 1 : a[a.rank() - 2];
  l.k = a[a.rank() - 1];
  const Index kb = b_vector ? b[0] : b[b.rank() - 2];
  l.n = b_vector ? 1 : b[b.rank() - 1];
  if (l.k != kb)
    throw shape_error(std::string(op) + ": A is " + to_string(a) + " but B is " + to_string(b) +
                      "; A's last dimension (" + std::to_string(l.k) + ") must equal B's " +
                      (b_vector ? "only" : "second-to-last") + " dimension (" + std::to_string(kb) + ")");
  // The batch dims (all but the last two, padded with 1s to the longer) and their broadcast, each with a trailing 1.
  const int ra = std::max(a.rank() - 2, 0), rb = std::max(b.rank() - 2, 0), rank = std::max(ra, rb);
  Index da[Shape::max_rank], db[Shape::max_rank], dc[Shape::max_rank];
  for (int d = 0; d < rank; ++d) {
    const Index x = d < rank - ra ? 1 : a[d - (rank - ra)], y = d < rank - rb ? 1 : b[d - (rank - rb)];
    if (x != y && x != 1 && y != 1)  // broadcast_shape's error
      broadcast_shape(op, make_shape(a.begin(), ra), make_shape(b.begin(), rb));
    dc[d] = x == 1 ? y : x;
  }
  std::copy(a.begin(), a.begin() + ra, da);
  std::copy(b.begin(), b.begin() + rb, db);
  const auto with_one = [](Index* d, int n) {
    if (n < Shape::max_rank) d[n++] = 1;
    return make_shape(d, n);
  };
  l.a_batch = with_one(da, ra);
  l.b_batch = with_one(db, rb);
  int n = rank;
  if (!a_vector && n < Shape::max_rank) dc[n++] = l.m;
  if (!b_vector && n < Shape::max_rank) dc[n++] = l.n;
  l.out = make_shape(dc, n);
  l.batch = with_one(dc, rank);
  return l;
}

/// torch.matmul for operands that are not both matrices. `Batched`: the output has batch dimensions (what
/// dots_with_no_batch_dims_saveable looks at); without, a vector-matrix or matrix-vector product.
template <bool Batched>
struct GeneralMatmulOp : OpBase {
  static constexpr const char* name = "matmul";
  static constexpr OpKind kind = OpKind::dot;
  static constexpr bool batch_dims = Batched;
  /// dA reads B, dB reads A.
  static unsigned reads(GradInputs g) { return (wants(g, 0) ? reads_input1 : 0u) | (wants(g, 1) ? reads_input0 : 0u); }
  static Shape output_shape(const Shape* in, const Params&) { return matmul_layout(in[0], in[1]).out; }

  /// C_i = A_i·B_i for every batch entry i, on remat's team above the grain (each product then on one thread).
  /// A batch of A times one matrix B is one product of A's [batch·m, k] matrix view, as PyTorch folds it.
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const MatmulLayout l = matmul_layout(c.in_shape(0), c.in_shape(1));
    const T* a = c.in(0).data();
    const T* b = c.in(1).data();
    T* out = c.out().data();
    if (folds(l)) {
      gemm_row_major(false, false, l.batches() * l.m, l.n, l.k, a, l.k, b, l.n, T(0), out, l.n);
      return;
    }
    const BroadcastRows ra(l.a_batch, l.batch), rb(l.b_batch, l.batch);
    const bool team = l.batches() > 1 && above_grain(l.batches() * l.m * l.n, 2.0 * static_cast<double>(l.k));
    const BlasOnOneThread blas(team);
    for_items(team, l.batches(), [&](Index i) {
      gemm_row_major(false, false, l.m, l.n, l.k, a + ra.offset(i) * l.m * l.k, l.k, b + rb.offset(i) * l.k * l.n, l.n,
                     T(0), out + i * l.m * l.n, l.n);
    });
  }

  /// dA_i = dC_i·B_iᵀ and dB_i = A_iᵀ·dC_i per matrix, summed over the batch entries that read one operand matrix
  /// (broadcast), in batch order. Folded (see forward): dA = dC·Bᵀ and dB = Aᵀ·dC on the matrix views.
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const MatmulLayout l = matmul_layout(c.in_shape(0), c.in_shape(1));
    const T* g = c.grad_out().data();
    const bool fold = folds(l);
    if (c.wants_grad(0)) {
      const T* b = c.in(1).data();
      const BroadcastRows rb(l.b_batch, l.batch);
      if (fold) {
        GradTarget<T> t = c.grad_target(0);
        gemm_row_major(false, true, l.batches() * l.m, l.k, l.n, g, l.n, b, l.n, t.accumulate ? T(1) : T(0),
                       t.map.data(), l.k);
      } else {
        accumulate(c, 0, l, l.a_batch, l.m * l.k, [&](Index i, T* dst, T beta) {
          gemm_row_major(false, true, l.m, l.k, l.n, g + i * l.m * l.n, l.n, b + rb.offset(i) * l.k * l.n, l.n, beta,
                         dst, l.k);
        });
      }
    }
    if (c.wants_grad(1)) {
      const T* a = c.in(0).data();
      const BroadcastRows ra(l.a_batch, l.batch);
      if (fold) {
        GradTarget<T> t = c.grad_target(1);
        gemm_row_major(true, false, l.k, l.n, l.batches() * l.m, a, l.k, g, l.n, t.accumulate ? T(1) : T(0),
                       t.map.data(), l.n);
      } else {
        accumulate(c, 1, l, l.b_batch, l.k * l.n, [&](Index i, T* dst, T beta) {
          gemm_row_major(true, false, l.k, l.n, l.m, a + ra.offset(i) * l.m * l.k, l.k, g + i * l.m * l.n, l.n, beta,
                         dst, l.n);
        });
      }
    }
  }

  static double flops(const Shape* in, int, const Shape&) {
    const MatmulLayout l = matmul_layout(in[0], in[1]);
    return 2.0 * static_cast<double>(l.batches()) * static_cast<double>(l.m) * static_cast<double>(l.k) *
           static_cast<double>(l.n);
  }

 private:
  /// A has batch dimensions of its own and B is one matrix (or a vector): one product of A's matrix view.
  static bool folds(const MatmulLayout& l) { return l.b_batch.numel() == 1 && l.a_batch.numel() == l.batches(); }

  /// Writes input k's gradient, whose batch is `own` (matrices of `size` elements): product(i, dst, beta) adds
  /// batch entry i's part to dst (beta 1) or assigns it (beta 0). Matrix by matrix on remat's team above the grain
  /// (each product on one thread), each matrix's entries in batch order: the same sums at every thread count
  /// while there are two matrices or more.
  template <class T, class Product>
  static void accumulate(const BackwardContext<T>& c, int k, const MatmulLayout& l, const Shape& own, Index size,
                         Product product) {
    GradTarget<T> t = c.grad_target(k);
    T* grad = t.map.data();
    const BroadcastRows r(own, l.batch);
    const Index matrices = own.numel();
    const bool team =
        matrices > 1 && above_grain(l.batches() * size, 2.0 * static_cast<double>(l.m * l.n * l.k) / size);
    const BlasOnOneThread blas(team);
    for_items(team, matrices, [&](Index j) {
      bool first = !t.accumulate;
      for (Index i = 0; i < l.batches(); ++i) {
        if (matrices > 1 && r.offset(i) != j) continue;
        product(i, grad + j * size, first ? T(0) : T(1));
        first = false;
      }
    });
  }
};

}  // namespace detail
}  // namespace remat

REMAT_OP_KERNELS(remat::detail::GeneralMatmulOp<true>)
REMAT_OP_KERNELS(remat::detail::GeneralMatmulOp<false>)
