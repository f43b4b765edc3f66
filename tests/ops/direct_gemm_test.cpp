// detail::direct_gemm, the ?gemm call for products below the parallel grain (detail/direct_gemm.hpp): which
// products it takes, and that what it writes is bitwise what Eigen's product writes (assigned, and added to a
// gradient that already holds a value), for every transposition linear and matmul use, in float and double.
#include <gtest/gtest.h>

#include <cstring>

#include <remat/remat.hpp>

namespace direct_gemm_test {

using remat::Index;
using remat::detail::direct_gemm;
using remat::detail::has_blas_gemm;

template <class T>
using Map = Eigen::Map<const remat::Matrix<T>, Eigen::AlignedMax>;

template <class T>
remat::Matrix<T> values(Index rows, Index cols, unsigned seed) {
  remat::Matrix<T> m(rows, cols);
  std::uint64_t state = seed;
  for (Index i = 0; i < m.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    m.data()[i] = T(static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5);
  }
  return m;
}

template <class T>
bool bitwise_equal(const remat::Matrix<T>& a, const remat::Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// dst = or += product through direct_gemm and through Eigen, from the same start; expects `taken` and
/// bitwise-equal results.
template <class T, class Product>
void check(const Product& product, Index rows, Index cols, bool taken, const char* what) {
  for (const bool accumulate : {false, true}) {
    remat::Matrix<T> direct = values<T>(rows, cols, 5), eigen = direct;
    remat::AlignedMap<T> d(direct.data(), rows, cols);
    ASSERT_EQ(direct_gemm(d, product, accumulate), taken) << what;
    if (!taken) continue;
    if (accumulate)
      eigen.noalias() += product;
    else
      eigen.noalias() = product;
    EXPECT_TRUE(bitwise_equal(direct, eigen)) << what << (accumulate ? ", accumulating" : ", assigning");
  }
}

template <class T>
void check_transpositions(Index m, Index k, Index n, bool taken) {
  const remat::Matrix<T> a = values<T>(m, k, 1), at = values<T>(k, m, 2), b = values<T>(k, n, 3),
                         bt = values<T>(n, k, 4);
  const Map<T> A(a.data(), m, k), At(at.data(), k, m), B(b.data(), k, n), Bt(bt.data(), n, k);
  check<T>(A * B, m, n, taken, "x·W");                            // linear's forward
  check<T>(A * Bt.transpose(), m, n, taken, "dy·Wᵀ");             // its input gradient
  check<T>(At.transpose() * B, m, n, taken, "xᵀ·dy");             // its weight gradient
  check<T>(At.transpose() * Bt.transpose(), m, n, taken, "ᵀ·ᵀ");  // both transposed
}

TEST(DirectGemm, BelowTheGrainIsBitwiseEigensProductForEveryTransposition) {
  if (!has_blas_gemm<float>) GTEST_SKIP() << "built without REMAT_USE_BLAS: every product is Eigen's";
  check_transpositions<float>(16, 32, 32, true);  // W0's layers
  check_transpositions<double>(16, 32, 32, true);
  check_transpositions<float>(7, 13, 5, true);  // ragged, no packet multiple
  check_transpositions<double>(3, 300, 2, true);
}

TEST(DirectGemm, LeavesTinyLargeAndOtherProductsToEigen) {
  // rows + cols + depth below 20: Eigen's coefficient-based product.
  check_transpositions<float>(4, 5, 6, false);
  // A vector (one row or one column): Eigen's ?gemv.
  check_transpositions<double>(1, 300, 20, false);
  check_transpositions<double>(20, 300, 1, false);
  // 32768 elements or more: the team's zero fill and OpenBLAS's threads (assign_product).
  check_transpositions<float>(128, 8, 256, false);
  // A block is not a whole tape buffer.
  const remat::Matrix<float> a = values<float>(16, 32, 1), b = values<float>(32, 32, 2);
  const Map<float> A(a.data(), 16, 32), B(b.data(), 32, 32);
  check<float>(A.leftCols(16) * B.topRows(16), 16, 32, false, "blocks");
  // A lazy product (a custom op may pass one to add_grad): Eigen computes it coefficient by coefficient.
  check<float>(A.lazyProduct(B), 16, 32, false, "lazyProduct");
}

}  // namespace direct_gemm_test
