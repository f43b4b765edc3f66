// The tape's saved and replayed sets against an independent oracle (oracle.hpp), which implements the
// lifetime rule of docs/design.md §2 and the JAX semantics of docs/checkpointing.md from the structure of
// each graph alone.
//
// Property test: random graphs (mixed ops with broadcasting, matmul, linear, multi-layer stacks,
// layer_norm, cross_entropy, softmax, dropout, checkpoint_name; constants, tape variables and
// remat::Parameter leaves, constant (frozen) weights; regions nested up to three deep, several per graph,
// with every library policy and random custom ones, one or two arguments, one or two outputs). Each graph
// is recorded on a tape while a Graph description is built next to it (op names, inputs, shapes, the
// policy decisions evaluated here from what the test knows of each op); every handle but the loss and the
// leaves is released; then saved_bytes after the forward pass and replayed_ops / replayed_bytes after
// backward must equal the oracle's, and the loss and gradients must be bitwise those of the same graph
// without checkpoint. Fixed seeds, float and double.
//
// Hand-counted cases at the end: expected numbers written by hand (arithmetic in the comments), checked
// against the tape AND against the oracle.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checkpoint_support.hpp"
#include "oracle.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace oracle_property_test {

using remat::Matrix;
using remat::OpInfo;
using remat::Parameter;
using remat::Shape;
using remat::Tape;
using remat::Var;

// ---------------------------------------------------------------------------------------------------
// Policies, described by the test. The oracle side evaluates them here (checkpointing.md §4), from what the test
// knows of each op; the tape side gets a callable (the library's policy where it exists).

/// Spec checkpointing.md §4's OpKind, from the op name (the test's own table, not remat's).
enum class Kind { dot, elementwise, reduction, normalization, loss, random, identity };
Kind kind_of(const std::string& op) {
  if (op == "matmul" || op == "linear") return Kind::dot;
  if (op == "sum" || op == "mean" || op == "sum_rows") return Kind::reduction;
  if (op == "softmax" || op == "log_softmax" || op == "layer_norm") return Kind::normalization;
  if (op == "cross_entropy" || op == "mse_loss") return Kind::loss;
  if (op == "dropout") return Kind::random;
  if (op == "checkpoint_name") return Kind::identity;
  return Kind::elementwise;
}
Kind kind_of(remat::OpKind k) {
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
    default:
      return Kind::elementwise;
  }
}

