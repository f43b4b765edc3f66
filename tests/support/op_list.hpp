// THE op list (docs/design.md §5, "Adding an op"): one entry per public op and per operator or scalar-constant form,
// with the input shapes to test (broadcasting forms are shape sets of the entry), the input domains, and an independent
// reference forward in double. Gradchecks, value checks, checkpoint-equality tests and benchmarks iterate over it; a
// new op needs one entry here.
//
//   for (const remat_test::OpCase& op : remat_test::op_list())
//     for (const remat_test::ShapeSet& shapes : op.shape_sets) {
//       remat::Tape<float> tape;
//       std::vector<remat::Var<float>> in;
//       for (auto& m : remat_test::make_inputs<float>(op, shapes, seed)) in.push_back(tape.variable(m));
//       remat::Var<float> loss = remat_test::scalar_loss(tape, op.build(in), seed);
//       ...
//     }
//
// or, for a parameterized gtest, INSTANTIATE_TEST_SUITE_P(..., ::testing::ValuesIn(op_instances()),
// op_instance_name).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "random.hpp"
#include "remat/remat.hpp"

namespace remat_test {

using remat::Index;
using remat::Matrix;
using remat::Shape;

/// The shapes of an op's inputs, one per input.
using ShapeSet = std::vector<Shape>;

template <class T>
using Inputs = std::vector<remat::Var<T>>;

/// Builds the op from its input Vars (all on one tape).
template <class T>
using BuildFunction = std::function<remat::Var<T>(const Inputs<T>&)>;

/// Independent forward computation in double (plain loops and std:: functions), from the input values.
using ReferenceFunction = std::function<Matrix<double>(const std::vector<Matrix<double>>&)>;

/// An N-D value for the N-D entries' references: its shape and its elements, row-major (flat data).
struct NdArray {
  Shape shape;
  std::vector<double> data;
};

/// Independent forward computation in double of an N-D entry, from its inputs' shapes and flat values.
using NdReferenceFunction = std::function<NdArray(const std::vector<NdArray>&)>;

/// One op (or one public form of an op) under test.
struct OpCase {
  std::string name;  ///< unique, letters, digits and '_' only (used in gtest names)
  int arity = 1;     ///< number of Var inputs
  BuildFunction<float> build_float;
  BuildFunction<double> build_double;
  std::vector<ShapeSet> shape_sets;  ///< input shapes to test, including 1×1 and non-square
  std::vector<Domain> domains;       ///< input value domains, one per input
  ReferenceFunction reference;       ///< empty only where a dedicated test checks the value (dropout)
  int recorded_ops = 1;              ///< ops the build records (an entry may wrap the op under test, first)
  /// The N-D entries' reference (then `reference` is empty): their shape sets hold shapes of rank 1 to 4, which
  /// the tests make leaves of with remat_test::leaf (a matrix of rows() × cols() holds their values row-major).
  NdReferenceFunction nd_reference;

  bool has_reference() const { return static_cast<bool>(reference) || static_cast<bool>(nd_reference); }

  template <class T>
  remat::Var<T> build(const Inputs<T>& in) const {
    if constexpr (std::is_same_v<T, float>)
      return build_float(in);
    else
      return build_double(in);  // std::bad_function_call under REMAT_OP_KERNELS_FLOAT_ONLY (make_op)
  }
};

/// Class labels for cross_entropy, a fixed function of the logits' shape: label i = (3i + 1) mod cols.
inline std::vector<int> test_labels(Index rows, Index cols) {
  std::vector<int> labels(static_cast<std::size_t>(rows));
  for (Index i = 0; i < rows; ++i) labels[static_cast<std::size_t>(i)] = static_cast<int>((3 * i + 1) % cols);
  return labels;
}

/// Token ids for embedding, a fixed function of the table's rows V: 5 ids, (3i + 1) mod V, then id 1 mod V
/// again (a repeated id, whose gradient rows must accumulate).
inline std::vector<int> test_ids(Index vocabulary) {
  std::vector<int> ids;
  for (Index i = 0; i < 5; ++i) ids.push_back(static_cast<int>((3 * i + 1) % vocabulary));
  ids.push_back(static_cast<int>(1 % vocabulary));
  return ids;
}

/// Attention layouts of the list, by the shape of q ([B·S, H]): heads and seq_len.
struct AttentionConfig {
  Index heads, seq_len;
};
inline AttentionConfig attention_config(const Shape& q) {
  if (q == Shape{1, 1}) return {1, 1};  // one token, one head of width 1
  if (q == Shape{6, 4}) return {2, 3};  // B = 2, S = 3, two heads of width 2
  if (q == Shape{4, 3}) return {1, 4};  // B = 1, S = 4, one head of width 3
  if (q == Shape{3, 2}) return {2, 1};  // B = 3, S = 1, two heads of width 1
  // Large enough for the attention kernels' row tiles (tests/ops/threads_test.cpp): B = 2, S = 150 (tiles
  // of 64, 64 and 22 rows), three heads of width 16.
  if (q == Shape{300, 48}) return {3, 150};
  throw std::invalid_argument("attention_config: no layout for q " + remat::to_string(q));
}
/// [B·heads·S, S] for token rows of shape q.
inline Shape attention_matrix_shape(const Shape& q) {
  const AttentionConfig c = attention_config(q);
  return {q.rows() * c.heads, c.seq_len};
}

/// The layer_norm eps the list uses.
inline constexpr double test_layer_norm_eps = 1e-5;

namespace reference {

template <class F>
Matrix<double> map(const Matrix<double>& x, F f) {
  Matrix<double> y(x.rows(), x.cols());
  for (Index i = 0; i < x.rows(); ++i)
    for (Index j = 0; j < x.cols(); ++j) y(i, j) = f(x(i, j));
  return y;
}

/// Element (i, j) of `a` broadcast: a dimension of 1 repeats.
inline double at(const Matrix<double>& a, Index i, Index j) {
  return a(a.rows() == 1 ? 0 : i, a.cols() == 1 ? 0 : j);
}

template <class F>
Matrix<double> zip(const Matrix<double>& a, const Matrix<double>& b, F f) {
  Matrix<double> y(std::max(a.rows(), b.rows()), std::max(a.cols(), b.cols()));
  for (Index i = 0; i < y.rows(); ++i)
    for (Index j = 0; j < y.cols(); ++j) y(i, j) = f(at(a, i, j), at(b, i, j));
  return y;
}

inline Matrix<double> scalar(double v) {
  return Matrix<double>::Constant(1, 1, v);
}

inline Matrix<double> matmul(const Matrix<double>& a, const Matrix<double>& b) {
  Matrix<double> c(a.rows(), b.cols());
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < b.cols(); ++j) {
      double s = 0;
      for (Index k = 0; k < a.cols(); ++k) s += a(i, k) * b(k, j);
      c(i, j) = s;
    }
  return c;
}

inline double log_sum_exp_row(const Matrix<double>& x, Index i) {
  double s = 0;
  for (Index j = 0; j < x.cols(); ++j) s += std::exp(x(i, j));
  return std::log(s);
}

inline Matrix<double> log_softmax(const Matrix<double>& x) {
  Matrix<double> y(x.rows(), x.cols());
  for (Index i = 0; i < x.rows(); ++i) {
    const double lse = log_sum_exp_row(x, i);
    for (Index j = 0; j < x.cols(); ++j) y(i, j) = x(i, j) - lse;
  }
  return y;
}

inline Matrix<double> softmax(const Matrix<double>& x) {
  Matrix<double> y(x.rows(), x.cols());
  for (Index i = 0; i < x.rows(); ++i) {
    double s = 0;
    for (Index j = 0; j < x.cols(); ++j) s += std::exp(x(i, j));
    for (Index j = 0; j < x.cols(); ++j) y(i, j) = std::exp(x(i, j)) / s;
  }
  return y;
}

inline Matrix<double> cross_entropy(const Matrix<double>& x, const std::vector<int>& labels) {
  double total = 0;
  for (Index i = 0; i < x.rows(); ++i) total += log_sum_exp_row(x, i) - x(i, labels[static_cast<std::size_t>(i)]);
  return scalar(total / static_cast<double>(x.rows()));
}

inline Matrix<double> layer_norm(const Matrix<double>& x, const Matrix<double>& gain, const Matrix<double>& bias,
                                 double eps) {
  Matrix<double> y(x.rows(), x.cols());
  const auto n = static_cast<double>(x.cols());
  for (Index i = 0; i < x.rows(); ++i) {
    double mu = 0, var = 0;
    for (Index j = 0; j < x.cols(); ++j) mu += x(i, j);
    mu /= n;
    for (Index j = 0; j < x.cols(); ++j) var += (x(i, j) - mu) * (x(i, j) - mu);
    var /= n;
    for (Index j = 0; j < x.cols(); ++j) y(i, j) = (x(i, j) - mu) / std::sqrt(var + eps) * gain(0, j) + bias(0, j);
  }
  return y;
}

/// Scores per (sequence, head), [B·heads·S, S], by the layout's definition (docs/design.md §1.1).
inline Matrix<double> attention_scores(const Matrix<double>& q, const Matrix<double>& k, Index heads, Index S,
                                       bool causal) {
  const Index B = q.rows() / S, d = q.cols() / heads;
  Matrix<double> s(B * heads * S, S);
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < S; ++i)
        for (Index j = 0; j < S; ++j) {
          double dot = 0;
          for (Index c = 0; c < d; ++c) dot += q(b * S + i, h * d + c) * k(b * S + j, h * d + c);
          s((b * heads + h) * S + i, j) =
              causal && j > i ? -std::numeric_limits<double>::infinity() : dot / std::sqrt(static_cast<double>(d));
        }
  return s;
}

