// Random programs of checkpoint regions, and the Recorder that records them on a tape while it describes
// each node for the oracle (oracle.hpp). Shared by random_graph_test.cpp (checkpointed gradients against
// the plain run and finite differences) and oracle_property_test.cpp (saved and replayed bytes and ops
// against the oracle).
//
// A Program is a list of Steps on a scope of values: mixed ops with broadcasting, matmul, linear,
// multi-layer stacks, layer_norm, cross_entropy, softmax, dropout, checkpoint_name, constants recorded
// inside regions; the transformer ops (transpose, reshape, slice_cols, concat_cols, embedding, sum_cols,
// mean_cols, max_rows, detach, attention unfused and fused, causal or not); leaves that are constants, tape
// variables or remat::Parameters; regions nested up to three deep, with every library policy and random
// custom ones, one or two arguments, one or two outputs. A third of the seeds (Generator::nd_program) draw N-D
// programs: the same plus leaves of rank 1, 3 and 4 with size-1 dims, NumPy broadcasting between any ranks, batched
// and vector matmul, sum/mean/max over dims with keepdim, softmax and log_softmax over any dim, permute, reshape,
// layer_norm over trailing dims, linear on N-D x; the other seeds draw the 2-D programs they always drew.
// Generator draws one from a seed; Executor records it on a Recorder; Run records it on a tape of its own.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "oracle.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace random_program {

using remat::Matrix;
using remat::OpInfo;
using remat::Parameter;
using remat::Shape;
using remat::Tape;
using remat::Var;

// ---------------------------------------------------------------------------------------------------
// Policies, described by the test. The oracle side evaluates them here (checkpointing.md §4), from what the test
// knows of each op; the tape side gets a callable (the library's policy where it exists).

/// Spec checkpointing.md §4's OpKind, from the op name (the test's own table, not remat's; data_movement is
/// documented in remat/op_info.hpp).
enum class Kind { dot, elementwise, reduction, normalization, loss, random, identity, data_movement };
inline Kind kind_of(const std::string& op) {
  if (op == "matmul" || op == "linear" || op == "attention_scores" || op == "attention_values" ||
      op == "scaled_dot_product_attention")
    return Kind::dot;
  if (op == "sum" || op == "mean" || op == "sum_rows" || op == "sum_cols" || op == "mean_cols" || op == "max_rows" ||
      op == "max")
    return Kind::reduction;
  if (op == "embedding" || op == "slice_cols" || op == "concat_cols" || op == "transpose" || op == "reshape" ||
      op == "detach" || op == "permute")
    return Kind::data_movement;
  if (op == "softmax" || op == "log_softmax" || op == "layer_norm") return Kind::normalization;
  if (op == "cross_entropy" || op == "mse_loss") return Kind::loss;
  if (op == "dropout") return Kind::random;
  if (op == "checkpoint_name") return Kind::identity;
  return Kind::elementwise;
}
inline Kind kind_of(remat::OpKind k) {
  switch (k) {
    case remat::OpKind::dot:
      return Kind::dot;
    case remat::OpKind::reduction:
      return Kind::reduction;
    case remat::OpKind::normalization:
      return Kind::normalization;
    case remat::OpKind::loss:
      return Kind::loss;
    case remat::OpKind::random:
      return Kind::random;
    case remat::OpKind::identity:
      return Kind::identity;
    case remat::OpKind::data_movement:
      return Kind::data_movement;
    default:
      return Kind::elementwise;
  }
}

/// Whether a dot has batch dimensions (dot_general's sense, checkpointing.md §4): the attention products
/// are one product per (sequence, head); a matmul has them when an operand has more than two dimensions (its
/// dims before the last two are batch dimensions, torch.matmul's rule; `batched` says so); linear has none.
inline bool batch_dims_of(const std::string& op, bool batched = false) {
  return op == "attention_scores" || op == "attention_values" || op == "scaled_dot_product_attention" ||
         (op == "matmul" && batched);
}

/// What a policy may look at: name, kind, batch dimensions, tag, output shape (all its dims), bytes.
struct OpView {
  std::string name;
  Kind kind = Kind::elementwise;
  bool batch_dims = false;
  std::string tag;
  std::vector<long> shape;
  std::size_t bytes = 0;
};
inline std::vector<long> dims_of(const Shape& s) {
  return std::vector<long>(s.begin(), s.end());
}
inline OpView view_of(const OpInfo& op) {
  return {std::string(op.name), kind_of(op.kind), op.batch_dims, std::string(op.tag), dims_of(op.shape), op.bytes};
}

enum class PolicyKind {
  nothing,             // nothing_saveable
  everything,          // everything_saveable
  dots,                // dots_saveable
  dots_no_batch_dims,  // dots_with_no_batch_dims_saveable
  only_names,          // save_only_these_names(names)
  any_names_but,       // save_any_names_but_these(names), JAX semantics
  anything_except,     // save_anything_except_these_names(names)
  both,                // save_from_both_policies(dots_saveable, save_only_these_names(names))
  random_calls,        // custom, stateful: a coin per call from its own generator (asked once per op)
  random_hash,         // custom: a coin from a hash of (seed, name, tag, shape)
  rule,                // custom: normalization, or more than 12 scalars, or tanh
};
constexpr int policy_kinds = 11;

struct PolicySpec {
  PolicyKind kind = PolicyKind::nothing;
  std::vector<std::string> names;
  std::uint64_t seed = 0;
};

inline std::string to_string(const PolicySpec& p) {
  static const char* const names[] = {"nothing_saveable",
                                      "everything_saveable",
                                      "dots_saveable",
                                      "dots_with_no_batch_dims_saveable",
                                      "save_only_these_names",
                                      "save_any_names_but_these",
                                      "save_anything_except_these_names",
                                      "save_from_both_policies(dots_saveable, save_only_these_names)",
                                      "custom random per call",
                                      "custom random hash",
                                      "custom rule"};
  std::string s = names[static_cast<int>(p.kind)];
  if (!p.names.empty()) {
    s += " {";
    for (std::size_t k = 0; k < p.names.size(); ++k) s += (k ? "," : "") + p.names[k];
    s += "}";
  }
  if (p.kind == PolicyKind::random_calls || p.kind == PolicyKind::random_hash) s += " seed " + std::to_string(p.seed);
  return s;
}

inline bool listed(const std::vector<std::string>& names, const std::string& tag) {
  for (const auto& n : names)
    if (n == tag) return true;
  return false;
}

// The custom policies, shared by both sides (they are the test's own code, not a library decision).
inline bool hash_coin(std::uint64_t seed, const OpView& op) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ seed;
  auto mix = [&](std::uint64_t x) {
    h ^= x;
    h *= 0x100000001b3ULL;
  };
  for (char c : op.name) mix(static_cast<unsigned char>(c));
  for (char c : op.tag) mix(static_cast<unsigned char>(c));
  if (op.shape.size() == 2) {  // rows and columns, as before N-D shapes (the 2-D programs' decisions unchanged)
    mix(static_cast<std::uint64_t>(op.shape[0]));
    mix(static_cast<std::uint64_t>(op.shape[1]));
  } else {  // every dimension, and the rank: a policy that saw only the matrix view would decide otherwise
    mix(0x5eed0000ULL + op.shape.size());
    for (long d : op.shape) mix(static_cast<std::uint64_t>(d));
  }
  h ^= h >> 29;
  return ((h * 0xbf58476d1ce4e5b9ULL) >> 63) != 0;
}
template <class T>
bool rule_policy(const OpView& op) {
  return op.kind == Kind::normalization || op.bytes > 12 * sizeof(T) || op.name == "tanh";
}

/// Oracle side: checkpointing.md §4, evaluated from the test's knowledge of the op. `calls` is this region
/// call's own generator for the stateful custom policy.
template <class T>
bool spec_policy_saves(const PolicySpec& p, const OpView& op, std::mt19937_64& calls) {
  const bool named = !op.tag.empty();
  switch (p.kind) {
    case PolicyKind::nothing:
      return false;
    case PolicyKind::everything:
      return true;
    case PolicyKind::dots:
      return op.kind == Kind::dot;
    // Spec checkpointing.md §4: kind == dot && !batch_dims; the attention products have batch dimensions
    // (batch_dims_of), so this policy drops them where dots_saveable keeps them.
    case PolicyKind::dots_no_batch_dims:
      return op.kind == Kind::dot && !op.batch_dims;
    case PolicyKind::only_names:
      return named && listed(p.names, op.tag);
    case PolicyKind::any_names_but:
      return named && !listed(p.names, op.tag);
    case PolicyKind::anything_except:
      return !(named && listed(p.names, op.tag));
    case PolicyKind::both:
      return op.kind == Kind::dot || (named && listed(p.names, op.tag));
    case PolicyKind::random_calls:
      return (calls() & 1) != 0;
    case PolicyKind::random_hash:
      return hash_coin(p.seed, op);
    case PolicyKind::rule:
      return rule_policy<T>(op);
  }
  return false;
}

/// Tape side: the callable handed to remat::checkpoint.
template <class T>
std::function<bool(const OpInfo&)> library_policy(const PolicySpec& p) {
  using namespace remat::policies;
  switch (p.kind) {
    case PolicyKind::nothing:
      return nothing_saveable;
    case PolicyKind::everything:
      return everything_saveable;
    case PolicyKind::dots:
      return dots_saveable;
    case PolicyKind::dots_no_batch_dims:
      return dots_with_no_batch_dims_saveable;
    case PolicyKind::only_names:
      return save_only_these_names(p.names);
    case PolicyKind::any_names_but:
      return save_any_names_but_these(p.names);
    case PolicyKind::anything_except:
      return save_anything_except_these_names(p.names);
    case PolicyKind::both:
      return save_from_both_policies(dots_saveable, save_only_these_names(p.names));
    case PolicyKind::random_calls: {
      auto generator = std::make_shared<std::mt19937_64>(p.seed);
      return [generator](const OpInfo&) { return ((*generator)() & 1) != 0; };
    }
    case PolicyKind::random_hash:
      return [seed = p.seed](const OpInfo& op) { return hash_coin(seed, view_of(op)); };
    case PolicyKind::rule:
      return [](const OpInfo& op) { return rule_policy<T>(view_of(op)); };
  }
  return nothing_saveable;
}

