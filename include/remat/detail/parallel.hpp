// The one place where remat's op kernels go parallel (docs/design.md §6). A kernel splits its work into a
// fixed partition — row blocks, column blocks or items — that depends on the shape and on the constants
// below, never on the number of threads; the blocks run on an OpenMP team (remat::num_threads() threads)
// when the work is at least parallel_grain, or one after another on the calling thread otherwise (or when
// the program has no OpenMP, or already runs inside an OpenMP parallel region). A reduction across blocks
// combines the blocks' partial results in block order. So a kernel's results depend on its shapes only,
// bitwise, whatever the number of threads. Below the grain a kernel is one block: no team is woken.
#pragma once

#include <algorithm>
#include <atomic>
#include <new>
#include <numeric>
#include <type_traits>
#include <vector>

#include "remat/op_context.hpp"
#include "remat/matrix.hpp"
#include "remat/threads.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace remat::detail {

/// Work, in elements × the op's cost per element (about one FLOP each), below which a kernel is one block
/// and runs on the calling thread: waking a team costs about as much as a few thousand FLOPs, so tiny
/// tensors (W0's [16,32]: 512 elements) never pay for it.
inline constexpr double parallel_grain = 32768;
static_assert(direct_gemm_elements == parallel_grain, "direct_gemm takes the products below the grain");
/// Elements of a row block (rounded to whole rows, at least one row): large enough that a block's work
/// dwarfs handing it to a thread, small enough for dozens of blocks in a layer's [2048,1024] activations.
inline constexpr Index block_elements = 8192;
/// Columns of a column chunk of a column sum (a sum over rows): 1 KiB of each float row, read contiguously.
inline constexpr Index column_chunk = 256;
/// A column sum's row blocks: at most this many (each leaves a partial row of sums in a scratch buffer) ...
inline constexpr Index max_column_sum_blocks = 16;
/// ... and at least this many rows each.
inline constexpr Index min_column_sum_rows = 16;
/// At most this many blocks in a reduction to one value (its partial results live on the stack).
inline constexpr Index max_partial_blocks = 256;

/// Parallel regions entered so far (tests check that tiny kernels enter none).
inline std::atomic<long> parallel_regions_entered{0};

/// A partition of [0, total) into `count` blocks of `size` (the last one shorter when it does not divide).
struct Blocks {
  Index total = 0, size = 0, count = 0;
  Index begin(Index b) const { return b * size; }
  Index length(Index b) const { return std::min(size, total - b * size); }
};

/// One block of everything (below the grain) or blocks of `size`.
inline Blocks make_blocks(Index total, Index size, bool split) {
  if (!split || total <= size) return Blocks{total, std::max<Index>(total, 1), 1};
  return Blocks{total, size, (total + size - 1) / size};
}

/// Whether work of `elements` elements at `cost` each is split into blocks.
inline bool above_grain(Index elements, double cost) {
  return static_cast<double>(elements) * std::max(cost, 1.0) >= parallel_grain;
}

/// The row blocks of a [rows, cols] tensor: about block_elements elements each, and a multiple of the rows
/// that make a block start on a 16-element boundary (so every block's vector loads are aligned).
inline Blocks row_blocks(Index rows, Index cols, double cost) {
  const Index unit = 16 / std::gcd<Index>(cols, 16);
  const Index size = std::max<Index>(unit, block_elements / std::max<Index>(cols, 1) / unit * unit);
  return make_blocks(rows, size, above_grain(rows * cols, cost));
}

/// Row blocks for a reduction to one value: at most max_partial_blocks of them.
inline Blocks reduction_blocks(Index rows, Index cols, double cost) {
  Blocks b = row_blocks(rows, cols, cost);
  if (b.count <= max_partial_blocks) return b;
  return make_blocks(rows, (rows + max_partial_blocks - 1) / max_partial_blocks, true);
}

/// The partition of a column sum over a [rows, cols] tensor (column_sums): column chunks of column_chunk
/// columns and, above the grain, row blocks (one block below it, whose chunks run on the calling thread).
struct ColumnSumPartition {
  Blocks rows, columns;
  bool team;  ///< above the grain: the items go to remat's team
};