inline Matrix<double> attention_values(const Matrix<double>& p, const Matrix<double>& v, Index heads, Index S) {
  const Index B = v.rows() / S, d = v.cols() / heads;
  Matrix<double> y = Matrix<double>::Zero(v.rows(), v.cols());
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < S; ++i)
        for (Index c = 0; c < d; ++c) {
          double sum = 0;
          for (Index j = 0; j < S; ++j) sum += p((b * heads + h) * S + i, j) * v(b * S + j, h * d + c);
          y(b * S + i, h * d + c) = sum;
        }
  return y;
}

inline double gelu(double x) {
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
}

}  // namespace reference

/// References of the N-D entries, on flat row-major data and shapes (NumPy's and PyTorch's definitions).
namespace nd_reference {

inline Index count(const Shape& s) {
  Index n = 1;
  for (Index d : s) n *= d;
  return n;
}
/// The multi-index of flat position `flat` in `s`, and back.
inline std::vector<Index> unravel(Index flat, const Shape& s) {
  std::vector<Index> i(static_cast<std::size_t>(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    i[static_cast<std::size_t>(d)] = flat % s[d];
    flat /= s[d];
  }
  return i;
}
inline Index ravel(const std::vector<Index>& i, const Shape& s) {
  Index flat = 0;
  for (int d = 0; d < s.rank(); ++d) flat = flat * s[d] + i[static_cast<std::size_t>(d)];
  return flat;
}
inline NdArray zeros(const Shape& s) {
  return {s, std::vector<double>(static_cast<std::size_t>(count(s)), 0.0)};
}
inline double& at(NdArray& a, const std::vector<Index>& i) {
  return a.data[static_cast<std::size_t>(ravel(i, a.shape))];
}
inline double at(const NdArray& a, const std::vector<Index>& i) {
  return a.data[static_cast<std::size_t>(ravel(i, a.shape))];
}
/// NumPy broadcasting of two shapes (they must broadcast).
inline Shape broadcast(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  std::vector<Index> out(static_cast<std::size_t>(rank));
  for (int k = 1; k <= rank; ++k) {
    const Index x = k <= a.rank() ? a[a.rank() - k] : 1, y = k <= b.rank() ? b[b.rank() - k] : 1;
    if (x != y && x != 1 && y != 1) throw std::invalid_argument("nd_reference: shapes do not broadcast");
    out[static_cast<std::size_t>(rank - k)] = std::max(x, y);
  }
  return Shape(out);
}
/// a's element at the index `i` of a broadcast result: aligned at the end, a size-1 dim read at 0.
inline double broadcast_at(const NdArray& a, const std::vector<Index>& i) {
  std::vector<Index> j(static_cast<std::size_t>(a.shape.rank()));
  const std::size_t offset = i.size() - j.size();
  for (std::size_t d = 0; d < j.size(); ++d) j[d] = a.shape[static_cast<int>(d)] == 1 ? 0 : i[d + offset];
  return at(a, j);
}
template <class F>
NdArray map(const NdArray& a, F f) {
  NdArray y = a;
  for (double& v : y.data) v = f(v);
  return y;
}
template <class F>
NdArray zip(const NdArray& a, const NdArray& b, F f) {
  NdArray y = zeros(broadcast(a.shape, b.shape));
  for (Index k = 0; k < count(y.shape); ++k) {
    const auto i = unravel(k, y.shape);
    y.data[static_cast<std::size_t>(k)] = f(broadcast_at(a, i), broadcast_at(b, i));
  }
  return y;
}
/// torch.where: a where c is nonzero, else b, all three broadcast.
inline NdArray where(const NdArray& c, const NdArray& a, const NdArray& b) {
  NdArray y = zeros(broadcast(broadcast(c.shape, a.shape), b.shape));
  for (Index k = 0; k < count(y.shape); ++k) {
    const auto i = unravel(k, y.shape);
    y.data[static_cast<std::size_t>(k)] = broadcast_at(c, i) != 0 ? broadcast_at(a, i) : broadcast_at(b, i);
  }
  return y;
}
/// torch.matmul: a [k] vector is [1,k] on the left and [k,1] on the right (the added dim removed from the result),
/// dims before the last two broadcast.
inline NdArray matmul(const NdArray& a, const NdArray& b) {
  const bool av = a.shape.rank() == 1, bv = b.shape.rank() == 1;
  std::vector<Index> ad = a.shape.dims(), bd = b.shape.dims();
  if (av) ad.insert(ad.begin(), 1);
  if (bv) bd.push_back(1);
  const Index m = ad[ad.size() - 2], k = ad.back(), n = bd.back();
  if (bd[bd.size() - 2] != k) throw std::invalid_argument("nd_reference::matmul: inner dims differ");
  const NdArray A{Shape(ad), a.data}, B{Shape(bd), b.data};
  const Shape batch = broadcast(Shape(std::vector<Index>(ad.begin(), ad.end() - 2)),
                                Shape(std::vector<Index>(bd.begin(), bd.end() - 2)));
  std::vector<Index> full = batch.dims();
  full.push_back(m);
  full.push_back(n);
  NdArray y = zeros(Shape(full));
  for (Index f = 0; f < count(y.shape); ++f) {
    const auto i = unravel(f, y.shape);
    double sum = 0;
    for (Index c = 0; c < k; ++c) {
      std::vector<Index> ia = i, ib = i;
      ia[ia.size() - 1] = c;
      ib[ib.size() - 2] = c;
      sum += broadcast_at(A, ia) * broadcast_at(B, ib);
    }
    y.data[static_cast<std::size_t>(f)] = sum;
  }
  std::vector<Index> out = batch.dims();
  if (!av) out.push_back(m);
  if (!bv) out.push_back(n);
  y.shape = Shape(out);
  return y;
}
/// Sum (0), mean (1) or max (2) over `dims` (negative from the end; none: every dim), keepdim or not.
inline NdArray reduce(const NdArray& a, int which, std::vector<int> dims, bool keepdim) {
  const int rank = a.shape.rank();
  std::vector<bool> reduced(static_cast<std::size_t>(rank), dims.empty());
  for (int d : dims) reduced[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  std::vector<Index> kept;  // the keepdim shape
  for (int d = 0; d < rank; ++d) kept.push_back(reduced[static_cast<std::size_t>(d)] ? 1 : a.shape[d]);
  NdArray y = zeros(Shape(kept));
  std::vector<Index> n(y.data.size(), 0);
  for (Index f = 0; f < count(a.shape); ++f) {
    auto i = unravel(f, a.shape);
    for (int d = 0; d < rank; ++d)
      if (reduced[static_cast<std::size_t>(d)]) i[static_cast<std::size_t>(d)] = 0;
    const auto o = static_cast<std::size_t>(ravel(i, y.shape));
    const double v = a.data[static_cast<std::size_t>(f)];
    y.data[o] = which == 2 ? (n[o] == 0 ? v : std::max(y.data[o], v)) : y.data[o] + v;
    ++n[o];
  }
  if (which == 1)
    for (std::size_t o = 0; o < y.data.size(); ++o) y.data[o] /= static_cast<double>(n[o]);
  if (!keepdim) {
    std::vector<Index> out;
    for (int d = 0; d < rank; ++d)
      if (!reduced[static_cast<std::size_t>(d)]) out.push_back(a.shape[d]);
    y.shape = Shape(out);
  }
  return y;
}
/// softmax (or log_softmax) over dim `dim` (negative from the end).
inline NdArray softmax(const NdArray& a, int dim, bool log) {
  const int d = dim < 0 ? dim + a.shape.rank() : dim;
  NdArray y = a;
  for (Index f = 0; f < count(a.shape); ++f) {
    auto i = unravel(f, a.shape);
    double s = 0;
    for (Index j = 0; j < a.shape[d]; ++j) {
      i[static_cast<std::size_t>(d)] = j;
      s += std::exp(at(a, i));
    }
    const double x = a.data[static_cast<std::size_t>(f)];
    y.data[static_cast<std::size_t>(f)] = log ? x - std::log(s) : std::exp(x) / s;
  }
  return y;
}
/// layer_norm over x's trailing dims of w's shape: each group of count(w.shape) consecutive elements.
inline NdArray layer_norm(const NdArray& x, const NdArray& w, const NdArray& b, double eps) {
  const Index g = count(w.shape);
  NdArray y = x;
  for (Index start = 0; start < count(x.shape); start += g) {
    double mu = 0, var = 0;
    for (Index j = 0; j < g; ++j) mu += x.data[static_cast<std::size_t>(start + j)];
    mu /= static_cast<double>(g);
    for (Index j = 0; j < g; ++j) {
      const double c = x.data[static_cast<std::size_t>(start + j)] - mu;
      var += c * c;
    }
    var /= static_cast<double>(g);
    for (Index j = 0; j < g; ++j) {
      const auto k = static_cast<std::size_t>(start + j), jj = static_cast<std::size_t>(j);
      y.data[k] = (x.data[k] - mu) / std::sqrt(var + eps) * w.data[jj] + b.data[jj];
    }
  }
  return y;
}
/// y[i] = x[i permuted back]: y's dim k is x's dim perm[k].
inline NdArray permute(const NdArray& x, const std::vector<int>& perm) {
  std::vector<Index> out;
  for (int p : perm) out.push_back(x.shape[p]);
  NdArray y = zeros(Shape(out));
  for (Index f = 0; f < count(y.shape); ++f) {
    const auto i = unravel(f, y.shape);
    std::vector<Index> j(i.size());
    for (std::size_t k = 0; k < perm.size(); ++k) j[static_cast<std::size_t>(perm[k])] = i[k];
    y.data[static_cast<std::size_t>(f)] = at(x, j);
  }
  return y;
}
/// The same elements in the same order under another shape.
inline NdArray reshape(const NdArray& x, const Shape& to) {
  if (count(to) != count(x.shape)) throw std::invalid_argument("nd_reference::reshape: element counts differ");
  return {to, x.data};
}
/// The parts joined along `dim` (their other dims equal).
inline NdArray concat(const std::vector<NdArray>& parts, int dim) {
  std::vector<Index> out = parts[0].shape.dims();
  out[static_cast<std::size_t>(dim)] = 0;
  for (const NdArray& p : parts) out[static_cast<std::size_t>(dim)] += p.shape[dim];
  NdArray y = zeros(Shape(out));
  for (Index f = 0; f < count(y.shape); ++f) {
    auto i = unravel(f, y.shape);
    std::size_t k = 0;
    while (i[static_cast<std::size_t>(dim)] >= parts[k].shape[dim])
      i[static_cast<std::size_t>(dim)] -= parts[k++].shape[dim];
    y.data[static_cast<std::size_t>(f)] = at(parts[k], i);
  }
  return y;
}
/// x with a dim of 1 inserted at `dim`.
inline NdArray unsqueeze(const NdArray& x, int dim) {
  std::vector<Index> d = x.shape.dims();
  d.insert(d.begin() + dim, 1);
  return {Shape(d), x.data};
}
/// Entries [begin, begin + count) of dim `dim`.
inline NdArray slice(const NdArray& x, int dim, Index begin, Index n) {
  std::vector<Index> out = x.shape.dims();
  out[static_cast<std::size_t>(dim)] = n;
  NdArray y = zeros(Shape(out));
  for (Index f = 0; f < count(y.shape); ++f) {
    auto i = unravel(f, y.shape);
    i[static_cast<std::size_t>(dim)] += begin;
    y.data[static_cast<std::size_t>(f)] = at(x, i);
  }
  return y;
}
/// Entries idx[0], idx[1], … of dim `dim`.
inline NdArray index_select(const NdArray& x, int dim, const std::vector<int>& idx) {
  std::vector<Index> out = x.shape.dims();
  out[static_cast<std::size_t>(dim)] = static_cast<Index>(idx.size());
  NdArray y = zeros(Shape(out));
  for (Index f = 0; f < count(y.shape); ++f) {
    auto i = unravel(f, y.shape);
    i[static_cast<std::size_t>(dim)] = idx[static_cast<std::size_t>(i[static_cast<std::size_t>(dim)])];
    y.data[static_cast<std::size_t>(f)] = at(x, i);
  }
  return y;
}
/// torch.gather: y[p] = x[p with dim `dim` replaced by index[p]], y of the index's shape.
inline NdArray gather(const NdArray& x, int dim, const std::vector<int>& index, const Shape& index_shape) {
  NdArray y = zeros(index_shape);
  for (Index f = 0; f < count(y.shape); ++f) {
    auto i = unravel(f, y.shape);
    i[static_cast<std::size_t>(dim)] = index[static_cast<std::size_t>(f)];
    y.data[static_cast<std::size_t>(f)] = at(x, i);
  }
  return y;
}

/// conv2d by its definition: y[n,o,i,j] = b[o] + Σ w[o,c,a,e] · x[n, g·C/G + c, i·s0 − p0 + a, j·s1 − p1 + e].
inline NdArray conv2d(const NdArray& x, const NdArray& w, const NdArray& b, std::array<Index, 2> stride,
                      std::array<Index, 2> padding, Index groups) {
  const Index n = x.shape[0], c = x.shape[1], h = x.shape[2], wd = x.shape[3];
  const Index o = w.shape[0], cg = w.shape[1], kh = w.shape[2], kw = w.shape[3];
  const Index oh = (h + 2 * padding[0] - kh) / stride[0] + 1, ow = (wd + 2 * padding[1] - kw) / stride[1] + 1;
  NdArray y = zeros(Shape{n, o, oh, ow});
  for (Index s = 0; s < n; ++s)
    for (Index oc = 0; oc < o; ++oc)
      for (Index i = 0; i < oh; ++i)
        for (Index j = 0; j < ow; ++j) {
          double acc = b.data[static_cast<std::size_t>(oc)];
          const Index g = oc / (o / groups);
          for (Index ci = 0; ci < cg; ++ci)
            for (Index a = 0; a < kh; ++a)
              for (Index e = 0; e < kw; ++e) {
                const Index yy = i * stride[0] - padding[0] + a, xx = j * stride[1] - padding[1] + e;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                acc += w.data[static_cast<std::size_t>(((oc * cg + ci) * kh + a) * kw + e)] *
                       x.data[static_cast<std::size_t>(((s * c + g * cg + ci) * h + yy) * wd + xx)];
              }
          y.data[static_cast<std::size_t>(((s * o + oc) * oh + i) * ow + j)] = acc;
        }
  return y;
}

/// 2×2 windows, stride 1, padding 1: the maximum, or the mean counting the padding (every window is 2×2 of the
/// padded input).
inline NdArray pool2d(const NdArray& x, bool max) {
  const Index planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3];
  NdArray y = zeros(Shape{x.shape[0], x.shape[1], h + 1, w + 1});
  for (Index p = 0; p < planes; ++p)
    for (Index i = 0; i <= h; ++i)
      for (Index j = 0; j <= w; ++j) {
        double acc = max ? -std::numeric_limits<double>::infinity() : 0;
        for (Index yy = i - 1; yy <= i; ++yy)
          for (Index xx = j - 1; xx <= j; ++xx) {
            if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
            const double v = x.data[static_cast<std::size_t>((p * h + yy) * w + xx)];
            acc = max ? std::max(acc, v) : acc + v;
          }
        y.data[static_cast<std::size_t>((p * (h + 1) + i) * (w + 1) + j)] = max ? acc : acc / 4;
      }
  return y;
}

/// Adaptive average pooling to [oh, ow]: window i over [⌊i·H/oh⌋, ⌈(i+1)·H/oh⌉).
inline NdArray adaptive_avg_pool2d(const NdArray& x, Index oh, Index ow) {
  const Index planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3];
  NdArray y = zeros(Shape{x.shape[0], x.shape[1], oh, ow});
  for (Index p = 0; p < planes; ++p)
    for (Index i = 0; i < oh; ++i)
      for (Index j = 0; j < ow; ++j) {
        const Index y0 = i * h / oh, y1 = ((i + 1) * h + oh - 1) / oh, x0 = j * w / ow,
                    x1 = ((j + 1) * w + ow - 1) / ow;
        double acc = 0;
        for (Index yy = y0; yy < y1; ++yy)
          for (Index xx = x0; xx < x1; ++xx) acc += x.data[static_cast<std::size_t>((p * h + yy) * w + xx)];
        y.data[static_cast<std::size_t>((p * oh + i) * ow + j)] = acc / static_cast<double>((y1 - y0) * (x1 - x0));
      }
  return y;
}

/// Training-mode batch normalisation of x [N, C, *] with weight and bias [C], eps 1e-5: per channel, the batch's
/// mean and biased variance over every other dim.
inline NdArray batch_norm(const NdArray& x, const NdArray& w, const NdArray& b) {
  const Index n = x.shape[0], c = x.shape[1], inner = static_cast<Index>(x.data.size()) / (n * c);
  NdArray y = x;
  for (Index ch = 0; ch < c; ++ch) {
    auto at = [&](Index s, Index i) { return static_cast<std::size_t>((s * c + ch) * inner + i); };
    double sum = 0, squares = 0;
    for (Index s = 0; s < n; ++s)
      for (Index i = 0; i < inner; ++i) sum += x.data[at(s, i)];
    const double mean = sum / static_cast<double>(n * inner);
    for (Index s = 0; s < n; ++s)
      for (Index i = 0; i < inner; ++i) squares += (x.data[at(s, i)] - mean) * (x.data[at(s, i)] - mean);
    const double rstd = 1 / std::sqrt(squares / static_cast<double>(n * inner) + 1e-5);
    for (Index s = 0; s < n; ++s)
      for (Index i = 0; i < inner; ++i)
        y.data[at(s, i)] = (x.data[at(s, i)] - mean) * rstd * w.data[static_cast<std::size_t>(ch)] +
                           b.data[static_cast<std::size_t>(ch)];
  }
  return y;
}

/// Nearest-neighbour resizing by the definition, in integers: y[n,c,i,j] = x[n, c, min(⌊i·ah/bh⌋, H−1),
/// min(⌊j·aw/bw⌋, W−1)] (ah/bh = 1 / scale_factor along H, aw/bw along W), to [oh, ow].
inline NdArray upsample_nearest2d(const NdArray& x, Index oh, Index ow, Index ah, Index bh, Index aw, Index bw) {
  const Index planes = x.shape[0] * x.shape[1], h = x.shape[2], w = x.shape[3];
  NdArray y = zeros(Shape{x.shape[0], x.shape[1], oh, ow});
  for (Index p = 0; p < planes; ++p)
    for (Index i = 0; i < oh; ++i)
      for (Index j = 0; j < ow; ++j)
        y.data[static_cast<std::size_t>((p * oh + i) * ow + j)] =
            x.data[static_cast<std::size_t>((p * h + std::min(i * ah / bh, h - 1)) * w + std::min(j * aw / bw, w - 1))];
  return y;
}

}  // namespace nd_reference