/// What a policy may look at: name, kind, tag, output shape, bytes.
struct OpView {
  std::string name;
  Kind kind = Kind::elementwise;
  std::string tag;
  long rows = 0, cols = 0;
  std::size_t bytes = 0;
};
OpView view_of(const OpInfo& op) {
  return {std::string(op.name),
          kind_of(op.kind),
          std::string(op.tag),
          static_cast<long>(op.shape.rows),
          static_cast<long>(op.shape.cols),
          op.bytes};
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

std::string to_string(const PolicySpec& p) {
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

bool listed(const std::vector<std::string>& names, const std::string& tag) {
  for (const auto& n : names)
    if (n == tag) return true;
  return false;
}

// The custom policies, shared by both sides (they are the test's own code, not a library decision).
bool hash_coin(std::uint64_t seed, const OpView& op) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ seed;
  auto mix = [&](std::uint64_t x) {
    h ^= x;
    h *= 0x100000001b3ULL;
  };
  for (char c : op.name) mix(static_cast<unsigned char>(c));
  for (char c : op.tag) mix(static_cast<unsigned char>(c));
  mix(static_cast<std::uint64_t>(op.rows));
  mix(static_cast<std::uint64_t>(op.cols));
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
  const bool named = op.name == "checkpoint_name";
  switch (p.kind) {
    case PolicyKind::nothing:
      return false;
    case PolicyKind::everything:
      return true;
    case PolicyKind::dots:
      return op.kind == Kind::dot;
    // Spec checkpointing.md §4: kind == dot && !batch_dims. Every remat op is 2-D, so no dot has batch dimensions
    // (dot_general's sense); the spec does not say which ops set batch_dims (see the report).
    case PolicyKind::dots_no_batch_dims:
      return op.kind == Kind::dot;
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

  /// `checkpoint` false: regions run their body inline (the reference run without checkpoint).
  Recorder(Tape<T>& tape, bool checkpoint) : tape_(tape), checkpoint_(checkpoint) { graph.scalar_bytes = sizeof(T); }

  remat_oracle::Graph graph;

  Value constant(const Matrix<T>& m) { return leaf(remat_oracle::Leaf::constant, tape_.constant(m)); }
  Value variable(const Matrix<T>& m) { return leaf(remat_oracle::Leaf::variable, tape_.variable(m)); }
  Value parameter(Parameter<T>& p) { return leaf(remat_oracle::Leaf::parameter, tape_.variable(p)); }

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
  // Dots.
  Value matmul(const Value& a, const Value& b) {
    return op("matmul", {&a, &b}, {a.shape.rows, b.shape.cols}, {}, "", remat::matmul(a.var, b.var));
  }
  Value linear(const Value& x, const Value& w, const Value& b) {
    return op("linear", {&x, &w, &b}, {x.shape.rows, w.shape.cols}, {}, "", remat::linear(x.var, w.var, b.var));
  }
  // Normalizations, reductions, losses, random, identity.
  Value layer_norm(const Value& x, const Value& g, const Value& b) {
    return op("layer_norm", {&x, &g, &b}, x.shape, {x.shape.rows, 2}, "", remat::layer_norm(x.var, g.var, b.var));
  }
  Value softmax(const Value& a) { return op("softmax", {&a}, a.shape, {}, "", remat::softmax(a.var)); }
  Value log_softmax(const Value& a) { return op("log_softmax", {&a}, a.shape, {}, "", remat::log_softmax(a.var)); }
  Value sum(const Value& a) { return op("sum", {&a}, {1, 1}, {}, "", remat::sum(a.var)); }
  Value mean(const Value& a) { return op("mean", {&a}, {1, 1}, {}, "", remat::mean(a.var)); }
  Value sum_rows(const Value& a) { return op("sum_rows", {&a}, {a.shape.rows, 1}, {}, "", remat::sum_rows(a.var)); }
  Value dropout(const Value& a, double p) { return op("dropout", {&a}, a.shape, {}, "", remat::dropout(a.var, p)); }
  Value name(const Value& a, const std::string& tag) {
    return op("checkpoint_name", {&a}, a.shape, {}, tag, remat::checkpoint_name(a.var, tag));
  }
  Value cross_entropy(const Value& a) {
    std::vector<int> labels;
    for (remat::Index i = 0; i < a.shape.rows; ++i) labels.push_back(static_cast<int>((3 * i + 1) % a.shape.cols));
    return op("cross_entropy", {&a}, {1, 1}, a.shape, "", remat::cross_entropy(a.var, labels));
  }
  Value mse_loss(const Value& a, const Value& b) {
    return op("mse_loss", {&a, &b}, {1, 1}, {}, "", remat::mse_loss(a.var, b.var));
  }

  /// A checkpoint region (or, without checkpoint, the body inline). `body` gets the argument Values (the
  /// Vars the checkpointed function received, with the ids of `args`) and returns `returns` (1 or 2)
  /// Values computed inside; args.size() is 1 or 2.
  std::vector<Value> region(const PolicySpec& policy, const std::vector<Value>& args, std::size_t returns,
                            const std::function<std::vector<Value>(const std::vector<Value>&)>& body) {
    if (!checkpoint_) return body(args);
    const int id = static_cast<int>(graph.regions.size());
    graph.regions.push_back({open_.empty() ? -1 : open_.back().region, {}, to_string(policy)});
    open_.push_back({id, policy, std::mt19937_64(policy.seed)});
    std::vector<Value> inner;  // what body returned (ids inside the region)
    auto call = [&](std::vector<Var<T>> vars) {
      std::vector<Value> in = args;
      for (std::size_t k = 0; k < vars.size(); ++k) in[k].var = vars[k];
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
    open_.pop_back();
    std::vector<Value> results;
    for (std::size_t k = 0; k < out.size(); ++k) {
      graph.regions[static_cast<std::size_t>(id)].outputs.push_back(inner[k].id);
      results.push_back({out[k], inner[k].id, inner[k].shape});
    }
    return results;  // `inner` (handles to the same outputs) dies here
  }

 private:
  static Shape bcast(const Value& a, const Value& b) {
    return {std::max(a.shape.rows, b.shape.rows), std::max(a.shape.cols, b.shape.cols)};
  }

  Value leaf(remat_oracle::Leaf kind, Var<T> v) {
    remat_oracle::Node n;
    n.leaf = kind;
    n.rows = static_cast<long>(v.rows());
    n.cols = static_cast<long>(v.cols());
    n.region = open_.empty() ? -1 : open_.back().region;
    graph.nodes.push_back(n);
    return {std::move(v), static_cast<int>(graph.nodes.size()) - 1, Shape{n.rows, n.cols}};
  }

  Value op(const char* name, std::initializer_list<const Value*> in, Shape shape, Shape extra, const std::string& tag,
           Var<T> v) {
    if (v.shape() != shape)
      ADD_FAILURE() << name << ": the test expected " << remat::to_string(shape) << ", the tape recorded "
                    << remat::to_string(v.shape());
    remat_oracle::Node n;
    n.op = name;
    n.tag = tag;
    for (const Value* x : in) n.inputs.push_back(x->id);
    n.rows = static_cast<long>(shape.rows);
    n.cols = static_cast<long>(shape.cols);
    n.extra_rows = static_cast<long>(extra.rows);
    n.extra_cols = static_cast<long>(extra.cols);
    n.region = open_.empty() ? -1 : open_.back().region;
    // Spec §2.2: every enclosing region's policy is asked for the op (outermost first).
    const OpView view{name, kind_of(name), tag, n.rows, n.cols, static_cast<std::size_t>(shape.size()) * sizeof(T)};
    for (auto& o : open_) n.saved_by.push_back(spec_policy_saves<T>(o.policy, view, o.calls));
    graph.nodes.push_back(std::move(n));
    return {std::move(v), static_cast<int>(graph.nodes.size()) - 1, shape};
  }

  struct Open {
    int region;
    PolicySpec policy;
    std::mt19937_64 calls;
  };
  Tape<T>& tape_;
  bool checkpoint_;
  std::vector<Open> open_;
};

// ---------------------------------------------------------------------------------------------------
// Random programs (adapted from random_graph_test.cpp): steps on a scope of values, regions with bodies.

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
  constant,
  region
};
constexpr int unary_count = 19;
constexpr int binary_count = 4;

struct Step {
  StepKind kind = StepKind::unary;
  int op = 0;                  // which unary / binary / reduction / tag / activation
  int a = -1, b = -1, c = -1;  // operands (scope indices)
  Matrix<double> data;         // constant
  std::vector<int> args;       // region: scope indices passed as arguments (1 or 2)
  std::vector<Step> body;      // region: its steps
  std::vector<int> returns;    // region: body-scope indices returned (1 or 2)
  PolicySpec policy;           // region
  bool stack = false;          // region: its body is a stack of layers
  int depth = 0;
};

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
};

bool broadcastable(const Shape& a, const Shape& b) {
  auto ok = [](remat::Index x, remat::Index y) { return x == y || x == 1 || y == 1; };
  return ok(a.rows, b.rows) && ok(a.cols, b.cols);
}

const char* const tag_names[] = {"a", "b", "c"};

class Generator {
 public:
  /// `control`: every leaf a variable or Parameter, no constant recorded inside, every region
  /// everything_saveable. Then every input of every op requires grad, the spec's conditional reads are the
  /// unconditional ones, and nothing is replayed: the old and the new lifetime rules agree.
  explicit Generator(std::uint64_t seed, bool control = false) : random_(seed), control_(control) {}

  Program generate() {
    Program p;
    const std::vector<Shape> shapes = {{3, 4}, {3, 2}, {1, 4}, {1, 2}, {3, 1}, {1, 1},
                                       {4, 2}, {2, 4}, {4, 4}, {2, 1}, {4, 4}, {1, 4}};
    bool any_grad = false;
    for (const Shape& s : shapes) {
      LeafSpec l;
      l.shape = s;
      const double r = random_.uniform();
      l.kind = r < 0.3 && !control_ ? remat_oracle::Leaf::constant
               : r < 0.65           ? remat_oracle::Leaf::variable
                                    : remat_oracle::Leaf::parameter;
      any_grad = any_grad || l.kind != remat_oracle::Leaf::constant;
      l.data = remat_test::random_matrix<double>(s.rows, s.cols, random_.bits(), remat_test::anywhere);
      p.leaves.push_back(std::move(l));
    }
    if (!any_grad) p.leaves[0].kind = remat_oracle::Leaf::variable;
    std::vector<Shape> scope = shapes;
    p.steps = body(scope, 0, 6 + random_.integer(14), p);
    p.loss_terms = {static_cast<int>(scope.size()) - 1, pick(scope), pick(scope)};
    return p;
  }

 private:
  int pick(const std::vector<Shape>& scope) {
    const int n = static_cast<int>(scope.size());
    if (random_.uniform() < 0.6) return n - 1 - random_.integer(std::min(n, 3));
    return random_.integer(n);
  }
  int find(const std::vector<Shape>& scope, const std::function<bool(const Shape&)>& ok) {
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
    s.kind = StepKind::layer;
    s.a = x;
    s.b = find(scope, [&](const Shape& w) { return w.rows == a.cols && w.cols <= 4; });
    if (s.b < 0) return false;
    const remat::Index n = scope[static_cast<std::size_t>(s.b)].cols;
    s.c = random_.uniform() < 0.25 ? -1 : find(scope, [&](const Shape& c) { return c.rows == 1 && c.cols == n; });
    s.op = random_.integer(4);
    scope.push_back({a.rows, n});
    return true;
  }

  Step op(std::vector<Shape>& scope) {
    for (;;) {
      Step s;
      s.a = pick(scope);
      const Shape a = scope[static_cast<std::size_t>(s.a)];
      const double r = random_.uniform();
      Shape out = a;
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
          const Shape cs = random_.uniform() < 0.5 ? Shape{1, a.cols} : Shape{a.rows, 1};
          c.data = remat_test::random_matrix<double>(cs.rows, cs.cols, random_.bits(), remat_test::anywhere);
          scope.push_back(cs);
          return c;
        }
        out = {std::max(a.rows, scope[static_cast<std::size_t>(s.b)].rows),
               std::max(a.cols, scope[static_cast<std::size_t>(s.b)].cols)};
      } else if (r < 0.58) {
        s.kind = StepKind::matmul;
        s.b = find(scope, [&](const Shape& b) { return b.rows == a.cols && b.cols <= 4; });
        if (s.b < 0) continue;
        out = {a.rows, scope[static_cast<std::size_t>(s.b)].cols};
      } else if (r < 0.64) {
        s.kind = StepKind::linear;
        s.b = find(scope, [&](const Shape& b) { return b.rows == a.cols && b.cols <= 4; });
        if (s.b < 0) continue;
        const remat::Index n = scope[static_cast<std::size_t>(s.b)].cols;
        s.c = find(scope, [&](const Shape& c) { return c.rows == 1 && c.cols == n; });
        if (s.c < 0) continue;
        out = {a.rows, n};
      } else if (r < 0.70) {
        if (!layer(scope, s.a, s)) continue;
        return s;
      } else if (r < 0.75) {
        if (a.cols < 2) continue;
        s.kind = StepKind::layer_norm;
        s.b = find(scope, [&](const Shape& g) { return g.rows == 1 && g.cols == a.cols; });
        s.c = find(scope, [&](const Shape& g) { return g.rows == 1 && g.cols == a.cols; });
        if (s.b < 0 || s.c < 0) continue;
      } else if (r < 0.78) {
        s.kind = StepKind::sum_rows;
        out = {a.rows, 1};
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
    if (s.kind == StepKind::constant) return r.constant(s.data.cast<T>());
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
const char* step_name(const Step& s) {
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
    case StepKind::constant:
      return "constant";
    case StepKind::region:
      return "region";
  }
  return "?";
}
void describe(const std::vector<Step>& steps, int& next, int indent, std::string& out) {
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
    out += s.kind == StepKind::layer ? " ))\n" : " )\n";
  }
}
std::string describe(const Program& p) {
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

// ---------------------------------------------------------------------------------------------------
// One graph: the tape's figures, the oracle's, and the bitwise comparison with the run without checkpoint.

struct Numbers {
  std::size_t saved = 0, ops = 0, bytes = 0;
  friend bool operator==(const Numbers& a, const Numbers& b) {
    return a.saved == b.saved && a.ops == b.ops && a.bytes == b.bytes;
  }
};
std::string to_string(const Numbers& n) {
  return "saved " + std::to_string(n.saved) + " B, replayed " + std::to_string(n.ops) + " ops / " +
         std::to_string(n.bytes) + " B";
}
void PrintTo(const Numbers& n, std::ostream* os) {
  *os << to_string(n);
}

template <class T>
struct Recording {
  Numbers tape;
  Matrix<T> loss;
  std::vector<Matrix<T>> grads;
  remat_oracle::Graph graph;
  std::string residuals;  // the tape's print_saved_residuals after the forward pass
};

template <class T>
Recording<T> run_program(const Program& program, std::uint64_t tape_seed, bool checkpoint) {
  Recording<T> out;
  std::vector<std::unique_ptr<Parameter<T>>> parameters;  // outlive the tape
  for (const LeafSpec& l : program.leaves)
    if (l.kind == remat_oracle::Leaf::parameter) parameters.push_back(std::make_unique<Parameter<T>>(l.data.cast<T>()));
  Tape<T> tape(tape_seed);
  Recorder<T> rec(tape, checkpoint);
  std::vector<typename Recorder<T>::Value> leaves;
  std::size_t next_parameter = 0;
  for (const LeafSpec& l : program.leaves) {
    switch (l.kind) {
      case remat_oracle::Leaf::constant:
        leaves.push_back(rec.constant(l.data.cast<T>()));
        break;
      case remat_oracle::Leaf::variable:
        leaves.push_back(rec.variable(l.data.cast<T>()));
        break;
      default:
        leaves.push_back(rec.parameter(*parameters[next_parameter++]));
        break;
    }
  }
  typename Recorder<T>::Value loss = Executor<T>(program, rec).run(leaves);  // only leaves and loss remain
  rec.graph.loss = loss.id;
  out.tape.saved = tape.memory().saved_bytes;
  if (checkpoint) {
    std::ostringstream os;
    tape.print_saved_residuals(os);
    out.residuals = os.str();
  }
  tape.backward(loss.var);
  out.tape.ops = tape.memory().replayed_ops;
  out.tape.bytes = tape.memory().replayed_bytes;
  out.loss = loss.var.value();
  for (std::size_t k = 0; k < leaves.size(); ++k)
    if (program.leaves[k].kind != remat_oracle::Leaf::constant) out.grads.emplace_back(leaves[k].var.grad());
  out.graph = std::move(rec.graph);
  return out;
}

Numbers oracle_numbers(const remat_oracle::Result& r) {
  return {r.saved_bytes, r.replayed_ops, r.replayed_bytes};
}

constexpr int graph_count = 1200;

/// How many detailed reports a failing run prints (REMAT_ORACLE_REPORTS overrides; the rest get one line).
int report_limit() {
  const char* s = std::getenv("REMAT_ORACLE_REPORTS");
  return s ? std::atoi(s) : 3;
}
/// REMAT_ORACLE_GRAPH=i runs graph i alone (to debug one graph; its report is printed in full).
int only_graph() {
  const char* s = std::getenv("REMAT_ORACLE_GRAPH");
  return s ? std::atoi(s) : -1;
}

template <class T>
class OracleGraphs : public ::testing::Test {};
TYPED_TEST_SUITE(OracleGraphs, checkpoint_test::Scalars);

/// Graphs on which the old and the new lifetime rules agree (Generator's `control`): passes on the tape
/// before the lifetime rewrite too, so it checks the test's model of each op (names, shapes, reads that do
/// not depend on requires-grad, region outputs) independently of what the rewrite changes.
TYPED_TEST(OracleGraphs, ControlGraphsWhereOldAndNewRulesAgree) {
  using T = TypeParam;
  int differ = 0;
  for (int i = 0; i < 300; ++i) {
    const Program program = Generator(90000 + static_cast<std::uint64_t>(i), /*control=*/true).generate();
    const Recording<T> ckpt = run_program<T>(program, 0xC0FFEE + static_cast<std::uint64_t>(i), true);
    const remat_oracle::Result expected = remat_oracle::compute(ckpt.graph);
    const Numbers oracle = oracle_numbers(expected);
    if (!(ckpt.tape == oracle) && differ++ < 3)
      ADD_FAILURE() << "control graph " << i << ": tape " << to_string(ckpt.tape) << "; oracle " << to_string(oracle)
                    << "\nprogram:\n"
                    << describe(program) << "oracle's view of the recorded graph:\n"
                    << remat_oracle::describe(ckpt.graph, expected) << "tape's residual report:\n"
                    << ckpt.residuals;
  }
  EXPECT_EQ(differ, 0);
}

TYPED_TEST(OracleGraphs, SavedAndReplayedEqualTheOracleAndGradientsAreBitwiseEqual) {
  using T = TypeParam;
  int differ = 0, reports = 0, threw = 0, gradient_failures = 0;
  const int limit = report_limit();
  Program coverage;
  int replaying_graphs = 0;
  const int only = only_graph();
  for (int i = 0; i < graph_count; ++i) {
    if (only >= 0 && i != only) continue;
    const Program program = Generator(7000 + static_cast<std::uint64_t>(i)).generate();
    coverage.regions += program.regions;
    coverage.deepest = std::max(coverage.deepest, program.deepest);
    coverage.stacks += program.stacks;
    coverage.tuple_regions += program.tuple_regions;
    for (int k = 0; k < policy_kinds; ++k)
      coverage.policies[static_cast<std::size_t>(k)] += program.policies[static_cast<std::size_t>(k)];
    const std::uint64_t tape_seed = 0xC0FFEE + static_cast<std::uint64_t>(i);
    try {
      const Recording<T> plain = run_program<T>(program, tape_seed, false);
      const Recording<T> ckpt = run_program<T>(program, tape_seed, true);
      const remat_oracle::Result expected = remat_oracle::compute(ckpt.graph);
      const Numbers oracle = oracle_numbers(expected);
      if (oracle.ops > 0) ++replaying_graphs;

      bool same_values =
          checkpoint_test::bitwise_equal(plain.loss, ckpt.loss) && plain.grads.size() == ckpt.grads.size();
      for (std::size_t k = 0; same_values && k < plain.grads.size(); ++k)
        same_values = checkpoint_test::bitwise_equal(plain.grads[k], ckpt.grads[k]);
      if (!same_values) {
        ++gradient_failures;
        ADD_FAILURE() << "graph " << i << ": loss or gradients differ from the run without checkpoint\n"
                      << describe(program);
      }
      if (!(ckpt.tape == oracle)) {
        ++differ;
        if (reports++ < limit)
          ADD_FAILURE() << "graph " << i << " (" << sizeof(T) * 8 << "-bit): tape " << to_string(ckpt.tape)
                        << "; oracle " << to_string(oracle) << "\nprogram:\n"
                        << describe(program) << "oracle's view of the recorded graph:\n"
                        << remat_oracle::describe(ckpt.graph, expected) << "tape's residual report:\n"
                        << ckpt.residuals;
        else if (reports <= limit + 40)
          std::cout << "[ differs  ] graph " << i << ": tape " << to_string(ckpt.tape) << "; oracle "
                    << to_string(oracle) << "\n";
      }
    } catch (const std::exception& e) {
      ++threw;
      ADD_FAILURE() << "graph " << i << " threw: " << e.what() << "\n" << describe(program);
    }
  }
  if (only >= 0) return;
  EXPECT_EQ(differ, 0) << differ << " of " << graph_count << " graphs differ from the oracle (" << threw << " threw, "
                       << gradient_failures << " with different gradients)";
  // The generator must cover what the test claims.
  EXPECT_GT(coverage.regions, 2 * graph_count);
  EXPECT_EQ(coverage.deepest, max_depth);
  EXPECT_GT(coverage.stacks, graph_count / 4);
  EXPECT_GT(coverage.tuple_regions, graph_count / 4);
  for (int k = 0; k < policy_kinds; ++k)
    EXPECT_GT(coverage.policies[static_cast<std::size_t>(k)], graph_count / 20) << k;
  EXPECT_GT(replaying_graphs, graph_count / 3);
  std::cout << "[ coverage ] " << coverage.regions << " regions (" << coverage.stacks << " layer stacks, "
            << coverage.tuple_regions << " with two outputs), " << replaying_graphs << " of " << graph_count
            << " graphs replay; " << differ << " differ from the oracle\n";
}

// ---------------------------------------------------------------------------------------------------
// Hand-counted cases. Expected numbers are written by hand (arithmetic in the comments, from the spec's
// sections); each case checks the tape and the oracle against them.

using F = float;
using Value = Recorder<F>::Value;
const PolicySpec nothing{PolicyKind::nothing, {}, 0};
const PolicySpec dots{PolicyKind::dots, {}, 0};
const PolicySpec everything{PolicyKind::everything, {}, 0};

/// Records `build` (which returns the loss; every other handle it makes dies with it), then measures the
/// tape and asks the oracle.
std::pair<Numbers, Numbers> measure(const std::function<Value(Recorder<F>&)>& build, std::string* report = nullptr) {
  Tape<F> tape;
  Recorder<F> rec(tape, true);
  Value loss = build(rec);
  rec.graph.loss = loss.id;
  Numbers t;
  t.saved = tape.memory().saved_bytes;
  std::ostringstream os;
  tape.print_saved_residuals(os);
  tape.backward(loss.var);
  t.ops = tape.memory().replayed_ops;
  t.bytes = tape.memory().replayed_bytes;
  const auto r = remat_oracle::compute(rec.graph);
  if (report) *report = remat_oracle::describe(rec.graph, r) + "tape's residual report:\n" + os.str();
  return {t, oracle_numbers(r)};
}

void expect_numbers(const std::function<Value(Recorder<F>&)>& build, Numbers hand) {
  std::string report;
  const auto [tape, oracle] = measure(build, &report);
  EXPECT_EQ(oracle, hand) << "ORACLE: " << to_string(oracle) << ", by hand: " << to_string(hand) << "\n" << report;
  EXPECT_EQ(tape, hand) << "TAPE: " << to_string(tape) << ", by hand: " << to_string(hand) << "\n" << report;
}

/// The spec's worked example: x constant [8,16] float (512 B), W1, W2 [16,16] and b1, b2 [1,16] Parameters
/// (0 B). One region: l1 = linear(x,W1,b1), t1 = tanh(l1), l2 = linear(t1,W2,b2), t2 = tanh(l2), returned.
/// loss = sum(t2) outside (sum reads nothing). Every value [8,16] = 512 B.
/// Backward reads (§2.1): linear1 reads x (r1: W1 requires grad), not W1 (x does not); tanh1 reads t1;
/// linear2 reads t1 (r1) and W2 (r0); tanh2 reads t2.
struct WorkedExample {
  Parameter<F> w1{checkpoint_test::random_matrix<F>(16, 16, 1, 0.3)}, b1{checkpoint_test::random_matrix<F>(1, 16, 2)};
  Parameter<F> w2{checkpoint_test::random_matrix<F>(16, 16, 3, 0.3)}, b2{checkpoint_test::random_matrix<F>(1, 16, 4)};
  Matrix<F> x = checkpoint_test::random_matrix<F>(8, 16, 5);
  std::function<Value(Recorder<F>&)> build(const PolicySpec& policy) {
    return [this, policy](Recorder<F>& r) {
      Value W1 = r.parameter(w1), B1 = r.parameter(b1), W2 = r.parameter(w2), B2 = r.parameter(b2);
      const auto out = r.region(policy, {r.constant(x)}, 1, [&](const std::vector<Value>& a) {
        return std::vector<Value>{r.tanh(r.linear(r.tanh(r.linear(a[0], W1, B1)), W2, B2))};
      });
      return r.sum(out[0]);
    };
  }
};

TEST(OracleHandCounted, WorkedExampleNothingSaveable) {
  // L: l1 = t1 = l2 = 1 (dropped), t2 = 0 (output). Level-1 targets: t1 (read by tanh1, linear2). Replay:
  // t1 <- l1 (L = 1, not a target: transient) <- x, W1, b1 (L = 0: sources). 2 ops, 512 + 512 = 1024 B.
  // Saved: x (512, read by linear1, source) + t2 (512, read by tanh2) + W1, b1 (Parameters, 0) = 1024 B.
  WorkedExample e;
  expect_numbers(e.build(nothing), {1024, 2, 1024});
}

TEST(OracleHandCounted, WorkedExampleDotsSaveable) {
  // L: l1 = l2 = 0 (dots saved), t1 = 1, t2 = 0. Level-1 targets: t1. Replay: t1 <- l1 (L = 0: source).
  // 1 op, 512 B. Saved: x (512) + l1 (512, source) + t2 (512) = 1536 B; l2 is read by nothing: not kept.
  WorkedExample e;
  expect_numbers(e.build(dots), {1536, 1, 512});
}

TEST(OracleHandCounted, WorkedExampleEverythingSaveable) {
  // Every L = 0. Saved: x (512) + t1 (512, tanh1 and linear2) + t2 (512) = 1536 B; l1, l2 read by nothing.
  // No region member: 0 ops.
  WorkedExample e;
  expect_numbers(e.build(everything), {1536, 0, 0});
}

/// Two levels: the worked example's two layers in an inner region S, inside an outer region R that returns
/// S's output. Same shapes and leaves as the worked example.
std::function<Value(Recorder<F>&)> nested(WorkedExample& e, const PolicySpec& outer, const PolicySpec& inner) {
  return [&e, outer, inner](Recorder<F>& r) {
    Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), W2 = r.parameter(e.w2), B2 = r.parameter(e.b2);
    const auto out = r.region(outer, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
      return r.region(inner, {a[0]}, 1, [&](const std::vector<Value>& b) {
        return std::vector<Value>{r.tanh(r.linear(r.tanh(r.linear(b[0], W1, B1)), W2, B2))};
      });
    });
    return r.sum(out[0]);
  };
}