inline ColumnSumPartition column_sum_partition(Index rows, Index cols, double cost) {
  const bool split = above_grain(rows * cols, cost);
  const Index size = std::max(min_column_sum_rows, (rows + max_column_sum_blocks - 1) / max_column_sum_blocks);
  return {make_blocks(rows, size, split), make_blocks(cols, column_chunk, true), split};
}

/// Runs f(i) for every item i in [0, count), on remat's team when count > 1 and num_threads() > 1 (each
/// thread takes the next unclaimed item), else in order on the calling thread. Items must be independent
/// (no item reads what another writes) and f must not throw. Which thread runs an item never changes what
/// it computes.
template <class F>
void parallel_for(Index count, F&& f) {
#ifdef _OPENMP
  const int threads = count > 1 ? num_threads() : 1;
  if (threads > 1 && !omp_in_parallel()) {
    parallel_regions_entered.fetch_add(1, std::memory_order_relaxed);
    std::atomic<Index> next{0};
    // Always the same team size (never min(threads, count)): libgomp then reuses its team, which makes a
    // steady training step allocate nothing (docs/design.md §2.5).
#pragma omp parallel num_threads(threads)
    for (Index i = next.fetch_add(1, std::memory_order_relaxed); i < count;
         i = next.fetch_add(1, std::memory_order_relaxed))
      f(i);
    return;
  }
#endif
  for (Index i = 0; i < count; ++i) f(i);
}

/// f(begin, length) for every block of `blocks` (see parallel_for).
template <class F>
void for_blocks(const Blocks& blocks, F&& f) {
  if (blocks.count == 1) {
    f(Index(0), blocks.total);
    return;
  }
  parallel_for(blocks.count, [&](Index b) { f(blocks.begin(b), blocks.length(b)); });
}

/// f(begin, count) over the row blocks of a [rows, cols] tensor, `cost` per element.
template <class F>
void for_row_blocks(Index rows, Index cols, double cost, F&& f) {
  for_blocks(row_blocks(rows, cols, cost), f);
}

/// Σ over the reduction row blocks of partial(begin, count) → T, added in block order.
template <class T, class F>
T sum_row_blocks(Index rows, Index cols, double cost, F&& partial) {
  const Blocks blocks = reduction_blocks(rows, cols, cost);
  if (blocks.count == 1) return partial(Index(0), rows);
  T partials[max_partial_blocks]{};  // zeroed: GCC cannot see that parallel_for writes each one (-Wmaybe-uninitialized)
  parallel_for(blocks.count, [&](Index b) { partials[b] = partial(blocks.begin(b), blocks.length(b)); });
  T total = partials[0];
  for (Index b = 1; b < blocks.count; ++b) total += partials[b];
  return total;
}

/// Eigen's dst = a·b through a BLAS GEMM zeroes dst on the calling thread, then lets the GEMM add the product
/// (beta = 1): a serial pass over every product's output (W2: 0.9 % of the samples, all on the calling
/// thread at 2 threads, bench/probes/README.md). Above the grain this zeroes dst by row blocks on remat's team
/// and returns true, and the caller adds the product: the GEMM adds into the same exact zeros, so the
/// result is bitwise Eigen's. Below it (W0), returns false and the caller assigns through Eigen.
template <class T>
bool zero_for_product(AlignedMap<T> dst) {
  if (!above_grain(dst.size(), 1)) return false;  // before row_blocks' divisions: W0 makes 130 products a step
  const Blocks blocks = row_blocks(dst.rows(), dst.cols(), 1);
  if (blocks.count == 1) return false;
  for_blocks(blocks, [&](Index r0, Index n) { dst.middleRows(r0, n).setZero(); });
  return true;
}

/// dst = product (an Eigen matrix product, which goes to the GEMM), the zero fill on remat's team
/// (zero_for_product).
template <class T, class P>
void assign_product(AlignedMap<T> dst, const P& product) {
  if (direct_gemm(dst, product, false)) return;
  if (zero_for_product(dst))
    dst.noalias() += product;
  else
    dst.noalias() = product;
}

/// f(i) for every item i in [0, count): on remat's team (parallel_for) if `team`, else in order on the calling
/// thread. For kernels whose items are cut only above the grain (the attention ops).
template <class F>
void for_items(bool team, Index count, F&& f) {
  if (team)
    parallel_for(count, f);
  else
    for (Index i = 0; i < count; ++i) f(i);
}