/// batch_norm in training with weight and bias and no running statistics (the op list's entry).
template <class T>
remat::Var<T> batch_norm_training(const std::vector<remat::Var<T>>& v) {
  return remat::batch_norm(v[0], nullptr, nullptr,
                           remat::BatchNormFuncOptions<T>().weight(v[1]).bias(v[2]).training(true));
}

/// Indices for index_select along a dim of n entries: (3i + 1) mod n for i < 3, then 1 mod n again (a repeat,
/// whose gradient must accumulate).
inline std::vector<int> nd_test_indices(Index n) {
  std::vector<int> idx;
  for (Index i = 0; i < 3; ++i) idx.push_back(static_cast<int>((3 * i + 1) % n));
  idx.push_back(static_cast<int>(1 % n));
  return idx;
}
/// gather's index along dim 1 of x: x's shape with dim 1 made 2 (or kept if 1), values (5p + 2) mod x[1] at
/// position p (positions repeat values: a scatter-add).
inline Shape nd_gather_shape(const Shape& x) {
  Shape s = x;
  if (s[1] > 1) s[1] = 2;
  return s;
}
inline std::vector<int> nd_gather_index(const Shape& x) {
  std::vector<int> idx(static_cast<std::size_t>(nd_gather_shape(x).numel()));
  for (std::size_t p = 0; p < idx.size(); ++p) idx[p] = static_cast<int>((5 * p + 2) % static_cast<std::size_t>(x[1]));
  return idx;
}

