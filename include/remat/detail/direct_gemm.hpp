// Small matrix products straight to the BLAS: the one place where remat calls ?gemm itself instead of through
// Eigen's product (docs/design.md §6).
#pragma once

#include <climits>
#include <type_traits>

#include "remat/matrix.hpp"

namespace remat::detail {

/// Whether `T` has a BLAS ?gemm that Eigen declares (with EIGEN_USE_BLAS, which REMAT_USE_BLAS sets; not with
/// Intel MKL's own declarations).
template <class T>
inline constexpr bool has_blas_gemm =
#if defined(EIGEN_USE_BLAS) && !defined(EIGEN_USE_MKL)
    std::is_same_v<T, float> || std::is_same_v<T, double>;
#else
    false;
#endif

/// A row-major map of a whole tape buffer, as the contexts hand out (ConstAlignedMap).
template <class T>
using TapeMap = Eigen::Map<const Matrix<T>, Eigen::AlignedMax>;

/// A product operand ?gemm reads in place: a TapeMap or its transpose. Anything else (a block, an expression)
/// is not one, and its product stays Eigen's.
template <class X>
struct GemmOperand {
  static constexpr bool valid = false;
};
template <class T>
struct GemmOperand<TapeMap<T>> {
  static constexpr bool valid = true, transposed = false;
  static const TapeMap<T>& map(const TapeMap<T>& x) { return x; }
};
template <class T>
struct GemmOperand<Eigen::Transpose<TapeMap<T>>> {
  static constexpr bool valid = true, transposed = true;
  static const TapeMap<T>& map(const Eigen::Transpose<TapeMap<T>>& x) { return x.nestedExpression(); }
};
template <class T>
struct GemmOperand<Eigen::Transpose<const TapeMap<T>>> {
  static constexpr bool valid = true, transposed = true;
  static const TapeMap<T>& map(const Eigen::Transpose<const TapeMap<T>>& x) { return x.nestedExpression(); }
};

/// Eigen::Product<L, R, DefaultProduct>: a product Eigen may send to the BLAS (a lazyProduct it never does).
template <class E>
inline constexpr bool is_default_product = false;
template <class L, class R>
inline constexpr bool is_default_product<Eigen::Product<L, R, Eigen::DefaultProduct>> = true;

/// Products whose output has fewer elements go to ?gemm directly: detail::parallel_grain's 32768, above which
/// remat's team zero-fills the output and OpenBLAS threads the product (detail::assign_product).
inline constexpr Index direct_gemm_elements = 32768;

/// Eigen evaluates a product with rows + cols + depth below this coefficient by coefficient, without the BLAS
/// (EIGEN_GEMM_TO_COEFFBASED_THRESHOLD): remat leaves those to it.
inline constexpr Index gemm_coefficient_threshold = 20;

/// dst = op(a)·op(b), or dst += op(a)·op(b) when `accumulate`, for a product `e` of two GemmOperands, as one
/// ?gemm call with beta 0 or 1; returns false (and does nothing) where that does not apply: no BLAS, another
/// scalar or operand type, a lazyProduct, dst of direct_gemm_elements or more, a product Eigen computes without the
/// BLAS, or a vector (one row or one column: Eigen calls ?gemv, which rounds differently). Through Eigen, the same
/// product zeroes dst, then calls ?gemm with beta = 1 after choosing a blocking: on W0's [16,32] layers 18–38 ns more
/// per product (bench/probes/README.md), with the same result (the GEMM adds to exact zeros what beta = 0 writes).
template <class T, class E>
bool direct_gemm(Eigen::Map<Matrix<T>, Eigen::AlignedMax> dst, const E& e, bool accumulate) {
  if constexpr (has_blas_gemm<T> && is_default_product<E>) {
    using Lhs = GemmOperand<std::decay_t<decltype(e.lhs())>>;
    using Rhs = GemmOperand<std::decay_t<decltype(e.rhs())>>;
    if constexpr (Lhs::valid && Rhs::valid) {
      const auto& a = Lhs::map(e.lhs());
      const auto& b = Rhs::map(e.rhs());
      const Index m = dst.rows(), n = dst.cols(), k = e.lhs().cols();
      if (dst.size() >= direct_gemm_elements || m + n + k < gemm_coefficient_threshold || m == 1 || n == 1 ||
          k > INT_MAX || a.cols() > INT_MAX || b.cols() > INT_MAX)
        return false;
      // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B's buffer first.
      const char ta = Lhs::transposed ? 'T' : 'N', tb = Rhs::transposed ? 'T' : 'N';
      const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
      const int lda = static_cast<int>(a.cols()), ldb = static_cast<int>(b.cols());
      const T one = 1, beta = accumulate ? 1 : 0;
      if constexpr (std::is_same_v<T, float>)
        sgemm_(&tb, &ta, &ni, &mi, &ki, &one, b.data(), &ldb, a.data(), &lda, &beta, dst.data(), &ni);
      else
        dgemm_(&tb, &ta, &ni, &mi, &ki, &one, b.data(), &ldb, a.data(), &lda, &beta, dst.data(), &ni);
      return true;
    }
  }
  static_cast<void>(dst), static_cast<void>(e), static_cast<void>(accumulate);
  return false;
}

/// Row-major C = op(A)·op(B) + beta·C for an [m,k]·[k,n] product (op(X) = Xᵀ when its flag is set, with X stored
/// [k,m] or [n,k]), leading dimensions lda, ldb, ldc in elements: one ?gemm call where the BLAS has one (the
/// batched matmul's per-matrix products), else Eigen's product. beta is 0 or 1.
template <class T>
void gemm_row_major(bool transpose_a, bool transpose_b, Index m, Index n, Index k, const T* a, Index lda, const T* b,
                    Index ldb, T beta, T* c, Index ldc) {
  if constexpr (has_blas_gemm<T>) {
    if (m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX) {
      // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: B's buffer first.
      const char ta = transpose_a ? 'T' : 'N', tb = transpose_b ? 'T' : 'N';
      const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
      const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
      const T one = 1;
      if constexpr (std::is_same_v<T, float>)
        sgemm_(&tb, &ta, &ni, &mi, &ki, &one, b, &lb, a, &la, &beta, c, &lc);
      else
        dgemm_(&tb, &ta, &ni, &mi, &ki, &one, b, &lb, a, &la, &beta, c, &lc);
      return;
    }
  }
  using Map = Eigen::Map<const Matrix<T>, 0, Eigen::OuterStride<>>;
  const Map ma(a, transpose_a ? k : m, transpose_a ? m : k, Eigen::OuterStride<>(lda));
  const Map mb(b, transpose_b ? n : k, transpose_b ? k : n, Eigen::OuterStride<>(ldb));
  Eigen::Map<Matrix<T>, 0, Eigen::OuterStride<>> mc(c, m, n, Eigen::OuterStride<>(ldc));
  auto product = [&](const auto& x, const auto& y) {
    if (beta == T(0))
      mc.noalias() = x * y;
    else
      mc.noalias() += x * y;
  };
  if (transpose_a && transpose_b)
    product(ma.transpose(), mb.transpose());
  else if (transpose_a)
    product(ma.transpose(), mb);
  else if (transpose_b)
    product(ma, mb.transpose());
  else
    product(ma, mb);
}

}  // namespace remat::detail