/// dst = e or dst += e (when `accumulate`), row block by row block: make(begin, count) returns the Eigen matrix
/// or array expression of rows [begin, begin + count) (no matrix product: a block of one would evaluate it
/// whole), `cost` per element.
template <class T, class Make>
void assign_rows(AlignedMap<T> dst, bool accumulate, double cost, Make&& make) {
  for_row_blocks(dst.rows(), dst.cols(), cost, [&](Index r0, Index n) {
    auto d = dst.middleRows(r0, n);
    const auto e = make(r0, n);
    if constexpr (std::is_base_of_v<Eigen::ArrayBase<std::decay_t<decltype(e)>>, std::decay_t<decltype(e)>>)
      assign_or_add(d.array(), e, accumulate);
    else
      assign_or_add(d, e, accumulate);
  });
}

/// BackwardContext::add_grad(k, e) row block by row block (assign_rows): if input k's gradient is wanted, takes
/// its target once and writes make(begin, count), rows [begin, begin + count) of e, into each block.
template <class T, class Make>
void add_grad_rows(const BackwardContext<T>& c, int k, double cost, Make&& make) {
  if (!c.wants_grad(k)) return;
  const GradTarget<T> t = c.grad_target(k);
  assign_rows(t.map, t.accumulate, cost, make);
}