namespace detail {

template <class Builder>
OpCase make_op(std::string name, int arity, Builder builder, std::vector<ShapeSet> shape_sets,
               std::vector<Domain> domains, ReferenceFunction reference) {
  OpCase op;
  op.name = std::move(name);
  op.arity = arity;
  op.build_float = [builder](const Inputs<float>& in) { return builder(in); };
#if !defined(REMAT_OP_KERNELS_FLOAT_ONLY)
  // A program built with only the float kernels compiled once (scripts/test.sh's optimised build: its
  // tests/alloc cases record in float) would otherwise compile every op's double kernels here.
  op.build_double = [builder](const Inputs<double>& in) { return builder(in); };
#endif
  op.shape_sets = std::move(shape_sets);
  if (domains.size() == 1 && arity > 1) domains.resize(static_cast<std::size_t>(arity), domains[0]);
  op.domains = std::move(domains);
  op.reference = std::move(reference);
  return op;
}

template <class Builder>
OpCase make_nd_op(std::string name, int arity, Builder builder, std::vector<ShapeSet> shape_sets,
                  std::vector<Domain> domains, NdReferenceFunction reference) {
  OpCase op = make_op(std::move(name), arity, builder, std::move(shape_sets), std::move(domains), nullptr);
  op.nd_reference = std::move(reference);
  return op;
}

/// N-D shapes of one input: a size-1 set, rank 3, rank 4 with a size-1 dim, rank 1.
inline std::vector<ShapeSet> nd_unary_shapes() {
  return {{{1, 1, 1}}, {{2, 3, 4}}, {{2, 1, 3, 2}}, {{5}}};
}

/// N-D broadcasting of two inputs: same shape, differing ranks either way, size-1 dims in either operand.
inline std::vector<ShapeSet> nd_binary_shapes() {
  return {{{1, 1, 1}, {1, 1, 1}}, {{2, 3, 4}, {2, 3, 4}},    {{2, 3, 4}, {4}},
          {{4}, {2, 3, 4}},       {{2, 1, 4}, {3, 1}},       {{3, 1}, {2, 1, 4}},
          {{2, 3, 4}, {2, 1, 1}}, {{2, 1, 3, 4}, {2, 3, 4}}, {{1, 3, 1, 2}, {2, 1, 4, 1}}};
}

inline std::vector<ShapeSet> unary_shapes() {
  return {{{1, 1}}, {{3, 4}}, {{5, 2}}, {{1, 6}}};
}

/// Same-shape and every broadcasting form: 1×n row, m×1 column, 1×1 scalar, on either side, and the
/// outer form (m×1 with 1×n).
inline std::vector<ShapeSet> binary_shapes() {
  return {{{1, 1}, {1, 1}}, {{3, 4}, {3, 4}},   // same shape
          {{3, 4}, {1, 4}}, {{1, 4}, {3, 4}},   // row
          {{3, 4}, {3, 1}}, {{3, 1}, {3, 4}},   // column
          {{3, 4}, {1, 1}}, {{1, 1}, {3, 4}},   // scalar
          {{3, 1}, {1, 4}}, {{1, 4}, {3, 1}}};  // outer
}

}  // namespace detail