TEST(OracleHandCounted, NestedSourceAtIntermediateLevel) {
  // R (depth 1) nothing_saveable around S (depth 2) dots_saveable. L: l1 = 1 (S saves it, R drops it),
  // t1 = 2 (both drop it), l2 = 1, t2 = 0 (returned by S and R).
  // S: level-2 target t1 (read by tanh1, linear2); t1 <- l1 with L(l1) = 1 < 2: a source, needed at level 1.
  //    S replays 1 op (tanh1), 512 B.
  // R: level-1 targets: l1 (§2.3, a source of S); l2 is read by nothing. l1 <- x, W1, b1 (L = 0).
  //    R replays 1 op (linear1), 512 B.
  // Saved: x (512) + t2 (512) = 1024 B. Replayed 2 ops / 1024 B.
  WorkedExample e;
  expect_numbers(nested(e, nothing, dots), {1024, 2, 1024});
}

TEST(OracleHandCounted, NestedDotsInsideEverything) {
  // R (depth 1) everything_saveable around S (depth 2) dots_saveable. L: l1 = 0, t1 = 2, l2 = 0, t2 = 0.
  // S: target t1; t1 <- l1 (L = 0: source, saved). 1 op, 512 B. R: no level-1 value, no replay.
  // Saved: x (512) + l1 (512) + t2 (512) = 1536 B. Replayed 1 op / 512 B.
  WorkedExample e;
  expect_numbers(nested(e, everything, dots), {1536, 1, 512});
}

