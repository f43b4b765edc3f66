// detail::column_sums, the sum over rows behind the bias gradients, sum_cols, mean_cols and layer_norm's
// dgain (detail/parallel.hpp): against a long double oracle that shares none of its partition, and bitwise
// the same with and without its scratch buffer, at 1, 2 and 3 threads, assigning and accumulating, on shapes
// whose row blocks and column chunks both end ragged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <remat/remat.hpp>

#include "restore_threads.hpp"

namespace column_sums_test {

using remat::Index;
using remat::detail::column_sum_partition;
using remat::detail::ColumnSumPartition;

using remat_test::RestoreThreads;

template <class T>
remat::Matrix<T> values(Index rows, Index cols, unsigned seed) {
  remat::Matrix<T> m(rows, cols);
  std::uint64_t state = seed;
  for (Index i = 0; i < m.size(); ++i) {  // a fixed LCG, so no two runs differ
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    m.data()[i] = T(static_cast<double>(state >> 11) / 9007199254740992.0 - 0.5) * T(1 + i % 7);
  }
  return m;
}

/// column_sums of x into a copy of `initial`, with or without the scratch buffer.
template <class T>
std::vector<T> run(const remat::Matrix<T>& x, double cost, const std::vector<T>& initial, bool accumulate,
                   bool scratch) {
  const ColumnSumPartition p = column_sum_partition(x.rows(), x.cols(), cost);
  std::vector<T> dst = initial;
  std::vector<T> buffer(static_cast<std::size_t>(p.rows.count * x.cols()));
  const auto row = [&](Index i, Index c0, Index w) { return x.row(i).segment(c0, w).array(); };
  remat::detail::column_sums(p, row, dst.data(), accumulate, scratch ? buffer.data() : nullptr);
  return dst;
}

template <class T>
void check_shape(Index rows, Index cols, double cost, Index row_blocks, Index chunks) {
  RestoreThreads restore;
  const ColumnSumPartition p = column_sum_partition(rows, cols, cost);
  ASSERT_EQ(p.rows.count, row_blocks);
  ASSERT_EQ(p.columns.count, chunks);
  const remat::Matrix<T> x = values<T>(rows, cols, 7);
  const std::vector<T> initial = [&] {
    const remat::Matrix<T> m = values<T>(1, cols, 11);
    return std::vector<T>(m.data(), m.data() + cols);
  }();
  for (const bool accumulate : {false, true}) {
    // The oracle: each column summed in long double, in row order, then added to the initial value.
    std::vector<long double> exact(static_cast<std::size_t>(cols), 0.0L), magnitude(exact);
    for (Index c = 0; c < cols; ++c) {
      for (Index i = 0; i < rows; ++i) {
        exact[c] += x(i, c);
        magnitude[c] += std::fabs(static_cast<long double>(x(i, c)));
      }
      if (accumulate) {
        exact[c] += initial[c];
        magnitude[c] += std::fabs(static_cast<long double>(initial[c]));
      }
    }
    remat::set_num_threads(1);
    const std::vector<T> reference = run(x, cost, initial, accumulate, true);
    const long double eps = std::numeric_limits<T>::epsilon();
    for (Index c = 0; c < cols; ++c)
      ASSERT_LE(std::fabs(reference[c] - exact[c]), (rows + 1) * eps * magnitude[c])
          << "column " << c << " of [" << rows << "," << cols << "], accumulate " << accumulate;
    for (const int threads : {1, 2, 3}) {
      remat::set_num_threads(threads);
      for (const bool scratch : {true, false}) {
        const std::vector<T> got = run(x, cost, initial, accumulate, scratch);
        EXPECT_EQ(std::memcmp(got.data(), reference.data(), got.size() * sizeof(T)), 0)
            << "[" << rows << "," << cols << "] at " << threads << " threads, scratch " << scratch << ", accumulate "
            << accumulate;
      }
    }
  }
}

// [300,700]: 16 row blocks of 19 rows (the last of 15), 3 column chunks (the last of 188 columns).
TEST(ColumnSums, MatchTheOracleAndAreBitwiseEqualWithoutScratchAndAt1And2And3Threads) {
  check_shape<float>(300, 700, 1, 16, 3);
  check_shape<double>(300, 700, 1, 16, 3);
  // [50,1000]: 4 row blocks of 16 (the last of 2), 4 chunks (the last of 232).
  check_shape<float>(50, 1000, 1, 4, 4);
  // [2000,20]: 16 row blocks of 125, one chunk narrower than column_chunk.
  check_shape<double>(2000, 20, 1, 16, 1);
  // Below the grain: one block; columns still in chunks of column_chunk, on the calling thread.
  check_shape<float>(10, 300, 1, 1, 2);
}

TEST(ColumnSums, BelowTheGrainNoTeamAboveItTheTeam) {
  EXPECT_FALSE(column_sum_partition(16, 32, 1).team);  // W0's bias gradients
  EXPECT_TRUE(column_sum_partition(2048, 1024, 1).team);
  EXPECT_EQ(column_sum_partition(2048, 1024, 1).rows.count, remat::detail::max_column_sum_blocks);
}

// assign_column_sums (the bias gradients, sum_cols): Eigen's colwise sum below the grain, column_sums above,
// both against the oracle.
TEST(ColumnSums, AssignColumnSumsMatchesTheOracleBelowAndAboveTheGrain) {
  for (const Index rows : {16, 700}) {
    const remat::Matrix<double> x = values<double>(rows, 300, 3);
    remat::Matrix<double> dst(1, 300);
    remat::detail::assign_column_sums<double>(remat::AlignedMap<double>(dst.data(), 1, 300), x, false, 1);
    for (Index c = 0; c < 300; ++c) {
      long double exact = 0;
      for (Index i = 0; i < rows; ++i) exact += x(i, c);
      EXPECT_NEAR(static_cast<double>(dst(0, c)), static_cast<double>(exact), 1e-12) << rows << " rows, column " << c;
    }
  }
}

}  // namespace column_sums_test