/// Every op and form. Built once; entries are never removed, only added.
inline const std::vector<OpCase>& op_list() {
  using detail::make_nd_op;
  using detail::make_op;
  namespace ref = reference;
  using M = Matrix<double>;
  using V = std::vector<M>;
  static const std::vector<OpCase> list = [] {
    const auto unary = detail::unary_shapes();
    const auto binary = detail::binary_shapes();
    std::vector<OpCase> l;
    // ---- dot ----
    l.push_back(make_op(
        "matmul", 2, [](const auto& v) { return remat::matmul(v[0], v[1]); },
        {{{1, 1}, {1, 1}}, {{3, 4}, {4, 2}}, {{1, 5}, {5, 1}}, {{4, 1}, {1, 3}}, {{2, 3}, {3, 3}}}, {anywhere},
        [](const V& x) { return ref::matmul(x[0], x[1]); }));
    l.push_back(make_op(
        "linear", 3, [](const auto& v) { return remat::linear(v[0], v[1], v[2]); },
        {{{1, 1}, {1, 1}, {1, 1}}, {{3, 4}, {4, 2}, {1, 2}}, {{1, 3}, {3, 5}, {1, 5}}}, {anywhere},
        [](const V& x) { return ref::zip(ref::matmul(x[0], x[1]), x[2], [](double a, double b) { return a + b; }); }));
    // ---- elementwise binary, function and operator forms ----
    const auto plus = [](double a, double b) { return a + b; };
    const auto minus = [](double a, double b) { return a - b; };
    const auto times = [](double a, double b) { return a * b; };
    const auto over = [](double a, double b) { return a / b; };
    const Domain denominator = away_from_zero;
    l.push_back(make_op(
        "add", 2, [](const auto& v) { return remat::add(v[0], v[1]); }, binary, {anywhere},
        [plus](const V& x) { return ref::zip(x[0], x[1], plus); }));
    l.push_back(make_op(
        "operator_plus", 2, [](const auto& v) { return v[0] + v[1]; }, binary, {anywhere},
        [plus](const V& x) { return ref::zip(x[0], x[1], plus); }));
    l.push_back(make_op(
        "subtract", 2, [](const auto& v) { return remat::subtract(v[0], v[1]); }, binary, {anywhere},
        [minus](const V& x) { return ref::zip(x[0], x[1], minus); }));
    l.push_back(make_op(
        "operator_minus", 2, [](const auto& v) { return v[0] - v[1]; }, binary, {anywhere},
        [minus](const V& x) { return ref::zip(x[0], x[1], minus); }));
    l.push_back(make_op(
        "multiply", 2, [](const auto& v) { return remat::multiply(v[0], v[1]); }, binary, {anywhere},
        [times](const V& x) { return ref::zip(x[0], x[1], times); }));
    l.push_back(make_op(
        "operator_times", 2, [](const auto& v) { return v[0] * v[1]; }, binary, {anywhere},
        [times](const V& x) { return ref::zip(x[0], x[1], times); }));
    l.push_back(make_op(
        "divide", 2, [](const auto& v) { return remat::divide(v[0], v[1]); }, binary, {anywhere, denominator},
        [over](const V& x) { return ref::zip(x[0], x[1], over); }));
    l.push_back(make_op(
        "operator_divide", 2, [](const auto& v) { return v[0] / v[1]; }, binary, {anywhere, denominator},
        [over](const V& x) { return ref::zip(x[0], x[1], over); }));
    // ---- scalar-constant forms (affine and scalar_divide) ----
    l.push_back(make_op(
        "var_plus_scalar", 1, [](const auto& v) { return v[0] + 1.5; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return a + 1.5; }); }));
    l.push_back(make_op(
        "scalar_plus_var", 1, [](const auto& v) { return 1.5 + v[0]; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return 1.5 + a; }); }));
    l.push_back(make_op(
        "var_minus_scalar", 1, [](const auto& v) { return v[0] - 0.75; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return a - 0.75; }); }));
    l.push_back(make_op(
        "scalar_minus_var", 1, [](const auto& v) { return 0.75 - v[0]; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return 0.75 - a; }); }));
    l.push_back(make_op(
        "var_times_scalar", 1, [](const auto& v) { return v[0] * -1.25; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return a * -1.25; }); }));
    l.push_back(make_op(
        "scalar_times_var", 1, [](const auto& v) { return 2.5 * v[0]; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return 2.5 * a; }); }));
    l.push_back(make_op(
        "var_times_integer", 1, [](const auto& v) { return v[0] * 3; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return a * 3; }); }));
    l.push_back(make_op(
        "var_over_scalar", 1, [](const auto& v) { return v[0] / 1.75; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return a / 1.75; }); }));
    l.push_back(make_op(
        "scalar_over_var", 1, [](const auto& v) { return 1.25 / v[0]; }, unary, {away_from_zero},
        [](const V& x) { return ref::map(x[0], [](double a) { return 1.25 / a; }); }));
    l.push_back(make_op(
        "affine", 1, [](const auto& v) { return remat::affine(v[0], 0.5, -0.25); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return 0.5 * a - 0.25; }); }));
    // ---- elementwise unary ----
    l.push_back(make_op(
        "neg", 1, [](const auto& v) { return remat::neg(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return -a; }); }));
    l.push_back(make_op(
        "operator_negate", 1, [](const auto& v) { return -v[0]; }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return -a; }); }));
    l.push_back(make_op(
        "exp", 1, [](const auto& v) { return remat::exp(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::exp(a); }); }));
    l.push_back(make_op(
        "log", 1, [](const auto& v) { return remat::log(v[0]); }, unary, {positive},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::log(a); }); }));
    l.push_back(make_op(
        "sin", 1, [](const auto& v) { return remat::sin(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::sin(a); }); }));
    l.push_back(make_op(
        "cos", 1, [](const auto& v) { return remat::cos(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::cos(a); }); }));
    l.push_back(make_op(
        "abs", 1, [](const auto& v) { return remat::abs(v[0]); }, unary, {away_from_zero},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::abs(a); }); }));
    l.push_back(make_op(
        "pow_fractional", 1, [](const auto& v) { return remat::pow(v[0], 2.5); }, unary, {positive},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::pow(a, 2.5); }); }));
    l.push_back(make_op(
        "pow_negative", 1, [](const auto& v) { return remat::pow(v[0], -1.5); }, unary, {positive},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::pow(a, -1.5); }); }));
    l.push_back(make_op(
        "pow_integer", 1, [](const auto& v) { return remat::pow(v[0], 3.0); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return a * a * a; }); }));
    l.push_back(make_op(
        "tanh", 1, [](const auto& v) { return remat::tanh(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::tanh(a); }); }));
    l.push_back(make_op(
        "sigmoid", 1, [](const auto& v) { return remat::sigmoid(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return 1 / (1 + std::exp(-a)); }); }));
    l.push_back(make_op(
        "relu", 1, [](const auto& v) { return remat::relu(v[0]); }, unary, {away_from_zero},
        [](const V& x) { return ref::map(x[0], [](double a) { return a > 0 ? a : 0.0; }); }));
    l.push_back(make_op(
        "gelu", 1, [](const auto& v) { return remat::gelu(v[0]); }, unary, {Domain{-3, 3, 0}},
        [](const V& x) { return ref::map(x[0], ref::gelu); }));
    l.push_back(make_op(
        "softplus", 1, [](const auto& v) { return remat::softplus(v[0]); }, unary, {Domain{-3, 3, 0}},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::log1p(std::exp(a)); }); }));
    l.push_back(make_op(
        "square", 1, [](const auto& v) { return remat::square(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::map(x[0], [](double a) { return a * a; }); }));
    l.push_back(make_op(
        "sqrt", 1, [](const auto& v) { return remat::sqrt(v[0]); }, unary, {positive},
        [](const V& x) { return ref::map(x[0], [](double a) { return std::sqrt(a); }); }));
    // ---- reductions ----
    l.push_back(make_op(
        "sum", 1, [](const auto& v) { return remat::sum(v[0]); }, unary, {anywhere},
        [](const V& x) {
          double s = 0;
          for (Index i = 0; i < x[0].rows(); ++i)
            for (Index j = 0; j < x[0].cols(); ++j) s += x[0](i, j);
          return ref::scalar(s);
        }));
    l.push_back(make_op(
        "mean", 1, [](const auto& v) { return remat::mean(v[0]); }, unary, {anywhere},
        [](const V& x) {
          double s = 0;
          for (Index i = 0; i < x[0].rows(); ++i)
            for (Index j = 0; j < x[0].cols(); ++j) s += x[0](i, j);
          return ref::scalar(s / static_cast<double>(x[0].rows() * x[0].cols()));
        }));
    l.push_back(make_op(
        "sum_rows", 1, [](const auto& v) { return remat::sum_rows(v[0]); }, unary, {anywhere},
        [](const V& x) {
          M y = M::Zero(x[0].rows(), 1);
          for (Index i = 0; i < x[0].rows(); ++i)
            for (Index j = 0; j < x[0].cols(); ++j) y(i, 0) += x[0](i, j);
          return y;
        }));
    // ---- normalization ----
    l.push_back(make_op(
        "softmax", 1, [](const auto& v) { return remat::softmax(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::softmax(x[0]); }));
    l.push_back(make_op(
        "log_softmax", 1, [](const auto& v) { return remat::log_softmax(v[0]); }, unary, {anywhere},
        [](const V& x) { return ref::log_softmax(x[0]); }));
    l.push_back(make_op(
        "layer_norm", 3, [](const auto& v) { return remat::layer_norm(v[0], v[1], v[2], test_layer_norm_eps); },
        {{{1, 1}, {1, 1}, {1, 1}}, {{3, 4}, {1, 4}, {1, 4}}, {{2, 5}, {1, 5}, {1, 5}}, {{1, 3}, {1, 3}, {1, 3}}},
        {anywhere}, [](const V& x) { return ref::layer_norm(x[0], x[1], x[2], test_layer_norm_eps); }));
    // ---- losses ----
    l.push_back(make_op(
        "cross_entropy", 1,
        [](const auto& v) { return remat::cross_entropy(v[0], test_labels(v[0].rows(), v[0].cols())); }, unary,
        {anywhere}, [](const V& x) { return ref::cross_entropy(x[0], test_labels(x[0].rows(), x[0].cols())); }));
    l.push_back(make_op(
        "mse_loss", 2, [](const auto& v) { return remat::mse_loss(v[0], v[1]); },
        {{{1, 1}, {1, 1}}, {{3, 4}, {3, 4}}, {{5, 2}, {5, 2}}}, {anywhere},
        [](const V& x) {
          double s = 0;
          for (Index i = 0; i < x[0].rows(); ++i)
            for (Index j = 0; j < x[0].cols(); ++j) s += (x[0](i, j) - x[1](i, j)) * (x[0](i, j) - x[1](i, j));
          return ref::scalar(s / static_cast<double>(x[0].rows() * x[0].cols()));
        }));
    // ---- random ----
    // The value of dropout with p > 0 depends on the tape's generator; tests/ops/gradcheck_test.cpp
    // checks it (mask/(1-p) scaling, statistics). With p = 0 it is the identity.
    l.push_back(make_op(
        "dropout", 1, [](const auto& v) { return remat::dropout(v[0], 0.3); }, unary, {anywhere}, nullptr));
    l.push_back(make_op(
        "dropout_p0", 1, [](const auto& v) { return remat::dropout(v[0], 0.0); }, unary, {anywhere},
        [](const V& x) { return x[0]; }));
    // ---- identity ----
    l.push_back(make_op(
        "checkpoint_name", 1, [](const auto& v) { return remat::checkpoint_name(v[0], "tagged"); }, unary, {anywhere},
        [](const V& x) { return x[0]; }));
    // ---- data movement ----
    l.push_back(make_op(
        "embedding", 1, [](const auto& v) { return remat::embedding(v[0], test_ids(v[0].rows())); }, unary, {anywhere},
        [](const V& x) {
          const auto ids = test_ids(x[0].rows());
          M y(static_cast<Index>(ids.size()), x[0].cols());
          for (std::size_t i = 0; i < ids.size(); ++i) y.row(static_cast<Index>(i)) = x[0].row(ids[i]);
          return y;
        }));
    // Columns [cols/3, cols/3 + max(1, cols/2)) of x.
    l.push_back(make_op(
        "slice_cols", 1,
        [](const auto& v) {
          const Index n = v[0].cols();
          return remat::slice_cols(v[0], n / 3, std::max<Index>(1, n / 2));
        },
        unary, {anywhere},
        [](const V& x) {
          const Index n = x[0].cols();
          return M(x[0].middleCols(n / 3, std::max<Index>(1, n / 2)));
        }));
    l.push_back(make_op(
        "concat_cols", 2,
        [](const auto& v) {
          return remat::concat_cols({v[0], v[1]});
        },
        {{{1, 1}, {1, 1}}, {{3, 2}, {3, 4}}, {{2, 1}, {2, 3}}}, {anywhere},
        [](const V& x) {
          M y(x[0].rows(), x[0].cols() + x[1].cols());
          y << x[0], x[1];
          return y;
        }));
    {
      OpCase three = make_op(
          "concat_cols_three_parts", 3,
          [](const auto& v) {
            return remat::concat_cols({v[0], v[1], v[2]});
          },
          {{{1, 1}, {1, 2}, {1, 1}}, {{3, 2}, {3, 1}, {3, 3}}}, {anywhere},
          [](const V& x) {
            M y(x[0].rows(), x[0].cols() + x[1].cols() + x[2].cols());
            y << x[0], x[1], x[2];
            return y;
          });
      three.recorded_ops = 2;  // a tree of two-part concatenations
      l.push_back(std::move(three));
    }
    l.push_back(make_op(
        "transpose", 1, [](const auto& v) { return remat::transpose(v[0]); }, unary, {anywhere},
        [](const V& x) { return M(x[0].transpose()); }));
    // x read in row-major order as [cols, rows].
    l.push_back(make_op(
        "reshape", 1, [](const auto& v) { return remat::reshape(v[0], v[0].cols(), v[0].rows()); }, unary, {anywhere},
        [](const V& x) {
          M y(x[0].cols(), x[0].rows());
          for (Index k = 0; k < x[0].size(); ++k)
            y(k / y.cols(), k % y.cols()) = x[0](k / x[0].cols(), k % x[0].cols());
          return y;
        }));
    // ---- column reductions, row maxima ----
    l.push_back(make_op(
        "sum_cols", 1, [](const auto& v) { return remat::sum_cols(v[0]); }, unary, {anywhere},
        [](const V& x) {
          M y = M::Zero(1, x[0].cols());
          for (Index i = 0; i < x[0].rows(); ++i)
            for (Index j = 0; j < x[0].cols(); ++j) y(0, j) += x[0](i, j);
          return y;
        }));
    l.push_back(make_op(
        "mean_cols", 1, [](const auto& v) { return remat::mean_cols(v[0]); }, unary, {anywhere},
        [](const V& x) {
          M y = M::Zero(1, x[0].cols());
          for (Index i = 0; i < x[0].rows(); ++i)
            for (Index j = 0; j < x[0].cols(); ++j) y(0, j) += x[0](i, j) / static_cast<double>(x[0].rows());
          return y;
        }));
    l.push_back(make_op(
        "max_rows", 1, [](const auto& v) { return remat::max_rows(v[0]); }, unary, {anywhere},
        [](const V& x) {
          M y(x[0].rows(), 1);
          for (Index i = 0; i < x[0].rows(); ++i) {
            double m = x[0](i, 0);
            for (Index j = 1; j < x[0].cols(); ++j) m = std::max(m, x[0](i, j));
            y(i, 0) = m;
          }
          return y;
        }));
    // ---- attention (layouts: attention_config) ----
    const std::vector<ShapeSet> qk = {{{1, 1}, {1, 1}}, {{6, 4}, {6, 4}}, {{4, 3}, {4, 3}}, {{3, 2}, {3, 2}}};
    const std::vector<ShapeSet> qkv = {
        {{1, 1}, {1, 1}, {1, 1}}, {{6, 4}, {6, 4}, {6, 4}}, {{4, 3}, {4, 3}, {4, 3}}, {{3, 2}, {3, 2}, {3, 2}}};
    l.push_back(make_op(
        "attention_scores", 2,
        [](const auto& v) {
          const auto c = attention_config(v[0].shape());
          return remat::attention_scores(v[0], v[1], c.heads, c.seq_len, false);
        },
        qk, {anywhere},
        [](const V& x) {
          const auto c = attention_config({x[0].rows(), x[0].cols()});
          return ref::attention_scores(x[0], x[1], c.heads, c.seq_len, false);
        }));
    {
      // Causal scores hold −∞: a softmax after them makes a finite function to check.
      OpCase causal = make_op(
          "attention_scores_causal", 2,
          [](const auto& v) {
            const auto c = attention_config(v[0].shape());
            return remat::softmax(remat::attention_scores(v[0], v[1], c.heads, c.seq_len, true));
          },
          qk, {anywhere},
          [](const V& x) {
            const auto c = attention_config({x[0].rows(), x[0].cols()});
            return ref::softmax(ref::attention_scores(x[0], x[1], c.heads, c.seq_len, true));
          });
      causal.recorded_ops = 2;
      l.push_back(std::move(causal));
    }
    l.push_back(make_op(
        "attention_values", 2,
        [](const auto& v) {
          const auto c = attention_config(v[1].shape());
          return remat::attention_values(v[0], v[1], c.heads, c.seq_len);
        },
        {{{1, 1}, {1, 1}},
         {attention_matrix_shape({6, 4}), {6, 4}},
         {attention_matrix_shape({4, 3}), {4, 3}},
         {attention_matrix_shape({3, 2}), {3, 2}}},
        {anywhere},
        [](const V& x) {
          const auto c = attention_config({x[1].rows(), x[1].cols()});
          return ref::attention_values(x[0], x[1], c.heads, c.seq_len);
        }));
    for (const bool causal : {false, true})
      l.push_back(make_op(
          causal ? "scaled_dot_product_attention_causal" : "scaled_dot_product_attention", 3,
          [causal](const auto& v) {
            const auto c = attention_config(v[0].shape());
            return remat::scaled_dot_product_attention(v[0], v[1], v[2], c.heads, c.seq_len, causal);
          },
          qkv, {anywhere},
          [causal](const V& x) {
            const auto c = attention_config({x[0].rows(), x[0].cols()});
            return ref::attention_values(ref::softmax(ref::attention_scores(x[0], x[1], c.heads, c.seq_len, causal)),
                                         x[2], c.heads, c.seq_len);
          }));
    // ---- N-D forms: shapes of rank 1, 3 and 4 (size-1 dims, broadcasting either way), references on flat data ----
    namespace nd = nd_reference;
    using A = std::vector<NdArray>;
    const auto nd_unary = detail::nd_unary_shapes();
    const auto nd_binary = detail::nd_binary_shapes();
    const std::vector<ShapeSet> nd_matrices = {{{1, 1, 1}}, {{2, 3, 4}}, {{2, 4, 1, 3}}};  // rank >= 2: a dim 1
    auto rank_of = [](const auto& x) { return x.shape().rank(); };
    l.push_back(make_nd_op(
        "add_nd", 2, [](const auto& v) { return remat::add(v[0], v[1]); }, nd_binary, {anywhere},
        [plus](const A& x) { return nd::zip(x[0], x[1], plus); }));
    l.push_back(make_nd_op(
        "multiply_nd", 2, [](const auto& v) { return remat::multiply(v[0], v[1]); }, nd_binary, {anywhere},
        [times](const A& x) { return nd::zip(x[0], x[1], times); }));
    l.push_back(make_nd_op(
        "maximum_nd", 2, [](const auto& v) { return remat::maximum(v[0], v[1]); }, nd_binary, {anywhere},
        [](const A& x) { return nd::zip(x[0], x[1], [](double a, double b) { return std::max(a, b); }); }));
    l.push_back(make_nd_op(
        "where_nd", 3, [](const auto& v) { return remat::where(v[0], v[1], v[2]); },
        {{{1, 1, 1}, {1, 1, 1}, {1, 1, 1}},
         {{2, 3, 4}, {2, 3, 4}, {2, 3, 4}},
         {{2, 1, 4}, {3, 1}, {2, 3, 4}},
         {{4}, {2, 3, 4}, {3, 1}}},
        {Domain{-2, 2, 0.25, true}, anywhere, anywhere},  // the condition: about half of it 0
        [](const A& x) { return nd::where(x[0], x[1], x[2]); }));
    l.push_back(make_nd_op(
        "clamp_nd", 1, [](const auto& v) { return remat::clamp(v[0], -0.5, 1.0); }, nd_unary, {anywhere},
        [](const A& x) { return nd::map(x[0], [](double a) { return std::min(std::max(a, -0.5), 1.0); }); }));
    // torch.matmul: batched with one matrix (folded), batch against batch, broadcast batch dims, vectors.
    l.push_back(make_nd_op(
        "matmul_nd", 2, [](const auto& v) { return remat::matmul(v[0], v[1]); },
        {{{1, 1, 1}, {1, 1, 1}},
         {{2, 3, 4, 5}, {5, 6}},
         {{2, 3, 4}, {2, 4, 5}},
         {{2, 1, 3, 4}, {5, 4, 6}},
         {{4}, {2, 4, 3}},
         {{2, 3, 4}, {4}}},
        {anywhere}, [](const A& x) { return nd::matmul(x[0], x[1]); }));
    // Reductions over dims: {0, last} with keepdim, the middle dim (or dim 0) without, every dim (rank 0).
    auto first_and_last = [](int rank) { return rank > 1 ? std::vector<int>{0, -1} : std::vector<int>{0}; };
    l.push_back(make_nd_op(
        "sum_dims_keepdim", 1,
        [first_and_last](const auto& v) { return remat::sum(v[0], first_and_last(v[0].shape().rank()), true); },
        nd_unary, {anywhere},
        [first_and_last](const A& x) { return nd::reduce(x[0], 0, first_and_last(x[0].shape.rank()), true); }));
    l.push_back(make_nd_op(
        "sum_all_dims", 1, [](const auto& v) { return remat::sum(v[0], std::vector<int>{}, false); }, nd_unary,
        {anywhere}, [](const A& x) { return nd::reduce(x[0], 0, {}, false); }));
    l.push_back(make_nd_op(
        "mean_dims", 1, [rank_of](const auto& v) { return remat::mean(v[0], {rank_of(v[0]) > 1 ? 1 : 0}, false); },
        nd_unary, {anywhere}, [](const A& x) { return nd::reduce(x[0], 1, {x[0].shape.rank() > 1 ? 1 : 0}, false); }));
    l.push_back(make_nd_op(
        "max_dims_keepdim", 1, [rank_of](const auto& v) { return remat::max(v[0], {rank_of(v[0]) > 1 ? 1 : 0}, true); },
        nd_unary, {anywhere}, [](const A& x) { return nd::reduce(x[0], 2, {x[0].shape.rank() > 1 ? 1 : 0}, true); }));
    l.push_back(make_nd_op(
        "max_dims", 1,
        [first_and_last](const auto& v) { return remat::max(v[0], first_and_last(v[0].shape().rank()), false); },
        nd_unary, {anywhere},
        [first_and_last](const A& x) { return nd::reduce(x[0], 2, first_and_last(x[0].shape.rank()), false); }));
    // softmax and log_softmax over dim 1 (a middle dim from rank 3; dim 0 of a vector).
    l.push_back(make_nd_op(
        "softmax_dim", 1, [rank_of](const auto& v) { return remat::softmax(v[0], rank_of(v[0]) > 1 ? 1 : 0); },
        {{{1, 1, 1}}, {{2, 3, 4}}, {{2, 4, 1, 3}}, {{5}}}, {anywhere},
        [](const A& x) { return nd::softmax(x[0], x[0].shape.rank() > 1 ? 1 : 0, false); }));
    l.push_back(make_nd_op(
        "log_softmax_dim", 1, [rank_of](const auto& v) { return remat::log_softmax(v[0], rank_of(v[0]) > 1 ? 1 : 0); },
        {{{1, 1, 1}}, {{2, 3, 4}}, {{2, 4, 1, 3}}, {{5}}}, {anywhere},
        [](const A& x) { return nd::softmax(x[0], x[0].shape.rank() > 1 ? 1 : 0, true); }));
    // layer_norm over the trailing two dims, weight and bias of their shape.
    l.push_back(make_nd_op(
        "layer_norm_nd", 3,
        [](const auto& v) { return remat::layer_norm(v[0], v[1].shape(), v[1], v[2], test_layer_norm_eps); },
        {{{1, 1, 1}, {1, 1}, {1, 1}}, {{2, 3, 4}, {3, 4}, {3, 4}}, {{2, 1, 3, 2}, {3, 2}, {3, 2}}}, {anywhere},
        [](const A& x) { return nd::layer_norm(x[0], x[1], x[2], test_layer_norm_eps); }));
    // ---- N-D data movement ----
    auto permutation = [](int rank) {
      return rank == 4 ? std::vector<int>{3, 1, 0, 2} : rank == 3 ? std::vector<int>{2, 0, 1} : std::vector<int>{0};
    };
    l.push_back(make_nd_op(
        "permute", 1,
        [permutation, rank_of](const auto& v) { return remat::permute(v[0], permutation(rank_of(v[0]))); }, nd_unary,
        {anywhere}, [permutation](const A& x) { return nd::permute(x[0], permutation(x[0].shape.rank())); }));
    l.push_back(make_nd_op(
        "transpose_dims", 1, [](const auto& v) { return remat::transpose(v[0], 0, -1); }, nd_unary, {anywhere},
        [](const A& x) {
          std::vector<int> p;
          for (int d = 0; d < x[0].shape.rank(); ++d) p.push_back(d);
          std::swap(p.front(), p.back());
          return nd::permute(x[0], p);
        }));
    // [.., n] read as [n, elements / n].
    l.push_back(make_nd_op(
        "reshape_nd", 1,
        [](const auto& v) {
          return remat::reshape(v[0], {v[0].size(-1), -1});
        },
        nd_unary, {anywhere},
        [](const A& x) {
          const Index n = x[0].shape[x[0].shape.rank() - 1];
          return nd::reshape(x[0], Shape{n, nd::count(x[0].shape) / n});
        }));
    l.push_back(make_nd_op(
        "flatten", 1, [](const auto& v) { return remat::flatten(v[0], 1); }, nd_matrices, {anywhere},
        [](const A& x) {
          return nd::reshape(x[0], Shape{x[0].shape[0], nd::count(x[0].shape) / x[0].shape[0]});
        }));
    l.push_back(make_nd_op(
        "squeeze", 1, [](const auto& v) { return remat::squeeze(v[0], 1); },
        {{{1, 1, 1}}, {{2, 1, 4}}, {{2, 1, 3, 2}}, {{2, 3, 4}}}, {anywhere},  // the last: no dim of 1 there, unchanged
        [](const A& x) {
          if (x[0].shape[1] != 1) return x[0];
          std::vector<Index> d = x[0].shape.dims();
          d.erase(d.begin() + 1);
          return nd::reshape(x[0], Shape(d));
        }));
    l.push_back(make_nd_op(
        "unsqueeze", 1, [](const auto& v) { return remat::unsqueeze(v[0], 1); }, nd_unary, {anywhere},
        [](const A& x) { return nd::unsqueeze(x[0], 1); }));
    l.push_back(make_nd_op(
        "concat_nd", 2,
        [](const auto& v) {
          return remat::concat({v[0], v[1]}, 1);
        },
        {{{1, 1, 1}, {1, 1, 1}}, {{2, 3, 4}, {2, 1, 4}}, {{2, 1, 3, 2}, {2, 2, 3, 2}}}, {anywhere},
        [](const A& x) {
          return nd::concat({x[0], x[1]}, 1);
        }));
    l.push_back(make_nd_op(
        "stack", 2,
        [](const auto& v) {
          return remat::stack({v[0], v[1]}, 1);
        },
        {{{1, 1, 1}, {1, 1, 1}}, {{2, 3, 4}, {2, 3, 4}}, {{2, 1, 3, 2}, {2, 1, 3, 2}}, {{5}, {5}}}, {anywhere},
        [](const A& x) {
          return nd::concat({nd::unsqueeze(x[0], 1), nd::unsqueeze(x[1], 1)}, 1);
        }));
    // Entries [n/3, n/3 + max(1, n/2)) of dim 1 (n its size).
    l.push_back(make_nd_op(
        "slice", 1,
        [](const auto& v) {
          const Index n = v[0].size(1);
          return remat::slice(v[0], 1, n / 3, std::max<Index>(1, n / 2));
        },
        nd_matrices, {anywhere},
        [](const A& x) {
          const Index n = x[0].shape[1];
          return nd::slice(x[0], 1, n / 3, std::max<Index>(1, n / 2));
        }));
    l.push_back(make_nd_op(
        "index_select", 1, [](const auto& v) { return remat::index_select(v[0], 1, nd_test_indices(v[0].size(1))); },
        nd_matrices, {anywhere}, [](const A& x) { return nd::index_select(x[0], 1, nd_test_indices(x[0].shape[1])); }));
    l.push_back(make_nd_op(
        "gather", 1,
        [](const auto& v) {
          return remat::gather(v[0], 1, nd_gather_index(v[0].shape()), nd_gather_shape(v[0].shape()));
        },
        nd_matrices, {anywhere},
        [](const A& x) { return nd::gather(x[0], 1, nd_gather_index(x[0].shape), nd_gather_shape(x[0].shape)); }));
    // ---- convolution and pooling on [N,C,H,W] (references: the definitions' loops, nd_reference::window) ----
    l.push_back(make_nd_op(
        "conv2d", 3,
        [](const auto& v) {
          // Two groups where the channels allow (the 1x1 set: one channel, one group).
          const Index groups = v[0].size(1) / v[1].size(1);
          return remat::conv2d(v[0], v[1], v[2], remat::Conv2dOptions().stride({1, 2}).padding(1).groups(groups));
        },
        {{{1, 1, 1, 1}, {2, 1, 1, 1}, {2}}, {{2, 4, 5, 4}, {6, 2, 3, 3}, {6}}, {{1, 2, 3, 6}, {4, 1, 2, 3}, {4}}},
        {anywhere},
        [](const A& x) {
          return nd::conv2d(x[0], x[1], x[2], {1, 2}, {1, 1}, x[0].shape[1] / x[1].shape[1]);
        }));
    l.push_back(make_nd_op(
        "max_pool2d", 1,
        [](const auto& v) { return remat::max_pool2d(v[0], remat::MaxPool2dOptions(2).stride(1).padding(1)); },
        {{{1, 1, 1, 1}}, {{2, 3, 4, 5}}, {{1, 2, 3, 3}}}, {anywhere},
        [](const A& x) { return nd::pool2d(x[0], true); }));
    l.push_back(make_nd_op(
        "avg_pool2d", 1,
        [](const auto& v) { return remat::avg_pool2d(v[0], remat::AvgPool2dOptions(2).stride(1).padding(1)); },
        {{{1, 1, 1, 1}}, {{2, 3, 4, 5}}, {{1, 2, 3, 3}}}, {anywhere},
        [](const A& x) { return nd::pool2d(x[0], false); }));
    l.push_back(make_nd_op(
        "adaptive_avg_pool2d", 1,
        [](const auto& v) {
          return remat::adaptive_avg_pool2d(v[0], {2, 3});
        },
        {{{1, 1, 1, 1}}, {{2, 3, 4, 5}}, {{1, 2, 3, 2}}}, {anywhere},
        [](const A& x) { return nd::adaptive_avg_pool2d(x[0], 2, 3); }));
    l.push_back(make_nd_op(
        "batch_norm", 3, [](const auto& v) { return batch_norm_training(v); },
        {{{2, 3, 4, 5}, {3}, {3}}, {{2, 2, 3}, {2}, {2}}, {{3, 4}, {4}, {4}}, {{1, 1, 1, 2}, {1}, {1}}},
        {anywhere, anywhere, anywhere}, [](const A& x) { return nd::batch_norm(x[0], x[1], x[2]); }));
    // Scale factors 2 along H and 1.5 along W: sources ⌊i/2⌋ and ⌊2j/3⌋ (the sizes ⌊2H⌋ and ⌊1.5W⌋).
    l.push_back(make_nd_op(
        "upsample_nearest2d", 1,
        [](const auto& v) {
          return remat::upsample_nearest2d(v[0], remat::UpsampleNearest2dOptions().scale_factor({2, 1.5}));
        },
        {{{1, 1, 1, 1}}, {{2, 3, 4, 5}}, {{1, 2, 3, 2}}}, {anywhere},
        [](const A& x) { return nd::upsample_nearest2d(x[0], 2 * x[0].shape[2], 3 * x[0].shape[3] / 2, 1, 2, 2, 3); }));
    return l;
  }();
  return list;
}