TEST(OracleHandCounted, SaveOnlyTheseNames) {
  // One region, save_only_these_names({"h"}): l1 = linear(x,W1,b1), h = checkpoint_name(l1,"h"), t1 = tanh(h),
  // l2 = linear(t1,W2,b2), t2 = tanh(l2) returned. L: l1 = 1, h = 0 (named, listed), t1 = 1, l2 = 1, t2 = 0.
  // Targets: t1 (tanh1, linear2); t1 <- h (L = 0: source). 1 op (tanh1), 512 B.
  // Saved: x (512) + h (512, source) + t2 (512) = 1536 B.
  WorkedExample e;
  const PolicySpec only{PolicyKind::only_names, {"h"}, 0};
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), W2 = r.parameter(e.w2), B2 = r.parameter(e.b2);
        const auto out = r.region(only, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.tanh(r.linear(r.tanh(r.name(r.linear(a[0], W1, B1), "h")), W2, B2))};
        });
        return r.sum(out[0]);
      },
      {1536, 1, 512});
}

TEST(OracleHandCounted, SaveAnyNamesButThese) {
  // One region, save_any_names_but_these({"b"}) with JAX semantics (only named values not listed are saved):
  // l1 = linear(x,W1,b1), a = name(l1,"a"), t1 = tanh(a), b = name(t1,"b"), l2 = linear(b,W2,b2),
  // t2 = tanh(l2) returned. L: a = 0 (named, not listed), b = 1 (listed), l1 = t1 = l2 = 1 (unnamed), t2 = 0.
  // Reads: tanh1 reads t1; linear2 reads b (r1) and W2 (r0); tanh2 reads t2; the names read nothing.
  // Targets: t1, b. b <- t1 (a target: available); t1 <- a (L = 0: source). 2 ops (tanh1, name b), 1024 B.
  // Saved: x (512) + a (512, source) + t2 (512) = 1536 B.
  WorkedExample e;
  const PolicySpec but{PolicyKind::any_names_but, {"b"}, 0};
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), W2 = r.parameter(e.w2), B2 = r.parameter(e.b2);
        const auto out = r.region(but, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          const Value t1 = r.tanh(r.name(r.linear(a[0], W1, B1), "a"));
          return std::vector<Value>{r.tanh(r.linear(r.name(t1, "b"), W2, B2))};
        });
        return r.sum(out[0]);
      },
      {1536, 2, 1024});
}

