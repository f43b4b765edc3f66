// concat: tensors joined along one dimension (torch.cat), as a tree of records of at most three inputs each.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "remat/detail/shape_ops.hpp"

namespace remat {
namespace detail {

/// What concat's and stack's records share: up to max_inputs parts joined along dimension `dim` of the output.
/// An input is either already of the output's rank ("joined": concat's parts, and stack's partial results) or, for
/// stack, one dimension short ("leaf", bit k of `leaves`): it fills one slot of dimension `dim`. Along that
/// dimension each input takes a block of numel / outer contiguous elements in each of the `outer` blocks of the
/// output (outer: the product of the dimensions before `dim`), so forward and backward copy blocks, in order.
struct JoinOp : OpBase {
  static constexpr OpKind kind = OpKind::data_movement;
  struct Params {
    int dim = 0;     ///< as the caller gave it (negative counts from the end of the output's dimensions)
    int arity = 2;   ///< inputs of this record
    int leaves = 0;  ///< bit k: input k is one dimension short (a part of stack)
  };
  static unsigned reads(GradInputs) { return reads_nothing; }
  /// The output's shape; throws shape_error or index_error naming `op`.
  static Shape joined_shape(const char* op, const Shape* in, const Params& p) {
    const bool leaf0 = p.leaves & 1;
    const int rank = in[0].rank() + (leaf0 ? 1 : 0);
    if (rank == 0)
      throw shape_error(std::string(op) + ": part 0 is a scalar; " + op +
                        " joins tensors of rank 1 or more (stack joins scalars, or unsqueeze them first)");
    if (rank > Shape::max_rank)
      throw shape_error(std::string(op) + ": stacking parts of rank " + std::to_string(rank - 1) + " (" +
                        to_string(in[0]) + ") makes " + std::to_string(rank) +
                        " dimensions, more than a remat shape holds");
    const int d = wrap_dim(p.dim, rank, op);
    // No allocation: a tree of records is recorded after reserving its room (join), and must not throw halfway.
    Shape out = leaf0 ? insert_dim(in[0], d, 1) : in[0];
    for (int k = 1; k < p.arity; ++k) {
      const bool leaf = (p.leaves >> k) & 1;
      const Shape s = leaf && in[k].rank() + 1 == rank ? insert_dim(in[k], d, 1) : in[k];
      bool same = s.rank() == rank;
      for (int e = 0; same && e < rank; ++e) same = e == d || s[e] == out[e];
      if (!same)
        throw shape_error(std::string(op) + ": " + to_string(in[k]) + " and " + to_string(in[0]) +
                          " cannot be joined along dim " + std::to_string(p.dim) +
                          "; the parts need the same shape but in that dimension");
      if (__builtin_add_overflow(out[d], s[d], &out[d]))
        throw shape_error(std::string(op) + ": the parts have more elements along dim " + std::to_string(p.dim) +
                          " together than an Index holds");
    }
    return out;
  }
  /// The product of the output's dimensions before the joined one.
  static Index outer(const Shape& out, const Params& p) { return out.numel(0, wrap_dim(p.dim, out.rank(), "")); }
  template <class T>
  static void forward(const ForwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const Index blocks = outer(c.out_shape(), p), out_block = c.out_shape().numel() / blocks;
    T* y = c.out().data();
    Index offset = 0;
    for (int k = 0; k < p.arity; ++k) {
      const Index block = c.in_shape(k).numel() / blocks;
      const T* x = c.in(k).data();
      for (Index o = 0; o < blocks; ++o) std::copy_n(x + o * block, block, y + o * out_block + offset);
      offset += block;
    }
  }
  template <class T>
  static void backward(const BackwardContext<T>& c) {
    const auto p = params_of<Params>(c);
    const Index blocks = outer(c.out_shape(), p), out_block = c.out_shape().numel() / blocks;
    const T* g = c.grad_out().data();
    Index offset = 0;
    for (int k = 0; k < p.arity; ++k) {
      const Index block = c.in_shape(k).numel() / blocks;
      if (c.wants_grad(k)) {
        GradTarget<T> d = c.grad_target(k);
        for (Index o = 0; o < blocks; ++o)
          copy_or_add(g + o * out_block + offset, d.map.data() + o * block, block, d.accumulate);
      }
      offset += block;
    }
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

struct ConcatOp : JoinOp {
  static constexpr const char* name = "concat";
  static Shape output_shape(const Shape* in, const Params& p) { return joined_shape(name, in, p); }
};

/// The output shapes of a join's records, in order: on the stack for up to 16 records (joins of up to about 32
/// parts, so that recording them allocates nothing), on the heap beyond.
class JoinShapes {
 public:
  void push_back(const Shape& s) {
    if (n_ < local_size) {
      local_[n_] = s;
    } else {
      if (n_ == local_size) heap_.assign(local_, local_ + local_size);
      heap_.push_back(s);
    }
    ++n_;
  }
  const Shape& back() const { return data()[n_ - 1]; }
  const Shape* data() const { return n_ <= local_size ? local_ : heap_.data(); }
  std::size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  static constexpr std::size_t local_size = 16;
  Shape local_[local_size];
  std::vector<Shape> heap_;
  std::size_t n_ = 0;
};

/// Joins parts [begin, end) as a tree of records of at most max_inputs inputs: `record(params, inputs…)` records
/// one, `shape(params, shapes)` is its output shape. Appends each record's output shape to `shapes` when
/// `shapes_only` (records nothing then).
template <class Op, class T>
struct JoinTree {
  const std::vector<Var<T>>& parts;
  int dim;
  bool stack;  ///< the parts are leaves (one dimension short of the output)

  /// The output shape of the tree over [begin, end), appending every record's shape to `shapes`.
  Shape shapes(std::size_t begin, std::size_t end, JoinShapes& shapes_out) const {
    if (end - begin == 1 && !stack) return parts[begin].shape();
    Shape in[max_inputs];
    JoinOp::Params p = node(begin, end);
    std::size_t from = begin;
    for (int k = 0; k < p.arity; ++k) {
      const std::size_t to = split(begin, end, k);
      in[k] = (p.leaves >> k) & 1 ? parts[from].shape() : shapes(from, to, shapes_out);
      from = to;
    }
    shapes_out.push_back(Op::output_shape(in, p));
    return shapes_out.back();
  }

  Var<T> record(std::size_t begin, std::size_t end) const {
    if (end - begin == 1 && !stack) return parts[begin];
    const JoinOp::Params p = node(begin, end);
    Var<T> in[max_inputs];  // no allocation between the records
    std::size_t from = begin;
    for (int k = 0; k < p.arity; ++k) {
      const std::size_t to = split(begin, end, k);
      in[k] = (p.leaves >> k) & 1 ? parts[from] : record(from, to);
      from = to;
    }
    switch (p.arity) {
      case 1:
        return apply_op<Op>(p, in[0]);
      case 2:
        return apply_op<Op>(p, in[0], in[1]);
      default:
        return apply_op<Op>(p, in[0], in[1], in[2]);
    }
  }

 private:
  /// The record over [begin, end): up to three children, each a leaf (stack's part) or a subtree.
  JoinOp::Params node(std::size_t begin, std::size_t end) const {
    const std::size_t n = end - begin;
    JoinOp::Params p;
    p.dim = dim;
    p.arity = static_cast<int>(std::min<std::size_t>(n, max_inputs));
    p.leaves = 0;
    if (stack)
      for (int k = 0; k < p.arity; ++k)
        if (split(begin, end, k) - (k == 0 ? begin : split(begin, end, k - 1)) == 1) p.leaves |= 1 << k;
    return p;
  }
  /// The end of child k of [begin, end): the range split into min(n, 3) parts as equal as possible.
  static std::size_t split(std::size_t begin, std::size_t end, int k) {
    const std::size_t n = end - begin, children = std::min<std::size_t>(n, max_inputs);
    std::size_t to = begin;
    for (int i = 0; i <= k; ++i) to += n / children + (static_cast<std::size_t>(i) < n % children ? 1 : 0);
    return to;
  }
};

/// Checks every part before anything is recorded (a bad part must not leave records before it on the tape), makes
/// room for every record of the tree, and records it, with the op recipe only (check_input, same_tape,
/// reserve_records: remat/op.hpp). `stack`: the parts are stacked along a new dimension.
template <class Op, class T>
Var<T> join(const char* op, const std::vector<Var<T>>& parts, int dim, bool stack) {
  if (parts.empty()) throw shape_error(std::string(op) + ": no parts; pass at least one");
  const Shape first = parts[0].shape(op);
  const int rank = first.rank() + (stack ? 1 : 0);
  if (rank == 0)
    throw shape_error(std::string(op) + ": part 0 is a scalar; " + op +
                      " joins tensors of rank 1 or more (stack joins scalars, or unsqueeze them first)");
  if (rank > Shape::max_rank)
    throw shape_error(std::string(op) + ": stacking parts of rank " + std::to_string(first.rank()) + " (" +
                      to_string(first) + ") makes " + std::to_string(rank) +
                      " dimensions, more than a remat shape holds");
  const int d = wrap_dim(dim, rank, op);
  Index total = 0;  // along d
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Shape s = parts[i].shape(op);
    if (!same_tape(parts[i], parts[0]))
      throw tape_error(std::string(op) + ": part " + std::to_string(i) + " belongs to another tape than part 0");
    bool same = s.rank() == first.rank();
    for (int e = 0; same && e < s.rank(); ++e) same = s[e] == first[e] || (!stack && e == d);
    if (!same)
      throw shape_error(
          std::string(op) + ": part " + std::to_string(i) + " is " + to_string(s) + " but part 0 is " +
          to_string(first) +
          (stack ? "; stack needs parts of one shape"
                 : "; concat needs parts of one rank and the same sizes but in dim " + std::to_string(dim)));
    if (__builtin_add_overflow(total, stack ? Index{1} : s[d], &total))
      throw shape_error(std::string(op) + ": parts 0 to " + std::to_string(i) + " have more elements along dim " +
                        std::to_string(dim) + " together than an Index holds");
    remat::check_input(op, parts[i]);
  }
  Shape whole = first;
  if (stack)
    whole = insert_dim(first, d, total);
  else
    whole[d] = total;
  // The whole result must be a valid tensor: every partial one of the tree is then valid too, so no record of it
  // throws a shape_error after the first was recorded.
  if (!valid_output_shape<T>(whole))
    throw shape_error(std::string(op) + ": the parts make a " + to_string(whole) +
                      " tensor, more than the 2^48 bytes a tensor may have");
  const JoinTree<Op, T> tree{parts, dim, stack};
  JoinShapes shapes;
  tree.shapes(0, parts.size(), shapes);
  // Room for every record of the tree first: a std::bad_alloc must not leave the records made before it.
  if (!shapes.empty()) remat::reserve_records(op, parts[0], shapes.data(), shapes.size());
  return tree.record(0, parts.size());
}

}  // namespace detail

/// torch.cat: the parts joined along dimension `dim` (negative counts from the end), in order. Each part: the same
/// rank (at least 1) and the same sizes in every dimension but dim → that shape with dim the sum of theirs; each
/// part's gradient is its block of dy along dim. Records a tree of joins of at most three parts each (⌈log₃ k⌉
/// levels for k parts; intermediates no backward reads are freed at once); one part is returned as it is. Throws
/// shape_error naming concat for no parts, a scalar part, parts of other ranks or sizes (naming the part and both
/// shapes), or more than 2^48 bytes in all; index_error for a dim out of range; tape_error for an empty or stale
/// part or parts of different tapes; stale_value_error for a modified Parameter; std::bad_alloc: all before
/// recording anything, so the tape is unchanged then. A policy that throws on one of the records leaves the
/// records before it on the tape.
template <class T>
Var<T> concat(const std::vector<Var<T>>& parts, int dim) {
  return detail::join<detail::ConcatOp>(detail::ConcatOp::name, parts, dim, false);
}

/// concat({a, b, …}, dim).
template <class T>
Var<T> concat(std::initializer_list<Var<T>> parts, int dim) {
  return concat(std::vector<Var<T>>(parts), dim);
}

}  // namespace remat

REMAT_OP_KERNELS(remat::detail::ConcatOp)
