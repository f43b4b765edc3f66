// Reductions over a set of dimensions (sum, mean and max with dims and keepdim, as torch.sum/mean/amax) and the
// walk along one dimension that softmax and log_softmax over any dim use. Fixed orders only: an output element's
// terms are added in an order fixed by the shapes (ReduceGeometry::sum), and the work is split over output
// elements, never within one, so the results are bitwise the same at every thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/detail/parallel.hpp"
#include "remat/errors.hpp"
#include "remat/shape.hpp"

namespace remat::detail {

/// The attributes of a reduction over dims: bit d of `mask` set when dimension d is reduced.
struct ReduceDimsParams {
  std::uint8_t mask = 0;
  bool keepdim = false;
};

/// The mask of `dims` for a rank-`rank` input (an empty list: every dim). Negative dims count from the end;
/// throws index_error naming `op` for a dim out of range or repeated. A rank-0 input takes dim 0 or -1, as
/// PyTorch (and reduces nothing).
inline ReduceDimsParams reduce_dims_params(const char* op, ArrayRef<int> dims, int rank, bool keepdim) {
  ReduceDimsParams p;
  p.keepdim = keepdim;
  if (dims.empty()) {
    p.mask = static_cast<std::uint8_t>((1u << rank) - 1u);
    return p;
  }
  unsigned seen = 0;
  for (int dim : dims) {
    const int d = wrap_dim(dim, rank == 0 ? 1 : rank, op);
    if (seen & (1u << d))
      throw index_error(std::string(op) + ": dim " + std::to_string(dim) +
                        " appears more than once in dims of a rank-" + std::to_string(rank) + " tensor");
    seen |= 1u << d;
  }
  p.mask = rank == 0 ? std::uint8_t(0) : static_cast<std::uint8_t>(seen);
  return p;
}

/// The output shape of reducing `in` over p's dims: the reduced dims removed, or kept as 1 with keepdim.
inline Shape reduce_dims_shape(const Shape& in, const ReduceDimsParams& p) {
  Index dims[Shape::max_rank];
  int rank = 0;
  for (int d = 0; d < in.rank(); ++d) {
    if (!(p.mask & (1u << d)))
      dims[rank++] = in[d];
    else if (p.keepdim)
      dims[rank++] = 1;
  }
  return make_shape(dims, rank);
}

/// An input seen as kept and reduced dimensions (adjacent dims of one kind merged, dims of 1 dropped): output
/// element j (row-major over the kept dims, the order of the output) reads the elements at base(j) + the offsets
/// of the reduced multi-indices, walked in row-major order.
class ReduceGeometry {
 public:
  ReduceGeometry(const Shape& in, std::uint8_t mask) {
    Index stride = 1;
    int last_kind = -1;  // of the group just added (walking from the last dim)
    int nk = 0, nr = 0;
    Index kd[Shape::max_rank], ks[Shape::max_rank], rd[Shape::max_rank], rs[Shape::max_rank];
    for (int d = in.rank() - 1; d >= 0; --d) {
      const Index n = in[d];
      if (n == 1) continue;
      const int kind = (mask & (1u << d)) ? 1 : 0;
      Index* dims = kind ? rd : kd;
      Index* strides = kind ? rs : ks;
      int& count = kind ? nr : nk;
      if (kind == last_kind) {
        dims[count - 1] *= n;  // contiguous with the group after it: one dimension
      } else {
        dims[count] = n;
        strides[count] = stride;
        ++count;
      }
      last_kind = kind;
      stride *= n;
    }
    // Collected from the last dim: reverse into outermost-first order.
    for (int i = 0; i < nk; ++i) {
      kept_dims_[i] = kd[nk - 1 - i];
      kept_strides_[i] = ks[nk - 1 - i];
    }
    for (int i = 0; i < nr; ++i) {
      red_dims_[i] = rd[nr - 1 - i];
      red_strides_[i] = rs[nr - 1 - i];
    }
    nk_ = nk;
    nr_ = nr;
    for (int i = 0; i < nk; ++i) outer_ *= kept_dims_[i];
    for (int i = 0; i < nr; ++i) inner_ *= red_dims_[i];
  }
  Index outer() const { return outer_; }  ///< output elements
  Index inner() const { return inner_; }  ///< reduced elements of each
  /// The offset of output element j's first reduced element.
  Index base(Index j) const {
    Index off = 0;
    for (int d = nk_ - 1; d >= 0 && j > 0; --d) {
      off += (j % kept_dims_[d]) * kept_strides_[d];
      j /= kept_dims_[d];
    }
    return off;
  }
  /// The sum of the elements output element j reads (from base): each contiguous run along the last reduced dim
  /// (when its stride is 1) summed by Eigen's vectorised sum, the runs added in row-major order; elementwise in
  /// row-major order otherwise. It depends on the shapes and offsets only: the same bits at every thread count.
  template <class T>
  T sum(const T* x, Index base) const {
    if (nr_ == 0 || red_strides_[nr_ - 1] != 1) {
      T total(0);
      for_each(base, [&](Index i) { total += x[i]; });
      return total;
    }
    const Index n = red_dims_[nr_ - 1];
    T total(0);
    for_each_run(base,
                 [&](Index off) { total += Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(x + off, n).sum(); });
    return total;
  }
  /// f(offset) for the start of each run along the last reduced dim, in row-major order of the other reduced dims.
  template <class F>
  void for_each_run(Index base, F&& f) const {
    const int last = nr_ - 1;
    Index idx[Shape::max_rank] = {};
    Index off = base;
    for (;;) {
      f(off);
      int d = last - 1;
      for (; d >= 0; --d) {
        off += red_strides_[d];
        if (++idx[d] < red_dims_[d]) break;
        off -= red_dims_[d] * red_strides_[d];
        idx[d] = 0;
      }
      if (d < 0) return;
    }
  }
  /// f(offset) for each element output element j reads (from base), in row-major order of the reduced dims.
  template <class F>
  void for_each(Index base, F&& f) const {
    if (nr_ == 0) {
      f(base);
      return;
    }
    const int last = nr_ - 1;
    const Index n = red_dims_[last], s = red_strides_[last];
    Index idx[Shape::max_rank] = {};
    Index off = base;
    for (;;) {
      for (Index t = 0; t < n; ++t) f(off + t * s);
      int d = last - 1;
      for (; d >= 0; --d) {
        off += red_strides_[d];
        if (++idx[d] < red_dims_[d]) break;
        off -= red_dims_[d] * red_strides_[d];
        idx[d] = 0;
      }
      if (d < 0) return;
    }
  }