/// The entry named `name`; throws std::out_of_range if there is none.
inline const OpCase& find_op(const std::string& name) {
  for (const OpCase& op : op_list())
    if (op.name == name) return op;
  throw std::out_of_range("op_list: no entry named " + name);
}

/// One op with one of its shape sets: the unit of a parameterized test.
struct OpInstance {
  const OpCase* op = nullptr;
  std::size_t shape_set = 0;
  const ShapeSet& shapes() const { return op->shape_sets[shape_set]; }
  /// "<op>_<r>x<c>_<r>x<c>...", e.g. "add_3x4_1x4"; unique over op_instances().
  std::string name() const {
    std::string s = op->name;
    for (const Shape& sh : shapes()) {
      if (sh.rank() == 2) {
        s += "_" + std::to_string(sh.rows()) + "x" + std::to_string(sh.cols());
        continue;
      }
      s += "_";  // N-D: every dim, e.g. "_2x1x3x2"
      for (int d = 0; d < sh.rank(); ++d) s += (d ? "x" : "") + std::to_string(sh[d]);
    }
    return s;
  }
};

/// Every (op, shape set) pair of op_list(), in list order.
inline std::vector<OpInstance> op_instances() {
  std::vector<OpInstance> all;
  for (const OpCase& op : op_list())
    for (std::size_t k = 0; k < op.shape_sets.size(); ++k) all.push_back(OpInstance{&op, k});
  return all;
}