/// A per-thread buffer of at least `count` elements for a column sum's partial rows, grown to the largest
/// request and kept (a steady training loop allocates it once); null if it cannot grow (the caller then sums
/// without it, to the same bits). It is not a tensor: the tape's byte counts do not include it.
template <class T>
T* column_sum_scratch(std::size_t count) noexcept {
  thread_local std::vector<T> scratch;
  if (scratch.size() < count) {
    try {
      scratch.resize(count);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }
  return scratch.data();
}

/// out[0, w) = Σ row(i, c0, w) over the rows [r0, r0 + n), added in row order.
template <class T, class Row>
void sum_tile_rows(Row& row, Index r0, Index n, Index c0, Index w, T* out) {
  Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> o(out, w);
  o = row(r0, c0, w);
  for (Index i = r0 + 1; i < r0 + n; ++i) o += row(i, c0, w);
}

/// dst[c0, c0 + w) = or += (when `accumulate`) the sum of the partial rows part(0) … part(count − 1) (each w
/// elements), added in that order; the sum is formed before it is added to dst.
template <class T, class Part>
void add_partials(T* dst, Index w, Index count, bool accumulate, Part&& part) {
  Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> d(dst, w);
  if (!accumulate) {
    d = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>(part(0), w);
    for (Index b = 1; b < count; ++b) d += Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>(part(b), w);
    return;
  }
  alignas(64) T total_buffer[column_chunk];
  Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>> total(total_buffer, w);
  total = Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>(part(0), w);
  for (Index b = 1; b < count; ++b) total += Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>(part(b), w);
  d += total;
}

/// dst[0, cols) = or += (when `accumulate`) Σ_i row(i, c0, w) over the rows of the partition `p`: each row
/// block's partial sum (its rows added in order), then the partial sums added in block order. row(i, c0, w)
/// returns the Eigen array expression of row i's columns [c0, c0 + w). Each item reads whole rows of a column
/// chunk (1 KiB of a float row): summing a row-major tensor down its columns, as Eigen's colwise() does, reads
/// one cache line per row and page: about 4× slower on [2048,1024] (bench/probes/README.md). The items are (row
/// block, column chunk) pairs whose partial rows go to column_sum_scratch; without it, each chunk's blocks
/// are summed one after another on the stack: the same additions in the same order, so the same bits.
/// `scratch` (at least p.rows.count × cols elements, or null) is column_sum_scratch's or a test's.
template <class T, class Row>
void column_sums(const ColumnSumPartition& p, Row&& row, T* dst, bool accumulate, T* scratch) {
  const Blocks& rows = p.rows;
  const Blocks& chunks = p.columns;
  const Index cols = chunks.total;
  if (scratch && rows.count > 1) {
    for_items(p.team, rows.count * chunks.count, [&](Index item) {
      const Index b = item / chunks.count, j = item % chunks.count, w = chunks.length(j);
      // Summed on this thread's stack, stored once: the neighbouring items, running on other threads, write
      // the scratch next to this one's partial row (in the same cache line at the chunks' edges).
      alignas(64) T partial[column_chunk];
      sum_tile_rows(row, rows.begin(b), rows.length(b), chunks.begin(j), w, partial);
      std::copy(partial, partial + w, scratch + b * cols + chunks.begin(j));
    });
    for_items(p.team, chunks.count, [&](Index j) {
      const Index c0 = chunks.begin(j);
      add_partials(dst + c0, chunks.length(j), rows.count, accumulate,
                   [&](Index b) -> const T* { return scratch + b * cols + c0; });
    });
    return;
  }
  for_items(p.team, chunks.count, [&](Index j) {
    const Index c0 = chunks.begin(j), w = chunks.length(j);
    alignas(64) T partial[column_chunk];
    add_partials(dst + c0, w, rows.count, accumulate, [&](Index b) -> const T* {
      sum_tile_rows(row, rows.begin(b), rows.length(b), c0, w, partial);
      return partial;
    });
  });
}

/// column_sums over column_sum_partition(rows, cols, cost), with column_sum_scratch.
template <class T, class Row>
void column_sums(Index rows, Index cols, double cost, Row&& row, T* dst, bool accumulate) {
  const ColumnSumPartition p = column_sum_partition(rows, cols, cost);
  column_sums(p, row, dst, accumulate,
              p.rows.count > 1 ? column_sum_scratch<T>(static_cast<std::size_t>(p.rows.count * cols)) : nullptr);
}

/// dst (a [1, g.cols()] row) = or += g.colwise().sum() for an Eigen matrix expression g (no matrix product):
/// Eigen's colwise sum below the grain (W0's bias gradients), column_sums above it.
template <class T, class G>
void assign_column_sums(AlignedMap<T> dst, const G& g, bool accumulate, double cost) {
  if (!above_grain(g.rows() * g.cols(), cost)) {  // before the partition's divisions: W0 has 64 bias gradients
    assign_or_add(dst, g.colwise().sum(), accumulate);
    return;
  }
  const auto row = [&](Index i, Index c0, Index w) { return g.row(i).segment(c0, w).array(); };
  column_sums(g.rows(), g.cols(), cost, row, dst.data(), accumulate);
}

/// add_grad(k, g.colwise().sum()) for an Eigen matrix expression g (no matrix product): assign_column_sums
/// into input k's [1, cols] gradient.
template <class T, class G>
void add_grad_column_sums(const BackwardContext<T>& c, int k, const G& g) {
  if (!c.wants_grad(k)) return;
  GradTarget<T> t = c.grad_target(k);
  assign_column_sums<T>(t.map, g, t.accumulate, 1);
}

/// OpenBLAS on one thread while it lives, if `active`, the program has OpenMP and OpenBLAS runs on more: for
/// kernels whose items make matrix products on remat's team. The team's threads and OpenBLAS's then never
/// compete for the cores, and a product rounds the same for every thread setting (OpenBLAS's multi-threaded
/// products may round differently from its one-thread ones). Restores OpenBLAS's setting afterwards. Without
/// OpenMP it does nothing: the items run in order, and OpenBLAS keeps its threads. Nor with OpenBLAS's
/// OpenMP build, which runs a product on the calling thread inside a parallel region by itself (and whose
/// openblas_set_num_threads would also set omp_set_num_threads, which num_threads() may read).
class BlasOnOneThread {
 public:
  explicit BlasOnOneThread(bool active) {
#ifdef _OPENMP
    if (!active || !have_openblas_threads() || openblas_uses_openmp()) return;
    const int n = openblas_get_num_threads();
    if (n <= 1) return;
    saved_ = n;
    openblas_set_num_threads(1);
#else
    static_cast<void>(active);
#endif
  }
  ~BlasOnOneThread() {
    if (saved_ > 1) openblas_set_num_threads(saved_);
  }
  BlasOnOneThread(const BlasOnOneThread&) = delete;
  BlasOnOneThread& operator=(const BlasOnOneThread&) = delete;

 private:
  int saved_ = 0;
};

}  // namespace remat::detail