 private:
  int nk_ = 0, nr_ = 0;
  Index outer_ = 1, inner_ = 1;
  Index kept_dims_[Shape::max_rank] = {}, kept_strides_[Shape::max_rank] = {};
  Index red_dims_[Shape::max_rank] = {}, red_strides_[Shape::max_rank] = {};
};

/// f(j, base(j)) for every output element j of `geo`, in blocks of output elements (parallel_for above the
/// grain): each output element is computed whole by one thread.
template <class F>
void for_each_output(const ReduceGeometry& geo, double cost, F&& f) {
  for_row_blocks(geo.outer(), geo.inner(), cost, [&](Index j0, Index n) {
    for (Index j = j0; j < j0 + n; ++j) f(j, geo.base(j));
  });
}

/// A tensor of `shape` seen along dimension `dim`: [outer, n, inner] with n = shape[dim].
struct AlongDim {
  Index outer = 1, n = 1, inner = 1;
  AlongDim(const Shape& shape, int dim) {
    for (int d = 0; d < shape.rank(); ++d) {
      if (d < dim)
        outer *= shape[d];
      else if (d > dim)
        inner *= shape[d];
    }
    n = shape.rank() == 0 ? 1 : shape[dim];
  }
};

/// f(offset, width) for every (outer index, chunk of at most column_chunk inner columns): the elements at
/// offset + k·inner + [0, width) for k in [0, n) are the chunk's lines along the dim. Items run on remat's team
/// above the grain; each line is computed whole by one thread.
template <class F>
void for_dim_chunks(const AlongDim& a, double cost, F&& f) {
  const Index chunks = (a.inner + column_chunk - 1) / column_chunk;
  for_items(above_grain(a.outer * a.n * a.inner, cost), a.outer * chunks, [&](Index item) {
    const Index o = item / chunks, c0 = (item % chunks) * column_chunk;
    f(o * a.n * a.inner + c0, std::min(column_chunk, a.inner - c0));
  });
}

}  // namespace remat::detail