/// For INSTANTIATE_TEST_SUITE_P's name generator (Info = ::testing::TestParamInfo<OpInstance>).
template <class Info>
std::string op_instance_name(const Info& info) {
  return info.param.name();
}

/// Random inputs of `shapes` drawn from the op's domains; input k uses seed + k.
template <class T>
std::vector<Matrix<T>> make_inputs(const OpCase& op, const ShapeSet& shapes, std::uint64_t seed) {
  std::vector<Matrix<T>> inputs;
  for (std::size_t k = 0; k < shapes.size(); ++k)
    inputs.push_back(random_matrix<T>(shapes[k], seed + k, op.domains[k]));
  return inputs;
}

/// Whether a shape set has a shape of another rank than 2 (an N-D entry's: its leaves come from remat_test::leaf).
inline bool is_nd(const ShapeSet& shapes) {
  return std::any_of(shapes.begin(), shapes.end(), [](const Shape& s) { return s.rank() != 2; });
}

/// A leaf of `shape` holding m's elements (row-major; m is shape's rows() × cols() matrix view): a tape variable
/// (or constant), from the matrix itself for rank 2 as every 2-D test did, from the shape and the data otherwise.
template <class T>
remat::Var<T> leaf(remat::Tape<T>& tape, const Matrix<T>& m, const Shape& shape, bool variable = true) {
  if (shape.rank() == 2) return variable ? tape.variable(m) : tape.constant(m);
  return variable ? tape.variable(shape, m.data()) : tape.constant(shape, m.data());
}