TEST(OracleHandCounted, FrozenLayerWithoutCheckpoint) {
  // No region. l = linear(x, W1, b1) (x constant [8,16], W1, b1 Parameters), y = matmul(l, Wf) with Wf a
  // CONSTANT [16,16] (1024 B), loss = sum(y). matmul reads A = l only if B requires grad (it does not) and
  // B = Wf since A requires grad; linear reads x. Saved: x (512) + Wf (1024) = 1536 B; l is not kept.
  WorkedExample e;
  const Matrix<F> wf = checkpoint_test::random_matrix<F>(16, 16, 6, 0.3);
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1);
        return r.sum(r.matmul(r.linear(r.constant(e.x), W1, B1), r.constant(wf)));
      },
      {1536, 0, 0});
}

TEST(OracleHandCounted, FrozenLayerInNothingSaveableRegion) {
  // The same in one nothing_saveable region returning y: L(l) = 1, L(y) = 0. l is read by no backward, so the
  // region has no target and replays nothing. Saved: x (512, read by linear) + Wf (1024, read by matmul)
  // = 1536 B; y is read by nothing (sum reads nothing).
  WorkedExample e;
  const Matrix<F> wf = checkpoint_test::random_matrix<F>(16, 16, 6, 0.3);
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1), Wf = r.constant(wf);
        const auto out = r.region(nothing, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.matmul(r.linear(a[0], W1, B1), Wf)};
        });
        return r.sum(out[0]);
      },
      {1536, 0, 0});
}

