// What the N-D data-movement ops share (remat/ops/reshape.hpp, view.hpp, flatten.hpp, squeeze.hpp, unsqueeze.hpp,
// permute.hpp, transpose.hpp, concat.hpp, stack.hpp, slice.hpp, index_select.hpp, gather.hpp) and an op author does
// not need: the kernels of the ops that copy their input unchanged into another shape, a permuting copy that moves
// contiguous runs, copies of blocks, and the checks and messages of PyTorch's rules for these ops. (What they share
// that any N-D op needs is public in remat/shape.hpp: PackedShape, make_shape, insert_dim, Shape::numel(begin, end).)
// Every kernel is sequential and runs in a fixed order: its results are the same bits at every thread count.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/op.hpp"
#include "remat/shape.hpp"

namespace remat::detail {

/// "[2,-1,4]": a list of dimensions as given (any length, -1 kept), for error messages.
inline std::string to_string_dims(ArrayRef<Index> dims) {
  std::string text = "[";
  for (std::size_t d = 0; d < dims.size(); ++d) text += (d ? "," : "") + std::to_string(dims[d]);
  return text + "]";
}

/// `dim` of a rank-`rank` tensor as wrap_dim wraps it, except that a scalar takes dim 0 or -1 as PyTorch's
/// squeeze, flatten and transpose do (its one "dimension"): throws index_error naming `op` otherwise.
inline int wrap_dim_or_scalar(int dim, int rank, const char* op) {
  return wrap_dim(dim, std::max(rank, 1), op);
}

/// Throws shape_error naming `op` for a scalar x: the op takes a dimension of x by its size.
inline void require_not_scalar(const char* op, const Shape& s) {
  if (s.rank() == 0)
    throw shape_error(std::string(op) + ": x is a scalar (rank 0); " + op +
                      " takes a tensor of rank 1 or more (unsqueeze or reshape it first)");
}

/// dst[0 … n) = src[0 … n), or += when `accumulate`.
template <class T>
void copy_or_add(const T* src, T* dst, Index n, bool accumulate) {
  if (accumulate)
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(dst, n) +=
        Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(src, n);
  else
    std::copy_n(src, n, dst);
}

/// Zeroes dst[0 … n).
template <class T>
void zero(T* dst, Index n) {
  std::fill_n(dst, n, T(0));
}

/// The base of the ops whose output is their input's elements in the same order under another shape (reshape,
/// view, flatten, squeeze, unsqueeze): Derived supplies name and output_shape. They are views (OpBase::view): the
/// output is x's buffer, so the forward below runs only for a caller that calls it directly; dx is dy read as x's
/// shape. FLOPs: one per element, as every data-movement op declares (what a copy would move).
struct SameElementsOp : OpBase {
  static constexpr OpKind kind = OpKind::data_movement;
  static constexpr bool view = true;
  static unsigned reads(GradInputs) { return reads_nothing; }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    std::copy_n(c.in(0).data(), c.out_shape().numel(), c.out().data());
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    GradTarget<T> d = c.grad_target(0);
    copy_or_add(c.grad_out().data(), d.map.data(), d.map.size(), d.accumulate);
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

/// Calls f(in_offset, out_offset) for every index of the `n` dimensions `sizes`, the last fastest, with the
/// offsets Σ index·stride.
template <class F>
void for_each_offset(int n, const Index* sizes, const Index* in_strides, const Index* out_strides, F&& f) {
  Index count[Shape::max_rank] = {};
  Index in = 0, out = 0;
  for (;;) {
    f(in, out);
    int d = n - 1;
    for (; d >= 0; --d) {
      in += in_strides[d];
      out += out_strides[d];
      if (++count[d] < sizes[d]) break;
      in -= in_strides[d] * sizes[d];
      out -= out_strides[d] * sizes[d];
      count[d] = 0;
    }
    if (d < 0) return;
  }
}

/// dst = src permuted (or dst += it when `accumulate`): src has shape `in`, dst dimension k is src dimension
/// perm[k] (torch.permute). Size-1 dimensions are dropped and dimensions that stay adjacent are merged first;
/// then dst is written in contiguous runs when the innermost dimension stays innermost, else by 32 × 32 tiles
/// of the two innermost dimensions (a blocked transpose). Sequential, in a fixed order.
template <class T>
void permute_copy(const T* src, const Shape& in, const int* perm, T* dst, bool accumulate) {
  const int rank = in.rank();
  Index in_stride[Shape::max_rank];
  Index s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    in_stride[d] = s;
    s *= in[d];
  }
  // The output's dimensions, outermost first, without size-1 ones, adjacent ones merged.
  Index size[Shape::max_rank], stride[Shape::max_rank];
  int m = 0;
  for (int k = 0; k < rank; ++k) {
    const Index n = in[perm[k]], step = in_stride[perm[k]];
    if (n == 1) continue;
    if (m > 0 && stride[m - 1] == step * n) {
      size[m - 1] *= n;
      stride[m - 1] = step;
    } else {
      size[m] = n;
      stride[m] = step;
      ++m;
    }
  }
  if (m == 0) {  // one element
    copy_or_add(src, dst, 1, accumulate);
    return;
  }
  Index out_stride[Shape::max_rank];
  s = 1;
  for (int d = m - 1; d >= 0; --d) {
    out_stride[d] = s;
    s *= size[d];
  }
  if (stride[m - 1] == 1) {  // runs of size[m-1] contiguous in both
    const Index run = size[m - 1];
    for_each_offset(m - 1, size, stride, out_stride,
                    [&](Index i, Index o) { copy_or_add(src + i, dst + o, run, accumulate); });
    return;
  }
  // The output's innermost dimension a (src stride stride[a], dst stride 1) and the dimension q that is innermost
  // in src (stride 1; one exists, the last of src's dimensions above size 1): tiles of q × a.
  const int a = m - 1;
  int q = 0;
  while (stride[q] != 1) ++q;
  Index other_size[Shape::max_rank], other_in[Shape::max_rank], other_out[Shape::max_rank];
  int others = 0;
  for (int d = 0; d < m; ++d)
    if (d != a && d != q) {
      other_size[others] = size[d];
      other_in[others] = stride[d];
      other_out[others] = out_stride[d];
      ++others;
    }
  const Index nq = size[q], na = size[a], sa = stride[a], tq = out_stride[q];
  constexpr Index tile = 32;
  for_each_offset(others, other_size, other_in, other_out, [&](Index i0, Index o0) {
    for (Index qb = 0; qb < nq; qb += tile)
      for (Index ab = 0; ab < na; ab += tile) {
        const Index qe = std::min(nq, qb + tile), ae = std::min(na, ab + tile);
        for (Index i = qb; i < qe; ++i) {
          const T* from = src + i0 + i;
          T* to = dst + o0 + i * tq;
          if (accumulate)
            for (Index j = ab; j < ae; ++j) to[j] += from[j * sa];
          else
            for (Index j = ab; j < ae; ++j) to[j] = from[j * sa];
        }
      }
  });
}

/// A permutation of a shape's dimensions, by value (kernels must not allocate).
struct Permutation {
  int dims[Shape::max_rank] = {};
  const int* data() const { return dims; }
};

/// The permutation `perm` of `count` dimensions (negative ones counted from the end) of `in` as dimensions in
/// [0, rank): throws shape_error naming `op` for another count than in's rank, index_error for a dimension out of
/// range or repeated.
inline Permutation checked_permutation(const char* op, const Shape& in, const int* perm, int count) {
  const int rank = in.rank();
  if (count != rank)
    throw shape_error(std::string(op) + ": " + std::to_string(count) + " dims for x " + to_string(in) + " of rank " +
                      std::to_string(rank) + "; list each of its " + std::to_string(rank) +
                      " dimensions once, in their new order");
  Permutation p;
  bool seen[Shape::max_rank] = {};
  for (int k = 0; k < rank; ++k) {
    const int d = wrap_dim(perm[k], rank, op);
    if (seen[d])
      throw index_error(std::string(op) + ": dim " + std::to_string(perm[k]) + " (dimension " + std::to_string(d) +
                        " of x " + to_string(in) + ") appears twice in dims; list each dimension once");
    seen[d] = true;
    p.dims[k] = d;
  }
  return p;
}

/// The shape `in` permuted: dimension k is in's dimension perm[k].
inline Shape permuted(const Shape& in, const Permutation& perm) {
  Shape out = in;
  for (int k = 0; k < in.rank(); ++k) out[k] = in[perm.dims[k]];
  return out;
}

/// The inverse of `perm` (of `rank` dimensions).
inline Permutation inverse(const Permutation& perm, int rank) {
  Permutation inv;
  for (int k = 0; k < rank; ++k) inv.dims[perm.dims[k]] = k;
  return inv;
}

}  // namespace remat::detail