/// A Parameter of `shape` holding m's elements (rank 2: the matrix; N-D: a tensor of rank 1 to 4).
template <class T>
remat::Parameter<T> parameter(const Matrix<T>& m, const Shape& shape) {
  auto of_rank = [&](auto rank) {
    constexpr int R = decltype(rank)::value;
    Eigen::array<Eigen::Index, R> dims;
    for (int d = 0; d < R; ++d) dims[static_cast<std::size_t>(d)] = shape[d];
    remat::Tensor<T, R> t(dims);
    std::copy(m.data(), m.data() + m.size(), t.data());
    return remat::Parameter<T>(t);
  };
  switch (shape.rank()) {
    case 1:
      return of_rank(std::integral_constant<int, 1>{});
    case 3:
      return of_rank(std::integral_constant<int, 3>{});
    case 4:
      return of_rank(std::integral_constant<int, 4>{});
    default:
      return remat::Parameter<T>(m);
  }
}

/// The flat values of a matrix (its elements row-major) as an NdArray of `shape`.
inline NdArray nd_array(const Matrix<double>& m, const Shape& shape) {
  return {shape, std::vector<double>(m.data(), m.data() + m.size())};
}

/// Fixed weights in [−1, 1] for scalar_loss, one per output element.
template <class T>
Matrix<T> loss_weights(const Shape& shape, std::uint64_t seed) {
  return random_matrix<T>(shape, seed ^ 0x9e3779b97f4a7c15ULL, Domain{-1, 1, 0});
}

/// Reduces an op's output to a [1,1] loss in which every output element matters:
/// sum(out ⊙ weights) with loss_weights(out.shape(), seed) recorded as a constant on `tape`.
template <class T>
remat::Var<T> scalar_loss(remat::Tape<T>& tape, const remat::Var<T>& out, std::uint64_t seed) {
  return remat::sum(out * leaf(tape, loss_weights<T>(out.shape(), seed), out.shape(), /*variable=*/false));
}

}  // namespace remat_test