TEST(OracleHandCounted, SingleLayerDotsSaveable) {
  // One layer in a dots_saveable region: l1 = linear(x,W1,b1) (L = 0), t1 = tanh(l1) returned (L = 0). No
  // level-1 value: nothing replays. Saved: x (512, read by linear1) + t1 (512, read by tanh1) = 1024 B.
  WorkedExample e;
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1);
        const auto out = r.region(dots, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.tanh(r.linear(a[0], W1, B1))};
        });
        return r.sum(out[0]);
      },
      {1024, 0, 0});
}

TEST(OracleHandCounted, SingleLayerNothingSaveable) {
  // One layer in a nothing_saveable region: l1 (L = 1), t1 returned (L = 0). l1 is read by no backward
  // (tanh reads its output): no target, no replay. Saved: x (512) + t1 (512) = 1024 B.
  WorkedExample e;
  expect_numbers(
      [&](Recorder<F>& r) {
        Value W1 = r.parameter(e.w1), B1 = r.parameter(e.b1);
        const auto out = r.region(nothing, {r.constant(e.x)}, 1, [&](const std::vector<Value>& a) {
          return std::vector<Value>{r.tanh(r.linear(a[0], W1, B1))};
        });
        return r.sum(out[0]);
      },
      {1024, 0, 0});
}

}  // namespace oracle_property_test