// ---------------------------------------------------------------------------------------------------
// Shape rules, the test's own (NumPy broadcasting, torch.matmul), on remat::Shape as a list of dims.

/// The product of the dims (1 for rank 0; 0 for Shape{}, the [0,0] "none").
inline remat::Index elements(const Shape& s) {
  remat::Index n = 1;
  for (remat::Index d : s) n *= d;
  return n;
}
/// NumPy broadcasting: aligned at the last dim, the shorter padded with 1s in front, each pair equal or 1.
inline bool broadcastable_nd(const Shape& a, const Shape& b) {
  for (int k = 1; k <= std::min(a.rank(), b.rank()); ++k) {
    const remat::Index x = a[a.rank() - k], y = b[b.rank() - k];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}
inline Shape broadcast_shape(const Shape& a, const Shape& b) {
  const int rank = std::max(a.rank(), b.rank());
  std::vector<remat::Index> out(static_cast<std::size_t>(rank));
  for (int k = 1; k <= rank; ++k) {
    const remat::Index x = k <= a.rank() ? a[a.rank() - k] : 1, y = k <= b.rank() ? b[b.rank() - k] : 1;
    out[static_cast<std::size_t>(rank - k)] = std::max(x, y);
  }
  return Shape(out);
}
/// torch.matmul's result, or Shape{} ([0,0]) where it refuses: a [k] vector is [1,k] on the left and [k,1] on the
/// right, the added dim removed from the result; dims before the last two broadcast.
inline Shape matmul_shape(const Shape& a, const Shape& b) {
  if (a.rank() == 0 || b.rank() == 0) return Shape{};
  const remat::Index m = a.rank() == 1 ? 1 : a[a.rank() - 2], k = a[a.rank() - 1];
  const remat::Index kb = b.rank() == 1 ? b[0] : b[b.rank() - 2], n = b.rank() == 1 ? 1 : b[b.rank() - 1];
  if (k != kb) return Shape{};
  const Shape a_batch(std::vector<remat::Index>(a.begin(), a.end() - std::min(a.rank(), 2)));
  const Shape b_batch(std::vector<remat::Index>(b.begin(), b.end() - std::min(b.rank(), 2)));
  if (!broadcastable_nd(a_batch, b_batch)) return Shape{};
  std::vector<remat::Index> out = broadcast_shape(a_batch, b_batch).dims();
  if (a.rank() > 1) out.push_back(m);
  if (b.rank() > 1) out.push_back(n);
  return Shape(out);
}

// ---------------------------------------------------------------------------------------------------
// Recorder: records ops on a tape through remat's public API and, next to it, describes each node for the
// oracle (its op name, inputs, shapes, leaf kind, region and the policy decisions). Shapes are inferred here
// from the op, not read from the tape (a mismatch is reported: it would mean the test's model of an op is
// wrong).

template <class T>
class Recorder {
 public:
  struct Value {
    Var<T> var;
    int id = -1;
    Shape shape;
  };

  /// `checkpoint` false: regions run their body inline (the reference run without checkpoint). `describe`
  /// false: `graph` stays empty (faster, for runs that only want values and gradients).
  Recorder(Tape<T>& tape, bool checkpoint, bool describe = true)
      : tape_(tape), checkpoint_(checkpoint), describe_(describe) {
    graph.scalar_bytes = sizeof(T);
  }

  remat_oracle::Graph graph;
  int body_calls = 0;  // how many times region bodies ran (with checkpoint: the checkpointed functions)
  // How often a dots_with_no_batch_dims_saveable region was asked about a dot with batch dimensions (where
  // it and dots_saveable decide differently): the property test's coverage of that decision.
  int batch_dot_decisions = 0;

  /// Finite differences of a program with detach (random_graph_test's gradcheck): stop_gradient is
  /// differentiated as if detach(x) were the constant x has at the point checked, so a run on perturbed
  /// inputs must see that constant, not x + h. With `frozen` set, a run on variables records each detach
  /// and keeps its value; a run with `replay` records those values, in order, as constants instead.
  struct FrozenDetach {
    std::vector<Matrix<T>> values;
    std::size_t next = 0;
    bool replay = false;
  };
  FrozenDetach* frozen = nullptr;

  Value constant(const Matrix<T>& m) {
    return leaf(remat_oracle::Leaf::constant, tape_.constant(m), Shape{m.rows(), m.cols()});
  }
  Value variable(const Matrix<T>& m) {
    return leaf(remat_oracle::Leaf::variable, tape_.variable(m), Shape{m.rows(), m.cols()});
  }
  /// N-D leaves: `m` holds shape's elements row-major (its matrix view); rank 2 takes the matrix path above.
  Value constant(const Shape& shape, const Matrix<T>& m) {
    if (shape.rank() == 2) return constant(m);
    return leaf(remat_oracle::Leaf::constant, tape_.constant(shape, m.data()), shape);
  }
  Value variable(const Shape& shape, const Matrix<T>& m) {
    if (shape.rank() == 2) return variable(m);
    return leaf(remat_oracle::Leaf::variable, tape_.variable(shape, m.data()), shape);
  }
  /// `shape`: the shape the test made the Parameter with (not read from the tape).
  Value parameter(Parameter<T>& p, const Shape& shape) {
    return leaf(remat_oracle::Leaf::parameter, tape_.variable(p), shape);
  }
  Value parameter(Parameter<T>& p) { return parameter(p, Shape{p.value().rows(), p.value().cols()}); }
  /// A leaf made by someone else on this tape (gradcheck's variables and constants), of `shape`.
  Value input(Var<T> v, const Shape& shape) {
    const auto kind = v.is_variable() ? remat_oracle::Leaf::variable : remat_oracle::Leaf::constant;
    return leaf(kind, std::move(v), shape);
  }

  // One-input elementwise ops: same shape.
  Value tanh(const Value& a) { return op("tanh", {&a}, a.shape, {}, "", remat::tanh(a.var)); }
  Value sigmoid(const Value& a) { return op("sigmoid", {&a}, a.shape, {}, "", remat::sigmoid(a.var)); }
  Value exp(const Value& a) { return op("exp", {&a}, a.shape, {}, "", remat::exp(a.var)); }
  Value log(const Value& a) { return op("log", {&a}, a.shape, {}, "", remat::log(a.var)); }
  Value sqrt(const Value& a) { return op("sqrt", {&a}, a.shape, {}, "", remat::sqrt(a.var)); }
  Value sin(const Value& a) { return op("sin", {&a}, a.shape, {}, "", remat::sin(a.var)); }
  Value cos(const Value& a) { return op("cos", {&a}, a.shape, {}, "", remat::cos(a.var)); }
  Value gelu(const Value& a) { return op("gelu", {&a}, a.shape, {}, "", remat::gelu(a.var)); }
  Value softplus(const Value& a) { return op("softplus", {&a}, a.shape, {}, "", remat::softplus(a.var)); }
  Value relu(const Value& a) { return op("relu", {&a}, a.shape, {}, "", remat::relu(a.var)); }
  Value abs(const Value& a) { return op("abs", {&a}, a.shape, {}, "", remat::abs(a.var)); }
  Value square(const Value& a) { return op("square", {&a}, a.shape, {}, "", remat::square(a.var)); }
  Value neg(const Value& a) { return op("neg", {&a}, a.shape, {}, "", -a.var); }
  Value affine(const Value& a, double scale, double shift) {
    return op("affine", {&a}, a.shape, {}, "", remat::affine(a.var, scale, shift));
  }
  Value scalar_divide(double c, const Value& a) { return op("scalar_divide", {&a}, a.shape, {}, "", c / a.var); }
  Value pow(const Value& a, double p) { return op("pow", {&a}, a.shape, {}, "", remat::pow(a.var, p)); }
  // Broadcasting binaries.
  Value add(const Value& a, const Value& b) { return op("add", {&a, &b}, bcast(a, b), {}, "", a.var + b.var); }
  Value subtract(const Value& a, const Value& b) {
    return op("subtract", {&a, &b}, bcast(a, b), {}, "", a.var - b.var);
  }
  Value multiply(const Value& a, const Value& b) {
    return op("multiply", {&a, &b}, bcast(a, b), {}, "", a.var * b.var);
  }
  Value divide(const Value& a, const Value& b) { return op("divide", {&a, &b}, bcast(a, b), {}, "", a.var / b.var); }
  // Dots. matmul: torch.matmul (a vector promoted, batch dimensions broadcast), which has batch dimensions when
  // an operand has more than two dimensions; linear: x's last dimension becomes W's columns.
  Value matmul(const Value& a, const Value& b) {
    const bool batched = a.shape.rank() > 2 || b.shape.rank() > 2;
    return op("matmul", {&a, &b}, matmul_shape(a.shape, b.shape), {}, "", remat::matmul(a.var, b.var), batched);
  }
  Value linear(const Value& x, const Value& w, const Value& b) {
    Shape out = x.shape;
    out[out.rank() - 1] = w.shape[1];
    return op("linear", {&x, &w, &b}, out, {}, "", remat::linear(x.var, w.var, b.var));
  }
  // Normalizations, reductions, losses, random, identity.
  Value layer_norm(const Value& x, const Value& g, const Value& b) {
    return op("layer_norm", {&x, &g, &b}, x.shape, {elements(x.shape) / x.shape[x.shape.rank() - 1], 2}, "",
              remat::layer_norm(x.var, g.var, b.var));
  }
  /// layer_norm over x's trailing dims of g's shape (weight g, bias b); its extra holds (μ, 1/σ) per group.
  Value layer_norm_nd(const Value& x, const Value& g, const Value& b) {
    return op("layer_norm", {&x, &g, &b}, x.shape, {elements(x.shape) / elements(g.shape), 2}, "",
              remat::layer_norm(x.var, g.shape, g.var, b.var));
  }
  Value softmax(const Value& a) { return op("softmax", {&a}, a.shape, {}, "", remat::softmax(a.var)); }
  Value log_softmax(const Value& a) { return op("log_softmax", {&a}, a.shape, {}, "", remat::log_softmax(a.var)); }
  Value sum(const Value& a) { return op("sum", {&a}, {1, 1}, {}, "", remat::sum(a.var)); }
  /// sum (op 0), mean (1) or max (2) over `dims` (each in [0, rank)), keepdim or not (torch's semantics).
  Value reduce_dims(int which, const Value& a, const std::vector<int>& dims, bool keepdim) {
    std::vector<remat::Index> out;
    for (int d = 0; d < a.shape.rank(); ++d) {
      const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (!reduced) out.push_back(a.shape[d]);
      if (reduced && keepdim) out.push_back(1);
    }
    static const char* const names[] = {"sum", "mean", "max"};
    Var<T> y = which == 0   ? remat::sum(a.var, dims, keepdim)
               : which == 1 ? remat::mean(a.var, dims, keepdim)
                            : remat::max(a.var, dims, keepdim);
    return op(names[which], {&a}, Shape(out), {}, "", std::move(y));
  }
  Value softmax(const Value& a, int dim) { return op("softmax", {&a}, a.shape, {}, "", remat::softmax(a.var, dim)); }
  Value log_softmax(const Value& a, int dim) {
    return op("log_softmax", {&a}, a.shape, {}, "", remat::log_softmax(a.var, dim));
  }
  Value permute(const Value& a, const std::vector<int>& perm) {
    std::vector<remat::Index> out;
    for (int d : perm) out.push_back(a.shape[d]);
    return op("permute", {&a}, Shape(out), {}, "", remat::permute(a.var, perm));
  }
  Value reshape_nd(const Value& a, const Shape& to) {
    return op("reshape", {&a}, to, {}, "", remat::reshape(a.var, to.dims()));
  }
  Value mean(const Value& a) { return op("mean", {&a}, {1, 1}, {}, "", remat::mean(a.var)); }
  Value sum_rows(const Value& a) { return op("sum_rows", {&a}, {a.shape.rows(), 1}, {}, "", remat::sum_rows(a.var)); }
  Value dropout(const Value& a, double p) { return op("dropout", {&a}, a.shape, {}, "", remat::dropout(a.var, p)); }
  /// checkpoint_name: the value itself when the tape names it in place (an op's output no op has read yet, in
  /// the innermost open region: its policies are asked again with the name), else an identity op.
  Value name(const Value& a, const std::string& tag) {
    Var<T> v = remat::checkpoint_name(a.var, tag);
    if (!v.is_same(a.var)) return op("checkpoint_name", {&a}, a.shape, {}, tag, std::move(v));
    if (describe_) retag(a.id, tag);
    return {std::move(v), a.id, a.shape};
  }
  Value cross_entropy(const Value& a) {
    std::vector<int> labels;
    for (remat::Index i = 0; i < a.shape.rows(); ++i) labels.push_back(static_cast<int>((3 * i + 1) % a.shape.cols()));
    return op("cross_entropy", {&a}, {1, 1}, a.shape, "", remat::cross_entropy(a.var, labels));
  }
  Value mse_loss(const Value& a, const Value& b) {
    return op("mse_loss", {&a, &b}, {1, 1}, {}, "", remat::mse_loss(a.var, b.var));
  }
  // Data movement and column reductions (layout: docs/gpt.md).
  Value transpose(const Value& a) {
    return op("transpose", {&a}, {a.shape.cols(), a.shape.rows()}, {}, "", remat::transpose(a.var));
  }
  Value reshape(const Value& a, Shape to) {
    return op("reshape", {&a}, to, {}, "", remat::reshape(a.var, to.rows(), to.cols()));
  }
  Value slice_cols(const Value& a, remat::Index begin, remat::Index count) {
    return op("slice_cols", {&a}, {a.shape.rows(), count}, {}, "", remat::slice_cols(a.var, begin, count));
  }
  Value embedding(const Value& table, const std::vector<int>& ids) {
    return op("embedding", {&table}, {static_cast<remat::Index>(ids.size()), table.shape.cols()}, {}, "",
              remat::embedding(table.var, ids));
  }
  /// concat_cols of 2 or 3 parts: the header records a balanced tree of two-part concatenations; which
  /// side of an odd split is larger it does not say, so the left half is the first ⌊k/2⌋ parts, as in
  /// concat_range (for 3 parts: [a | [b | c]], the inner node first). Only the root's shape can be checked.
  Value concat_cols(const std::vector<Value>& parts) {
    std::vector<Var<T>> vars;
    for (const Value& v : parts) vars.push_back(v.var);
    Var<T> y = remat::concat_cols(vars);
    std::function<std::pair<int, Shape>(std::size_t, std::size_t)> tree = [&](std::size_t begin, std::size_t end) {
      if (end - begin == 1) return std::make_pair(parts[begin].id, parts[begin].shape);
      const std::size_t middle = begin + (end - begin) / 2;
      const auto left = tree(begin, middle);
      const auto right = tree(middle, end);
      const Shape shape{left.second.rows(), left.second.cols() + right.second.cols()};
      return std::make_pair(describe_op("concat_cols", {left.first, right.first}, shape, {}, ""), shape);
    };
    Shape shape{parts[0].shape.rows(), 0};
    for (const Value& v : parts) shape[1] += v.shape.cols();
    check_shape("concat_cols", shape, y);
    return {std::move(y), describe_ ? tree(0, parts.size()).first : -1, shape};
  }
  Value sum_cols(const Value& a) { return op("sum_cols", {&a}, {1, a.shape.cols()}, {}, "", remat::sum_cols(a.var)); }
  Value mean_cols(const Value& a) {
    return op("mean_cols", {&a}, {1, a.shape.cols()}, {}, "", remat::mean_cols(a.var));
  }
  Value max_rows(const Value& a) { return op("max_rows", {&a}, {a.shape.rows(), 1}, {}, "", remat::max_rows(a.var)); }
  Value detach(const Value& a) {
    if (frozen && frozen->replay) return constant(a.shape, frozen->values.at(frozen->next++));
    Value y = op("detach", {&a}, a.shape, {}, "", remat::detach(a.var));
    if (frozen) frozen->values.emplace_back(y.var.value());
    return y;
  }
  // Attention (q, k, v: [B·S, H], heads dividing H, S the sequence length dividing the rows).
  Value attention_scores(const Value& q, const Value& k, remat::Index heads, remat::Index seq_len, bool causal) {
    return op("attention_scores", {&q, &k}, {q.shape.rows() * heads, seq_len}, {}, "",
              remat::attention_scores(q.var, k.var, heads, seq_len, causal));
  }
  Value attention_values(const Value& p, const Value& v, remat::Index heads, remat::Index seq_len) {
    return op("attention_values", {&p, &v}, v.shape, {}, "", remat::attention_values(p.var, v.var, heads, seq_len));
  }
  /// Fused attention; its extra is the per-row log-sum-exp of the scores, [B·heads·S, 1].
  Value attention(const Value& q, const Value& k, const Value& v, remat::Index heads, remat::Index seq_len,
                  bool causal) {
    return op("scaled_dot_product_attention", {&q, &k, &v}, q.shape, {q.shape.rows() * heads, 1}, "",
              remat::scaled_dot_product_attention(q.var, k.var, v.var, heads, seq_len, causal));
  }

  /// A checkpoint region (or, without checkpoint, the body inline). `body` gets the argument Values (the
  /// Vars the checkpointed function received, with the ids of `args`) and returns `returns` (1 or 2)
  /// Values computed inside; args.size() is 1 or 2.
  std::vector<Value> region(const PolicySpec& policy, const std::vector<Value>& args, std::size_t returns,
                            const std::function<std::vector<Value>(const std::vector<Value>&)>& body) {
    if (!checkpoint_) {
      ++body_calls;
      return body(args);
    }
    const int id = static_cast<int>(graph.regions.size());
    if (describe_) {
      graph.regions.push_back({open_.empty() ? -1 : open_.back().region, {}, to_string(policy)});
      open_.push_back({id, policy, std::mt19937_64(policy.seed)});
    }
    std::vector<Value> inner;  // what body returned (ids inside the region)
    auto call = [&](std::vector<Var<T>> vars) {
      std::vector<Value> in = args;
      for (std::size_t k = 0; k < vars.size(); ++k) in[k].var = vars[k];
      ++body_calls;
      inner = body(in);
      if (inner.size() != returns) ADD_FAILURE() << "region body returned " << inner.size() << " values";
    };
    const auto lib = library_policy<T>(policy);
    std::vector<Var<T>> out;
    auto one = [&] { return inner[0].var; };
    auto two = [&] { return std::make_tuple(inner[0].var, inner[1].var); };
    if (args.size() == 1 && returns == 1) {
      out = {remat::checkpoint(
          [&](Var<T> x) {
            call({x});
            return one();
          },
          lib)(args[0].var)};
    } else if (args.size() == 1) {
      auto [p, q] = remat::checkpoint(
          [&](Var<T> x) {
            call({x});
            return two();
          },
          lib)(args[0].var);
      out = {p, q};
    } else if (returns == 1) {
      out = {remat::checkpoint(
          [&](Var<T> x, Var<T> y) {
            call({x, y});
            return one();
          },
          lib)(args[0].var, args[1].var)};
    } else {
      auto [p, q] = remat::checkpoint(
          [&](Var<T> x, Var<T> y) {
            call({x, y});
            return two();
          },
          lib)(args[0].var, args[1].var);
      out = {p, q};
    }
    std::vector<Value> results;
    for (std::size_t k = 0; k < out.size(); ++k) results.push_back({out[k], inner[k].id, inner[k].shape});
    if (describe_) {
      open_.pop_back();
      for (const Value& v : inner) graph.regions[static_cast<std::size_t>(id)].outputs.push_back(v.id);
    }
    return results;  // `inner` (handles to the same outputs) dies here
  }

 private:
  static Shape bcast(const Value& a, const Value& b) { return broadcast_shape(a.shape, b.shape); }

  Value leaf(remat_oracle::Leaf kind, Var<T> v, const Shape& shape) {
    check_shape("leaf", shape, v);
    if (!describe_) return {std::move(v), -1, shape};
    remat_oracle::Node n;
    n.leaf = kind;
    n.shape = dims_of(shape);
    n.region = open_.empty() ? -1 : open_.back().region;
    graph.nodes.push_back(n);
    batched_.push_back(false);
    return {std::move(v), static_cast<int>(graph.nodes.size()) - 1, shape};
  }

  static void check_shape(const char* name, Shape shape, const Var<T>& v) {
    if (v.shape() != shape)
      ADD_FAILURE() << name << ": the test expected " << remat::to_string(shape) << ", the tape recorded "
                    << remat::to_string(v.shape());
  }

  Value op(const char* name, std::initializer_list<const Value*> in, Shape shape, Shape extra, const std::string& tag,
           Var<T> v, bool batched = false) {
    check_shape(name, shape, v);
    if (!describe_) return {std::move(v), -1, shape};
    std::vector<int> inputs;
    for (const Value* x : in) inputs.push_back(x->id);
    return {std::move(v), describe_op(name, std::move(inputs), shape, extra, tag, batched), shape};
  }

  /// Describes an op node for the oracle (after the tape recorded it); returns its id. `extra` [0,0]: none.
  int describe_op(const char* name, std::vector<int> inputs, Shape shape, Shape extra, const std::string& tag,
                  bool batched = false) {
    remat_oracle::Node n;
    n.op = name;
    n.tag = tag;
    n.inputs = std::move(inputs);
    n.shape = dims_of(shape);
    if (elements(extra) > 0) n.extra = dims_of(extra);
    n.region = open_.empty() ? -1 : open_.back().region;
    // Spec §2.2: every enclosing region's policy is asked for the op (outermost first).
    const OpView view{name, kind_of(name), batch_dims_of(name, batched),
                      tag,  n.shape,       static_cast<std::size_t>(remat_oracle::numel(n.shape)) * sizeof(T)};
    for (auto& o : open_) {
      n.saved_by.push_back(spec_policy_saves<T>(o.policy, view, o.calls));
      if (view.kind == Kind::dot && view.batch_dims && o.policy.kind == PolicyKind::dots_no_batch_dims)
        ++batch_dot_decisions;
    }
    graph.nodes.push_back(std::move(n));
    batched_.push_back(batched);
    return static_cast<int>(graph.nodes.size()) - 1;
  }

  /// The oracle's side of naming in place: node `id` gets the tag, and the policy of every open region
  /// enclosing it is asked again (outermost first); closed regions keep their decisions. (The tape keeps a
  /// newly dropped value saved when an input of its op has gone; every Value here holds its handle, so none
  /// has.)
  void retag(int id, const std::string& tag) {
    remat_oracle::Node& n = graph.nodes[static_cast<std::size_t>(id)];
    n.tag = tag;
    const OpView view{n.op, kind_of(n.op), batch_dims_of(n.op, batched_[static_cast<std::size_t>(id)] != 0),
                      tag,  n.shape,       static_cast<std::size_t>(remat_oracle::numel(n.shape)) * sizeof(T)};
    for (auto& o : open_) {
      bool encloses = false;
      for (int q = n.region; q >= 0 && !encloses; q = graph.regions[static_cast<std::size_t>(q)].parent)
        encloses = q == o.region;
      if (!encloses) break;
      int depth = 1;
      for (int q = graph.regions[static_cast<std::size_t>(o.region)].parent; q >= 0;
           q = graph.regions[static_cast<std::size_t>(q)].parent)
        ++depth;
      n.saved_by[static_cast<std::size_t>(depth - 1)] = spec_policy_saves<T>(o.policy, view, o.calls);
    }
  }

  struct Open {
    int region;
    PolicySpec policy;
    std::mt19937_64 calls;
  };
  Tape<T>& tape_;
  bool checkpoint_, describe_;
  std::vector<Open> open_;
  std::vector<char> batched_;  // per graph node: a matmul with batch dimensions
};

// ---------------------------------------------------------------------------------------------------
// Random programs: steps on a scope of values, regions with bodies.

constexpr int max_depth = 3;

enum class StepKind {
  unary,
  binary,
  matmul,
  linear,
  layer,  // linear or matmul, then an activation (tanh, relu, gelu, sigmoid): two ops
  layer_norm,
  sum_rows,
  softmax,
  log_softmax,
  reduce,
  dropout,
  name,
  cross_entropy,
  mse_loss,
  transpose,
  reshape,  // to [cols, rows] or [1, size]
  slice_cols,
  concat,  // concat_cols of 2 or 3 parts (a, b and c) with the same rows
  embedding,
  reduce_cols,  // sum_cols or mean_cols
  max_rows,
  detach,
  attention,  // op 0: attention_values(softmax(attention_scores)); 1: the same with dropout on the
              // probabilities; 2: scaled_dot_product_attention (a = q, b = k, c = v)
  constant,
  region,
  // N-D programs only (unary, binary with broadcasting, matmul, layer, layer_norm, dropout and name take any rank
  // there too):
  reduce_dims,    // op 0 sum, 1 mean, 2 max over `dims`, `keepdim`
  softmax_dim,    // op 0 softmax, 1 log_softmax over `dim` (negative: from the end)
  permute,        // `dims` a permutation
  reshape_nd,     // to `to`
  layer_norm_nd,  // over a's trailing dims of b's shape, weight b, bias c
};
constexpr int unary_count = 19;
constexpr int binary_count = 4;

struct Step {
  StepKind kind = StepKind::unary;
  int op = 0;                           // which unary / binary / reduction / tag / activation
  int a = -1, b = -1, c = -1;           // operands (scope indices)
  Matrix<double> data;                  // constant
  Shape to;                             // reshape: the new shape
  remat::Index begin = 0, count = 0;    // slice_cols: the columns
  std::vector<int> ids;                 // embedding: the row ids
  remat::Index heads = 1, seq_len = 1;  // attention
  bool causal = false;                  // attention
  std::vector<int> args;                // region: scope indices passed as arguments (1 or 2)
  std::vector<Step> body;               // region: its steps
  std::vector<int> returns;             // region: body-scope indices returned (1 or 2)
  PolicySpec policy;                    // region
  bool stack = false;                   // region: its body is a stack of layers
  int depth = 0;
  std::vector<int> dims;  // reduce_dims: the dims; permute: the permutation
  int dim = 0;            // softmax_dim
  bool keepdim = false;   // reduce_dims
  Shape shape;            // constant: its shape (N-D programs; data holds its matrix view)
};

/// What the N-D programs must cover (Program::nd_features counts the steps drawn of each).
enum NdFeature {
  broadcast_ranks,    // a binary op on operands of different ranks
  broadcast_ones,     // a binary op stretching a size-1 dim of either operand, same rank, rank != 2
  batched_matmul,     // matmul with an operand of rank 3 or more
  vector_matmul,      // matmul with a rank-1 operand
  reduce_keepdim,     // sum, mean or max over dims with keepdim
  reduce_max,         // max over dims
  softmax_middle,     // softmax or log_softmax over a dim neither the first nor the last... of rank >= 3
  permute_nd,         // permute
  reshape_rank,       // a reshape changing the rank
  layer_norm_2_dims,  // layer_norm over the trailing two dims
  linear_nd,          // linear or matmul-layer on an N-D x (in a layer step)
  nd_feature_count
};
inline const char* const nd_feature_names[] = {"broadcast of different ranks",
                                               "broadcast of size-1 dims",
                                               "batched matmul",
                                               "matmul of a vector",
                                               "reduction with keepdim",
                                               "max over dims",
                                               "softmax over a middle dim",
                                               "permute",
                                               "reshape to another rank",
                                               "layer_norm over 2 dims",
                                               "linear on N-D x"};

struct LeafSpec {
  Shape shape;
  remat_oracle::Leaf kind = remat_oracle::Leaf::variable;
  Matrix<double> data;
};

struct Program {
  std::vector<LeafSpec> leaves;
  std::vector<Step> steps;
  std::vector<int> loss_terms;
  // Coverage counters.
  int regions = 0, deepest = 0, stacks = 0, tuple_regions = 0;
  std::vector<int> policies = std::vector<int>(policy_kinds, 0);
  bool nd = false;  // drawn with N-D leaves and ops (Generator::nd_program)
  std::vector<int> nd_features = std::vector<int>(nd_feature_count, 0);  // steps drawn of each NdFeature
};

inline bool broadcastable(const Shape& a, const Shape& b) {
  auto ok = [](remat::Index x, remat::Index y) { return x == y || x == 1 || y == 1; };
  return ok(a.rows(), b.rows()) && ok(a.cols(), b.cols());
}

inline const char* const tag_names[] = {"a", "b", "c"};

class Generator {
 public:
  /// `control`: every leaf a variable or Parameter, no constant recorded inside, every region
  /// everything_saveable. Then every input of every op requires grad, the spec's conditional reads are the
  /// unconditional ones, and nothing is replayed: the old and the new lifetime rules agree.
  explicit Generator(std::uint64_t seed, bool control = false)
      : random_(seed), control_(control), nd_(nd_program(seed)) {}

  /// Whether the program of `seed` is N-D: a third of the seeds, chosen from the seed alone, so that the other
  /// seeds draw exactly the 2-D programs they drew before N-D values existed. An N-D program has the 2-D
  /// leaves and ops too, plus leaves of rank 1, 3 and 4 (size-1 dims among them) and the N-D ops: unary and
  /// broadcasting binary ops on any rank, batched and vector matmul, sum/mean/max over dims with keepdim,
  /// softmax and log_softmax over any dim, permute, reshape, layer_norm over trailing dims, linear on N-D x.
  static bool nd_program(std::uint64_t seed) { return seed % 3 == 2; }

  Program generate() {
    Program p;
    program_ = &p;
    std::vector<Shape> shapes = {{3, 4}, {3, 2}, {1, 4}, {1, 2}, {3, 1}, {1, 1},
                                 {4, 2}, {2, 4}, {4, 4}, {2, 1}, {4, 4}, {1, 4}};
    p.nd = nd_;
    if (nd_)
      for (const Shape& s : {Shape{4}, Shape{2}, Shape{2, 3, 4}, Shape{2, 1, 4}, Shape{1, 3, 1}, Shape{2, 4, 2},
                             Shape{2, 1, 3, 4}, Shape{1, 2, 3, 1}, Shape{2, 3, 4}})
        shapes.push_back(s);
    bool any_grad = false;
    for (const Shape& s : shapes) {
      LeafSpec l;
      l.shape = s;
      const double r = random_.uniform();
      l.kind = r < 0.3 && !control_ ? remat_oracle::Leaf::constant
               : r < 0.65           ? remat_oracle::Leaf::variable
                                    : remat_oracle::Leaf::parameter;
      any_grad = any_grad || l.kind != remat_oracle::Leaf::constant;
      l.data = remat_test::random_matrix<double>(s.rows(), s.cols(), random_.bits(), remat_test::anywhere);
      p.leaves.push_back(std::move(l));
    }
    if (!any_grad) p.leaves[0].kind = remat_oracle::Leaf::variable;
    std::vector<Shape> scope = shapes;
    p.steps = body(scope, 0, 6 + random_.integer(14), p);
    p.loss_terms = {static_cast<int>(scope.size()) - 1, pick(scope), pick(scope)};
    program_ = nullptr;
    return p;
  }

 private:
  int pick(const std::vector<Shape>& scope) {
    const int n = static_cast<int>(scope.size());
    if (random_.uniform() < 0.6) return n - 1 - random_.integer(std::min(n, 3));
    return random_.integer(n);
  }
  /// A scope value of rank 2 that `ok` accepts (the 2-D ops' operands), -1 if none.
  int find(const std::vector<Shape>& scope, const std::function<bool(const Shape&)>& ok) {
    return find_any(scope, [&](const Shape& s) { return s.rank() == 2 && ok(s); });
  }
  /// A scope value of any rank that `ok` accepts, -1 if none.
  int find_any(const std::vector<Shape>& scope, const std::function<bool(const Shape&)>& ok) {
    std::vector<int> hits;
    for (int i = 0; i < static_cast<int>(scope.size()); ++i)
      if (ok(scope[static_cast<std::size_t>(i)])) hits.push_back(i);
    if (hits.empty()) return -1;
    return hits[static_cast<std::size_t>(random_.integer(static_cast<int>(hits.size())))];
  }

  std::vector<Step> body(std::vector<Shape>& scope, int depth, int length, Program& p) {
    std::vector<Step> steps;
    for (int i = 0; i < length; ++i) {
      if (depth < max_depth && random_.uniform() < 0.22) {
        steps.push_back(region(scope, depth, p));
        continue;
      }
      Step s = op(scope);
      s.depth = depth;
      steps.push_back(std::move(s));
    }
    return steps;
  }

  PolicySpec policy() {
    PolicySpec s;
    s.kind = control_ ? PolicyKind::everything : static_cast<PolicyKind>(random_.integer(policy_kinds));
    s.seed = random_.bits();
    switch (s.kind) {
      case PolicyKind::only_names:
        s.names = {"a", "c"};
        break;
      case PolicyKind::any_names_but:
        s.names = {"b"};
        break;
      case PolicyKind::anything_except:
        s.names = {"b"};
        break;
      case PolicyKind::both:
        s.names = {"b"};
        break;
      default:
        break;
    }
    return s;
  }

  Step region(std::vector<Shape>& scope, int depth, Program& p) {
    Step s;
    s.kind = StepKind::region;
    s.depth = depth;
    s.args.push_back(pick(scope));
    if (random_.uniform() < 0.4) s.args.push_back(pick(scope));
    s.policy = policy();
    ++p.policies[static_cast<std::size_t>(s.policy.kind)];
    p.deepest = std::max(p.deepest, depth + 1);
    std::vector<Shape> inner = scope;
    const std::size_t before = inner.size();
    if (random_.uniform() < 0.35) {  // a multi-layer region: 2-3 layers chained from the first argument
      int x = s.args[0];
      const int layers = 2 + random_.integer(2);
      for (int l = 0; l < layers; ++l) {
        Step layer_step;
        if (!layer(inner, x, layer_step)) break;
        layer_step.depth = depth + 1;
        s.body.push_back(std::move(layer_step));
        x = static_cast<int>(inner.size()) - 1;
      }
      if (static_cast<int>(inner.size() - before) >= 2) {
        s.stack = true;
        ++p.stacks;
      }
      if (random_.uniform() < 0.3) {  // and sometimes a nested region or an op after it
        std::vector<Step> more = body(inner, depth + 1, 1, p);
        for (auto& m : more) s.body.push_back(std::move(m));
      }
    } else {
      s.body = body(inner, depth + 1, 1 + random_.integer(6), p);
    }
    if (inner.size() == before) {  // a region records at least one op of its own
      Step extra = op(inner);
      extra.depth = depth + 1;
      s.body.push_back(std::move(extra));
    }
    const int own = static_cast<int>(inner.size() - before);
    s.returns.push_back(static_cast<int>(inner.size()) - 1);
    if (own > 1 && random_.uniform() < 0.4) s.returns.push_back(static_cast<int>(before) + random_.integer(own - 1));
    if (s.returns.size() > 1) ++p.tuple_regions;
    for (int r : s.returns) scope.push_back(inner[static_cast<std::size_t>(r)]);
    ++p.regions;
    return s;
  }

  /// A layer on scope value `x`: linear(x, W, b) (or matmul(x, W)) then an activation.
  bool layer(std::vector<Shape>& scope, int x, Step& s) {
    const Shape a = scope[static_cast<std::size_t>(x)];
    if (a.rank() == 0) return false;  // linear and matmul refuse scalars (only N-D programs have them)
    s.kind = StepKind::layer;
    s.a = x;
    s.b = find(scope, [&](const Shape& w) { return w.rows() == a.cols() && w.cols() <= 4; });
    if (s.b < 0) return false;
    const remat::Index n = scope[static_cast<std::size_t>(s.b)].cols();
    s.c = random_.uniform() < 0.25 ? -1 : find(scope, [&](const Shape& c) { return c.rows() == 1 && c.cols() == n; });
    s.op = random_.integer(4);
    Shape out = a;  // [..., k] -> [..., n]
    out[out.rank() - 1] = n;
    if (a.rank() != 2) ++program_->nd_features[linear_nd];
    scope.push_back(out);
    return true;
  }

  /// Divisors of n, one drawn uniformly.
  remat::Index divisor(remat::Index n) {
    std::vector<remat::Index> ds;
    for (remat::Index k = 1; k <= n; ++k)
      if (n % k == 0) ds.push_back(k);
    return ds[static_cast<std::size_t>(random_.integer(static_cast<int>(ds.size())))];
  }

  /// A transformer op on scope value s.a (a, of shape `a`): its output shape, or false when `a` does not
  /// fit the op drawn (the caller draws again). About a fifth of the ops; attention, which records 3 or 4
  /// ops, is the most frequent, as it carries the batch-dims decision.
  bool transformer_op(const std::vector<Shape>& scope, const Shape& a, Step& s, Shape& out) {
    const double r = random_.uniform();
    if (r < 0.10) {
      s.kind = StepKind::transpose;
      out = {a.cols(), a.rows()};
    } else if (r < 0.18) {
      s.kind = StepKind::reshape;
      s.to = random_.uniform() < 0.5 ? Shape{a.cols(), a.rows()} : Shape{1, a.numel()};
      out = s.to;
    } else if (r < 0.28) {
      if (a.cols() < 2) return false;
      s.kind = StepKind::slice_cols;
      s.count = 1 + random_.integer(static_cast<int>(a.cols()) - 1);  // a proper part of the columns
      s.begin = random_.integer(static_cast<int>(a.cols() - s.count) + 1);
      out = {a.rows(), s.count};
    } else if (r < 0.39) {
      s.kind = StepKind::concat;
      auto fits = [&](const Shape& b) { return b.rows() == a.rows() && a.cols() + b.cols() <= 8; };
      s.b = find(scope, fits);
      if (s.b < 0) return false;
      out = {a.rows(), a.cols() + scope[static_cast<std::size_t>(s.b)].cols()};
      if (random_.uniform() < 0.5) {
        s.c = find(scope, [&](const Shape& c) { return c.rows() == a.rows() && out.cols() + c.cols() <= 8; });
        if (s.c >= 0) out[1] += scope[static_cast<std::size_t>(s.c)].cols();
      }
    } else if (r < 0.49) {
      s.kind = StepKind::embedding;  // a is the [V,H] table; ids repeat (the scatter-add accumulates)
      const int n = 1 + random_.integer(4);
      for (int i = 0; i < n; ++i) s.ids.push_back(random_.integer(static_cast<int>(a.rows())));
      out = {n, a.cols()};
    } else if (r < 0.57) {
      s.kind = StepKind::reduce_cols;
      s.op = random_.integer(2);
      out = {1, a.cols()};
    } else if (r < 0.64) {
      s.kind = StepKind::max_rows;
      out = {a.rows(), 1};
    } else if (r < 0.72) {
      // Not in control graphs: what follows a detach requires no gradient, against their premise.
      if (control_) return false;
      s.kind = StepKind::detach;
    } else {
      // q = a, k and v of a's shape (a itself among them); heads divide the columns, S the rows.
      s.kind = StepKind::attention;
      s.op = random_.integer(3);
      s.b = find(scope, [&](const Shape& b) { return b == a; });
      s.c = find(scope, [&](const Shape& c) { return c == a; });
      s.heads = divisor(a.cols());
      s.seq_len = divisor(a.rows());
      s.causal = random_.uniform() < 0.5;
    }
    return true;
  }

  /// A random shape that broadcasts against `a`: a's trailing dims, each kept or made 1, a leading part dropped.
  Shape broadcasting_partner(const Shape& a) {
    std::vector<remat::Index> d;
    const int keep = a.rank() == 0 ? 0 : 1 + random_.integer(a.rank());
    for (int k = a.rank() - keep; k < a.rank(); ++k) d.push_back(random_.uniform() < 0.5 ? a[k] : 1);
    return Shape(d);
  }

  /// An N-D op on scope value s.a (of shape `a`): its output shape in `out`, or false when `a` does not fit the
  /// op drawn (the caller draws again). A constant recorded here is returned as a step of its own.
  bool nd_op(std::vector<Shape>& scope, const Shape& a, Step& s, Shape& out) {
    std::vector<int>& features = program_->nd_features;
    const int rank = a.rank();
    const double r = random_.uniform();
    out = a;
    if (r < 0.18) {
      s.kind = StepKind::unary;
      s.op = random_.integer(unary_count);
    } else if (r < 0.40) {
      s.kind = StepKind::binary;
      s.op = random_.integer(binary_count);
      s.b = find_any(scope, [&](const Shape& b) {
        return broadcastable_nd(a, b) && elements(broadcast_shape(a, b)) <= 96 && (a.rank() != 2 || b.rank() != 2);
      });
      if (s.b < 0 && control_) return false;
      if (s.b < 0 || (!control_ && random_.uniform() < 0.2)) {  // a constant recorded here, broadcast against a
        s = Step{};
        s.kind = StepKind::constant;
        s.shape = broadcasting_partner(a);
        s.data =
            remat_test::random_matrix<double>(s.shape.rows(), s.shape.cols(), random_.bits(), remat_test::anywhere);
        out = s.shape;
        return true;
      }
      const Shape& b = scope[static_cast<std::size_t>(s.b)];
      out = broadcast_shape(a, b);
      if (a.rank() != b.rank()) ++features[broadcast_ranks];
      bool ones = false;
      for (int k = 0; a.rank() == b.rank() && k < rank; ++k) ones = ones || a[k] != b[k];
      if (ones && rank != 2) ++features[broadcast_ones];
    } else if (r < 0.54) {
      s.kind = StepKind::matmul;
      s.b = find_any(scope, [&](const Shape& b) {
        const Shape o = matmul_shape(a, b);
        return (a.rank() != 2 || b.rank() != 2) && elements(o) > 0 && elements(o) <= 96;
      });
      if (s.b < 0) return false;
      const Shape& b = scope[static_cast<std::size_t>(s.b)];
      out = matmul_shape(a, b);
      if (a.rank() > 2 || b.rank() > 2) ++features[batched_matmul];
      if (a.rank() == 1 || b.rank() == 1) ++features[vector_matmul];
    } else if (r < 0.66) {
      if (rank == 0) return false;
      s.kind = StepKind::reduce_dims;
      s.op = random_.integer(3);
      for (int d = 0; d < rank; ++d)
        if (random_.uniform() < 0.5) s.dims.push_back(d);
      if (s.dims.empty()) s.dims.push_back(random_.integer(rank));
      s.keepdim = random_.uniform() < 0.5;
      std::vector<remat::Index> o;
      for (int d = 0; d < rank; ++d) {
        const bool reduced = std::find(s.dims.begin(), s.dims.end(), d) != s.dims.end();
        if (!reduced) o.push_back(a[d]);
        if (reduced && s.keepdim) o.push_back(1);
      }
      out = Shape(o);
      if (s.keepdim) ++features[reduce_keepdim];
      if (s.op == 2) ++features[reduce_max];
    } else if (r < 0.76) {
      if (rank == 0) return false;
      s.kind = StepKind::softmax_dim;
      s.op = random_.integer(2);
      s.dim = rank >= 2 && random_.uniform() < 0.75 ? random_.integer(rank - 1) : rank - 1;
      if (s.dim > 0 && s.dim < rank - 1) ++features[softmax_middle];
      if (random_.uniform() < 0.3) s.dim -= rank;  // the same dim counted from the end
    } else if (r < 0.84) {
      if (rank < 2) return false;
      s.kind = StepKind::permute;
      for (int d = 0; d < rank; ++d) s.dims.push_back(d);
      for (int d = rank - 1; d > 0; --d)
        std::swap(s.dims[static_cast<std::size_t>(d)], s.dims[static_cast<std::size_t>(random_.integer(d + 1))]);
      if (std::is_sorted(s.dims.begin(), s.dims.end())) std::swap(s.dims[0], s.dims[1]);
      std::vector<remat::Index> o;
      for (int d : s.dims) o.push_back(a[d]);
      out = Shape(o);
      ++features[permute_nd];
    } else if (r < 0.92) {
      if (rank == 0) return false;
      s.kind = StepKind::reshape_nd;
      std::vector<remat::Index> o = a.dims();
      const double how = random_.uniform();
      if (how < 0.4 && rank >= 2) {  // merge two adjacent dims
        const int d = random_.integer(rank - 1);
        o[static_cast<std::size_t>(d)] *= o[static_cast<std::size_t>(d) + 1];
        o.erase(o.begin() + d + 1);
      } else if (how < 0.8 && rank < 5) {  // insert a dim of 1
        o.insert(o.begin() + random_.integer(rank + 1), 1);
      } else {  // every element in one dim
        o = {elements(a)};
      }
      s.to = Shape(o);
      out = s.to;
      if (out.rank() != rank) ++features[reshape_rank];
    } else if (r < 0.96) {
      if (rank < 3) return false;
      if (random_.uniform() < 0.7) {  // over the trailing two dims, weight and bias of their shape
        const Shape trailing{a[rank - 2], a[rank - 1]};
        s.kind = StepKind::layer_norm_nd;
        s.b = find_any(scope, [&](const Shape& g) { return g == trailing; });
        s.c = find_any(scope, [&](const Shape& g) { return g == trailing; });
        if (s.b < 0 || s.c < 0) return false;
        ++features[layer_norm_2_dims];
      } else {  // over the last dim, gain and bias [1, n]
        if (a.cols() < 2) return false;
        s.kind = StepKind::layer_norm;
        s.b = find(scope, [&](const Shape& g) { return g.rows() == 1 && g.cols() == a.cols(); });
        s.c = find(scope, [&](const Shape& g) { return g.rows() == 1 && g.cols() == a.cols(); });
        if (s.b < 0 || s.c < 0) return false;
      }
    } else {
      const double which = random_.uniform();
      if (which < 0.4) {
        if (!layer(scope, s.a, s)) return false;
        out = scope.back();  // layer pushed it
        scope.pop_back();
      } else if (which < 0.7) {
        s.kind = StepKind::dropout;
      } else {
        s.kind = StepKind::name;
        s.op = random_.integer(3);
      }
    }
    return true;
  }

  Step op(std::vector<Shape>& scope) {
    for (;;) {
      Step s;
      s.a = pick(scope);
      const Shape a = scope[static_cast<std::size_t>(s.a)];
      Shape out = a;
      // N-D programs: an N-D op on a value of another rank than 2, and on a third of the matrices.
      if (nd_ && (a.rank() != 2 || random_.uniform() < 0.3)) {
        if (!nd_op(scope, a, s, out)) continue;
        scope.push_back(out);
        return s;
      }
      if (random_.uniform() < 0.2) {
        if (!transformer_op(scope, a, s, out)) continue;
        scope.push_back(out);
        return s;
      }
      const double r = random_.uniform();
      if (r < 0.30) {
        s.kind = StepKind::unary;
        s.op = random_.integer(unary_count);
      } else if (r < 0.48) {
        s.kind = StepKind::binary;
        s.op = random_.integer(binary_count);
        s.b = find(scope, [&](const Shape& b) { return broadcastable(a, b); });
        if (s.b < 0 && control_) continue;
        if (s.b < 0 || (!control_ && random_.uniform() < 0.15)) {  // a constant recorded here, broadcast against a
          Step c;
          c.kind = StepKind::constant;
          const Shape cs = random_.uniform() < 0.5 ? Shape{1, a.cols()} : Shape{a.rows(), 1};
          c.data = remat_test::random_matrix<double>(cs.rows(), cs.cols(), random_.bits(), remat_test::anywhere);
          scope.push_back(cs);
          return c;
        }
        out = {std::max(a.rows(), scope[static_cast<std::size_t>(s.b)].rows()),
               std::max(a.cols(), scope[static_cast<std::size_t>(s.b)].cols())};
      } else if (r < 0.58) {
        s.kind = StepKind::matmul;
        s.b = find(scope, [&](const Shape& b) { return b.rows() == a.cols() && b.cols() <= 4; });
        if (s.b < 0) continue;
        out = {a.rows(), scope[static_cast<std::size_t>(s.b)].cols()};
      } else if (r < 0.64) {
        s.kind = StepKind::linear;
        s.b = find(scope, [&](const Shape& b) { return b.rows() == a.cols() && b.cols() <= 4; });
        if (s.b < 0) continue;
        const remat::Index n = scope[static_cast<std::size_t>(s.b)].cols();
        s.c = find(scope, [&](const Shape& c) { return c.rows() == 1 && c.cols() == n; });
        if (s.c < 0) continue;
        out = {a.rows(), n};
      } else if (r < 0.70) {
        if (!layer(scope, s.a, s)) continue;
        return s;
      } else if (r < 0.75) {
        if (a.cols() < 2) continue;
        s.kind = StepKind::layer_norm;
        s.b = find(scope, [&](const Shape& g) { return g.rows() == 1 && g.cols() == a.cols(); });
        s.c = find(scope, [&](const Shape& g) { return g.rows() == 1 && g.cols() == a.cols(); });
        if (s.b < 0 || s.c < 0) continue;
      } else if (r < 0.78) {
        s.kind = StepKind::sum_rows;
        out = {a.rows(), 1};
      } else if (r < 0.81) {
        s.kind = StepKind::softmax;
      } else if (r < 0.84) {
        s.kind = StepKind::log_softmax;
      } else if (r < 0.87) {
        s.kind = StepKind::reduce;
        s.op = random_.integer(2);
        out = {1, 1};
      } else if (r < 0.91) {
        s.kind = StepKind::dropout;
      } else if (r < 0.96) {
        s.kind = StepKind::name;
        s.op = random_.integer(3);
      } else if (r < 0.98) {
        s.kind = StepKind::cross_entropy;
        out = {1, 1};
      } else {
        s.kind = StepKind::mse_loss;
        s.b = find(scope, [&](const Shape& b) { return b == a; });
        out = {1, 1};
      }
      scope.push_back(out);
      return s;
    }
  }

  remat_test::Random random_;
  bool control_;
  bool nd_;
  Program* program_ = nullptr;  // the program generate() is drawing (coverage counters)
};

/// Runs a Program on a Recorder.
template <class T>
class Executor {
 public:
  using Value = typename Recorder<T>::Value;
  Executor(const Program& program, Recorder<T>& rec) : program_(program), rec_(rec) {}

  /// Records the program on `leaves`; returns the loss. Every intermediate handle dies before it returns.
  Value run(const std::vector<Value>& leaves) {
    std::vector<Value> scope = leaves;
    body(program_.steps, scope);
    Value loss;
    for (std::size_t k = 0; k < program_.loss_terms.size(); ++k) {
      const Value& v = scope[static_cast<std::size_t>(program_.loss_terms[k])];
      Value term = k == 0 ? rec_.sum(v) : k == 1 ? rec_.mean(rec_.square(v)) : rec_.sum(rec_.tanh(v));
      loss = k == 0 ? term : rec_.add(loss, term);
    }
    return loss;
  }

 private:
  void body(const std::vector<Step>& steps, std::vector<Value>& scope) {
    for (const Step& s : steps) {
      if (s.kind == StepKind::region) {
        std::vector<Value> args;
        for (int a : s.args) args.push_back(scope[static_cast<std::size_t>(a)]);
        auto results = rec_.region(s.policy, args, s.returns.size(), [&](const std::vector<Value>& in) {
          // The body sees the enclosing scope (captures), the argument positions replaced by the Vars the
          // checkpointed function received.
          std::vector<Value> inner = scope;
          for (std::size_t k = 0; k < in.size(); ++k) inner[static_cast<std::size_t>(s.args[k])] = in[k];
          body(s.body, inner);
          std::vector<Value> out;
          for (int r : s.returns) out.push_back(inner[static_cast<std::size_t>(r)]);
          return out;
        });
        for (auto& r : results) scope.push_back(std::move(r));
      } else {
        scope.push_back(op(s, scope));
      }
    }
  }

  Value op(const Step& s, const std::vector<Value>& scope) {
    auto at = [&](int i) -> const Value& { return scope[static_cast<std::size_t>(i)]; };
    Recorder<T>& r = rec_;
    auto plus_one_square = [&](const Value& x) { return r.affine(r.square(x), 1.0, 1.0); };  // x² + 1 ≥ 1
    if (s.kind == StepKind::constant) return r.constant(s.shape, s.data.cast<T>());  // the 2-D ones: Shape{}, rank 2
    const Value& a = at(s.a);
    switch (s.kind) {
      case StepKind::unary:
        switch (s.op) {
          case 0:
            return r.tanh(a);
          case 1:
            return r.sigmoid(a);
          case 2:
            return r.exp(r.tanh(a));
          case 3:
            return r.log(plus_one_square(a));
          case 4:
            return r.sqrt(plus_one_square(a));
          case 5:
            return r.sin(a);
          case 6:
            return r.cos(a);
          case 7:
            return r.gelu(a);
          case 8:
            return r.softplus(a);
          case 9:
            return r.relu(a);
          case 10:
            return r.abs(a);
          case 11:
            return r.square(r.tanh(a));
          case 12:
            return r.neg(a);
          case 13:
            return r.affine(r.affine(a, 0.5, 0.0), 1.0, 0.25);
          case 14:
            return r.scalar_divide(1.0, plus_one_square(a));
          case 15:
            return r.pow(plus_one_square(a), 1.5);
          case 16:
            return r.affine(a, 2.0, 0.0);
          case 17:
            return r.affine(a, -1.0, 1.0);
          default:
            return r.affine(a, 0.5, 0.0);
        }
      case StepKind::binary:
        switch (s.op) {
          case 0:
            return r.add(a, at(s.b));
          case 1:
            return r.subtract(a, at(s.b));
          case 2:
            return r.multiply(a, at(s.b));
          default:
            return r.divide(a, plus_one_square(at(s.b)));
        }
      case StepKind::matmul:
        return r.matmul(a, at(s.b));
      case StepKind::linear:
        return r.linear(a, at(s.b), at(s.c));
      case StepKind::layer: {
        const Value z = s.c >= 0 ? r.linear(a, at(s.b), at(s.c)) : r.matmul(a, at(s.b));
        switch (s.op) {
          case 0:
            return r.tanh(z);
          case 1:
            return r.relu(z);
          case 2:
            return r.gelu(z);
          default:
            return r.sigmoid(z);
        }
      }
      case StepKind::layer_norm:
        return r.layer_norm(a, at(s.b), at(s.c));
      case StepKind::sum_rows:
        return r.sum_rows(a);
      case StepKind::softmax:
        return r.softmax(a);
      case StepKind::log_softmax:
        return r.log_softmax(a);
      case StepKind::reduce:
        return s.op == 0 ? r.sum(a) : r.mean(a);
      case StepKind::dropout:
        return r.dropout(a, 0.3);
      case StepKind::name:
        return r.name(a, tag_names[s.op]);
      case StepKind::cross_entropy:
        return r.cross_entropy(a);
      case StepKind::mse_loss:
        return r.mse_loss(a, at(s.b));
      case StepKind::transpose:
        return r.transpose(a);
      case StepKind::reshape:
        return r.reshape(a, s.to);
      case StepKind::slice_cols:
        return r.slice_cols(a, s.begin, s.count);
      case StepKind::concat:
        return s.c >= 0 ? r.concat_cols({a, at(s.b), at(s.c)}) : r.concat_cols({a, at(s.b)});
      case StepKind::embedding:
        return r.embedding(a, s.ids);
      case StepKind::reduce_cols:
        return s.op == 0 ? r.sum_cols(a) : r.mean_cols(a);
      case StepKind::max_rows:
        return r.max_rows(a);
      case StepKind::detach:
        return r.detach(a);
      case StepKind::reduce_dims:
        return r.reduce_dims(s.op, a, s.dims, s.keepdim);
      case StepKind::softmax_dim:
        return s.op == 0 ? r.softmax(a, s.dim) : r.log_softmax(a, s.dim);
      case StepKind::permute:
        return r.permute(a, s.dims);
      case StepKind::reshape_nd:
        return r.reshape_nd(a, s.to);
      case StepKind::layer_norm_nd:
        return r.layer_norm_nd(a, at(s.b), at(s.c));
      case StepKind::attention: {
        if (s.op == 2) return r.attention(a, at(s.b), at(s.c), s.heads, s.seq_len, s.causal);
        // One step, so the causal scores (−∞ above the diagonal) reach no op but the softmax.
        Value p = r.softmax(r.attention_scores(a, at(s.b), s.heads, s.seq_len, s.causal));
        if (s.op == 1) p = r.dropout(p, 0.3);
        return r.attention_values(p, at(s.c), s.heads, s.seq_len);
      }
      default:
        break;
    }
    ADD_FAILURE() << "unhandled step";
    return a;
  }

  const Program& program_;
  Recorder<T>& rec_;
};

// The program as text for a failure report.
inline const char* step_name(const Step& s) {
  static const char* const unary[] = {
      "tanh", "sigmoid",     "exp∘tanh", "log(x²+1)",  "sqrt(x²+1)", "sin",        "cos", "gelu", "softplus", "relu",
      "abs",  "square∘tanh", "neg",      "x*0.5+0.25", "1/(x²+1)",   "(x²+1)^1.5", "2x",  "1-x",  "x/2"};
  static const char* const binary[] = {"add", "subtract", "multiply", "a/(b²+1)"};
  static const char* const act[] = {"tanh", "relu", "gelu", "sigmoid"};
  switch (s.kind) {
    case StepKind::unary:
      return unary[s.op];
    case StepKind::binary:
      return binary[s.op];
    case StepKind::matmul:
      return "matmul";
    case StepKind::linear:
      return "linear";
    case StepKind::layer:
      return act[s.op];
    case StepKind::layer_norm:
      return "layer_norm";
    case StepKind::sum_rows:
      return "sum_rows";
    case StepKind::softmax:
      return "softmax";
    case StepKind::log_softmax:
      return "log_softmax";
    case StepKind::reduce:
      return s.op == 0 ? "sum" : "mean";
    case StepKind::dropout:
      return "dropout";
    case StepKind::name:
      return "checkpoint_name";
    case StepKind::cross_entropy:
      return "cross_entropy";
    case StepKind::mse_loss:
      return "mse_loss";
    case StepKind::transpose:
      return "transpose";
    case StepKind::reshape:
      return "reshape";
    case StepKind::slice_cols:
      return "slice_cols";
    case StepKind::concat:
      return "concat_cols";
    case StepKind::embedding:
      return "embedding";
    case StepKind::reduce_cols:
      return s.op == 0 ? "sum_cols" : "mean_cols";
    case StepKind::max_rows:
      return "max_rows";
    case StepKind::detach:
      return "detach";
    case StepKind::attention:
      return s.op == 0   ? "attention_values∘softmax∘attention_scores"
             : s.op == 1 ? "attention_values∘dropout∘softmax∘attention_scores"
                         : "scaled_dot_product_attention";
    case StepKind::constant:
      return "constant";
    case StepKind::region:
      return "region";
    case StepKind::reduce_dims:
      return s.op == 0 ? "sum" : s.op == 1 ? "mean" : "max";
    case StepKind::softmax_dim:
      return s.op == 0 ? "softmax" : "log_softmax";
    case StepKind::permute:
      return "permute";
    case StepKind::reshape_nd:
      return "reshape";
    case StepKind::layer_norm_nd:
      return "layer_norm(normalized_shape = b's shape)";
  }
  return "?";
}
/// A step's attributes, for the program's text.
inline std::string step_attributes(const Step& s) {
  auto list = [](const std::vector<int>& v) {
    std::string out = "{";
    for (std::size_t k = 0; k < v.size(); ++k) out += (k ? "," : "") + std::to_string(v[k]);
    return out + "}";
  };
  switch (s.kind) {
    case StepKind::reshape:
    case StepKind::reshape_nd:
      return " to " + remat::to_string(s.to);
    case StepKind::reduce_dims:
      return " dims " + list(s.dims) + (s.keepdim ? " keepdim" : "");
    case StepKind::softmax_dim:
      return " dim " + std::to_string(s.dim);
    case StepKind::permute:
      return " " + list(s.dims);
    case StepKind::constant:
      return s.shape.rank() == 2 && elements(s.shape) == 0 ? "" : " " + remat::to_string(s.shape);
    case StepKind::slice_cols:
      return " columns " + std::to_string(s.begin) + "+" + std::to_string(s.count);
    case StepKind::embedding: {
      std::string out = " ids";
      for (int i : s.ids) out += " " + std::to_string(i);
      return out;
    }
    case StepKind::attention:
      return " heads " + std::to_string(s.heads) + " S " + std::to_string(s.seq_len) + (s.causal ? " causal" : "");
    default:
      return "";
  }
}
inline void describe(const std::vector<Step>& steps, int& next, int indent, std::string& out) {
  const std::string pad(static_cast<std::size_t>(indent) * 2 + 2, ' ');
  for (const Step& s : steps) {
    if (s.kind == StepKind::region) {
      out += pad + "region [" + to_string(s.policy) + "]" + (s.stack ? " (layer stack)" : "") + " args";
      for (int a : s.args) out += " v" + std::to_string(a);
      out += " {\n";
      int inner = next;
      describe(s.body, inner, indent + 1, out);
      out += pad + "} returns";
      for (int r : s.returns) out += " v" + std::to_string(r) + "->v" + std::to_string(next++);
      out += "\n";
      continue;
    }
    out += pad + "v" + std::to_string(next++) + " = " + step_name(s);
    if (s.kind == StepKind::layer) out += s.c >= 0 ? "(linear" : "(matmul";
    out += "(";
    for (int o : {s.a, s.b, s.c})
      if (o >= 0) out += " v" + std::to_string(o);
    out += s.kind == StepKind::layer ? " ))" : " )";
    out += step_attributes(s) + "\n";
  }
}
inline std::string describe(const Program& p) {
  static const char* const kinds[] = {"op", "constant", "variable", "parameter"};
  std::string out = "  leaves:";
  for (std::size_t k = 0; k < p.leaves.size(); ++k)
    out += " v" + std::to_string(k) + "=" + kinds[static_cast<int>(p.leaves[k].kind)] +
           remat::to_string(p.leaves[k].shape);
  out += "\n";
  int next = static_cast<int>(p.leaves.size());
  describe(p.steps, next, 0, out);
  out += "  loss = sum(v" + std::to_string(p.loss_terms[0]) + ") + mean(square(v" + std::to_string(p.loss_terms[1]) +
         ")) + sum(tanh(v" + std::to_string(p.loss_terms[2]) + "))\n";
  return out;
}

/// A Parameter of `shape` holding `m`'s elements (row-major; rank 2: the matrix itself).
template <class T>
std::unique_ptr<Parameter<T>> make_parameter(const Shape& shape, const Matrix<T>& m) {
  auto of_rank = [&](auto rank) {
    constexpr int R = decltype(rank)::value;
    remat::Tensor<T, R> t;
    Eigen::array<Eigen::Index, R> dims;
    for (int d = 0; d < R; ++d) dims[static_cast<std::size_t>(d)] = shape[d];
    t.resize(dims);
    std::copy(m.data(), m.data() + m.size(), t.data());
    return std::make_unique<Parameter<T>>(t);
  };
  switch (shape.rank()) {
    case 1:
      return of_rank(std::integral_constant<int, 1>{});
    case 3:
      return of_rank(std::integral_constant<int, 3>{});
    case 4:
      return of_rank(std::integral_constant<int, 4>{});
    default:
      return std::make_unique<Parameter<T>>(m);
  }
}

/// Records leaf `l` on `rec` as its kind says (a Parameter is made in `parameters`, which must outlive the tape).
template <class T>
typename Recorder<T>::Value record_leaf(Recorder<T>& rec, const LeafSpec& l,
                                        std::vector<std::unique_ptr<Parameter<T>>>& parameters) {
  switch (l.kind) {
    case remat_oracle::Leaf::constant:
      return rec.constant(l.shape, l.data.cast<T>());
    case remat_oracle::Leaf::variable:
      return rec.variable(l.shape, l.data.cast<T>());
    default:
      parameters.push_back(make_parameter<T>(l.shape, l.data.cast<T>()));
      return rec.parameter(*parameters.back(), l.shape);
  }
}

/// A program recorded on a tape of its own, before any backward: its leaves in program order (constants,
/// tape variables, Parameters) and the loss; every other handle is released.
template <class T>
struct Run {
  using Value = typename Recorder<T>::Value;

  /// `checkpoint` false: the reference run, regions inline and no oracle graph (rec.graph stays empty).
  Run(const Program& program, std::uint64_t tape_seed, bool checkpoint)
      : tape(tape_seed), rec(tape, checkpoint, /*describe=*/checkpoint) {
    record(program);
  }
  /// The checkpointed program on a shapes-only tape (tests/tape/estimate_property_test.cpp), without an oracle graph.
  Run(const Program& program, std::uint64_t tape_seed, remat::ShapesOnly)
      : tape(remat::shapes_only, tape_seed), rec(tape, /*checkpoint=*/true, /*describe=*/false) {
    record(program);
  }
  /// The checkpointed program on a tape (shapes-only if `shapes`) under a memory budget set before recording
  /// (tests/budget/), without an oracle graph. What the recording throws (memory_budget_error) propagates.
  Run(const Program& program, std::uint64_t tape_seed, bool shapes, std::size_t budget, remat::EvictionHeuristic h)
      : tape(shapes ? Tape<T>(remat::shapes_only, tape_seed) : Tape<T>(tape_seed)),
        rec(tape, /*checkpoint=*/true, /*describe=*/false) {
    tape.set_memory_budget(budget, h);
    record(program);
  }
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  /// The leaves that receive a gradient (variables and Parameters), in program order.
  std::vector<Var<T>> differentiable() const {
    std::vector<Var<T>> out;
    for (const Value& l : leaves)
      if (l.var.is_variable()) out.push_back(l.var);
    return out;
  }

  std::vector<std::unique_ptr<Parameter<T>>> parameters;  // outlive the tape
  Tape<T> tape;
  Recorder<T> rec;
  std::vector<Value> leaves;
  Value loss;

 private:
  void record(const Program& program) {
    for (const LeafSpec& l : program.leaves) leaves.push_back(record_leaf(rec, l, parameters));
    loss = Executor<T>(program, rec).run(leaves);
    rec.graph.loss = loss.id;
  }
};

}  // namespace random_program
