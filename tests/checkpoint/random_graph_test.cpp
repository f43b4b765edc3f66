// Property test: random graphs of mixed ops (chains and DAGs with broadcasting, matmul, linear, layer_norm,
// softmax, dropout, reductions, checkpoint_name, constants recorded inside regions), with checkpoint regions
// at random places, nested up to three deep, each with a random policy (the library's and random custom
// ones), called with one or two Var arguments and returning one Var or a tuple of two.
//
// For every graph, in float and double: the loss and every gradient are bitwise equal to the same graph
// without checkpoint; each checkpointed function ran once per call; the replay count is at most one per
// op and enclosing region. On every fourth graph (double) the gradients are also within 1e-6 of central
// finite differences (tests/support/gradcheck.hpp). Fixed seeds; the whole test takes well under a second.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_support.hpp"
#include "gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace {

using checkpoint_test::BitwiseEqual;
using remat::Matrix;
using remat::OpInfo;
using remat::Shape;
using remat::Tape;
using remat::Var;

constexpr int graph_count = 200;
constexpr int max_depth = 3;

enum class Kind {
  unary,
  binary,
  matmul,
  linear,
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
constexpr int policy_count = 8;

/// One step of a program. Operands index the scope: the values visible where the step runs (the
/// program's inputs, then values computed before it; inside a region, the enclosing scope's values are
/// visible as captures, then the region's own values).
struct Step {
  Kind kind = Kind::unary;
  int op = 0;                  // which unary / binary / reduction / name
  int a = -1, b = -1, c = -1;  // operands
  Matrix<double> data;         // constant
  std::vector<int> args;       // region: scope indices passed as arguments (1 or 2)
  std::vector<Step> body;      // region: its steps
  std::vector<int> returns;    // region: body-scope indices returned (1 or 2)
  int policy = 0;              // region: which policy
  std::uint64_t policy_seed = 0;
  int depth = 0;  // nesting depth at which the step runs (0 = outside any region)
};

struct Program {
  std::vector<Shape> input_shapes;
  std::vector<Matrix<double>> inputs;
  std::vector<Step> steps;
  std::vector<int> loss_terms;   // top-level scope indices summed into the loss
  int regions = 0;               // region steps (each runs once per forward)
  std::size_t replay_limit = 0;  // Σ over recorded ops of the number of regions enclosing it
};

bool broadcastable(const Shape& a, const Shape& b) {
  auto ok = [](remat::Index x, remat::Index y) { return x == y || x == 1 || y == 1; };
  return ok(a.rows, b.rows) && ok(a.cols, b.cols);
}
Shape broadcast(const Shape& a, const Shape& b) {
  return {std::max(a.rows, b.rows), std::max(a.cols, b.cols)};
}

/// Number of primitive ops a step records (for the replay bound).
std::size_t recorded_ops(const Step& s) {
  switch (s.kind) {
    case Kind::unary:
      return (s.op == 2 || s.op == 11 || s.op == 13) ? 2 : (s.op == 3 || s.op == 4 || s.op == 14 || s.op == 15) ? 3 : 1;
    case Kind::binary:
      return s.op == 3 ? 3 : 1;
    case Kind::constant:
      return 0;
    case Kind::region:
      return 0;
    default:
      return 1;
  }
}

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : random_(seed) {}

  Program generate() {
    Program p;
    const std::vector<Shape> shapes = {{3, 4}, {3, 2}, {1, 4}, {1, 2}, {3, 1}, {1, 1}, {4, 2}, {2, 4}, {4, 4}, {2, 1}};
    for (const Shape& s : shapes) {
      p.input_shapes.push_back(s);
      p.inputs.push_back(remat_test::random_matrix<double>(s.rows, s.cols, random_.bits(), remat_test::anywhere));
    }
    std::vector<Shape> scope = shapes;
    const int length = 6 + random_.integer(14);
    p.steps = body(scope, 0, length, p);
    // Loss terms: the last value and two random others (some values stay unused: their regions must not
    // be replayed and their inputs get zero gradients).
    p.loss_terms = {static_cast<int>(scope.size()) - 1, pick(scope), pick(scope)};
    return p;
  }

 private:
  int pick(const std::vector<Shape>& scope) {
    // Prefer recent values (chains), sometimes reach back (DAGs).
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
      p.replay_limit += recorded_ops(s) * static_cast<std::size_t>(depth);
      steps.push_back(std::move(s));
    }
    return steps;
  }

  Step region(std::vector<Shape>& scope, int depth, Program& p) {
    Step s;
    s.kind = Kind::region;
    s.depth = depth;
    s.args.push_back(pick(scope));
    if (random_.uniform() < 0.4) s.args.push_back(pick(scope));
    s.policy = random_.integer(policy_count);
    s.policy_seed = random_.bits();
    std::vector<Shape> inner = scope;
    const std::size_t before = inner.size();
    s.body = body(inner, depth + 1, 1 + random_.integer(6), p);
    if (inner.size() == before) {  // a region records at least one op of its own
      Step extra = op(inner);
      extra.depth = depth + 1;
      p.replay_limit += recorded_ops(extra) * static_cast<std::size_t>(depth + 1);
      s.body.push_back(std::move(extra));
    }
    const int own = static_cast<int>(inner.size() - before);
    s.returns.push_back(static_cast<int>(inner.size()) - 1);
    if (own > 1 && random_.uniform() < 0.4) s.returns.push_back(static_cast<int>(before) + random_.integer(own - 1));
    for (int r : s.returns) scope.push_back(inner[static_cast<std::size_t>(r)]);
    ++p.regions;
    return s;
  }

  /// One op step on the current scope; appends its output shape.
  Step op(std::vector<Shape>& scope) {
    for (;;) {
      Step s;
      s.a = pick(scope);
      const Shape a = scope[static_cast<std::size_t>(s.a)];
      const double r = random_.uniform();
      Shape out = a;
      if (r < 0.35) {
        s.kind = Kind::unary;
        s.op = random_.integer(unary_count);
      } else if (r < 0.55) {
        s.kind = Kind::binary;
        s.op = random_.integer(binary_count);
        s.b = find(scope, [&](const Shape& b) { return broadcastable(a, b); });
        if (s.b < 0 || random_.uniform() < 0.15) {  // a constant recorded here, broadcast against a
          Step c;
          c.kind = Kind::constant;
          const Shape cs = random_.uniform() < 0.5 ? Shape{1, a.cols} : Shape{a.rows, 1};
          c.data = remat_test::random_matrix<double>(cs.rows, cs.cols, random_.bits(), remat_test::anywhere);
          scope.push_back(cs);
          return c;  // the binary op may pick it next time
        }
        out = broadcast(a, scope[static_cast<std::size_t>(s.b)]);
      } else if (r < 0.65) {
        s.kind = Kind::matmul;
        s.b = find(scope, [&](const Shape& b) { return b.rows == a.cols && b.cols <= 4; });
        if (s.b < 0) continue;
        out = {a.rows, scope[static_cast<std::size_t>(s.b)].cols};
      } else if (r < 0.71) {
        s.kind = Kind::linear;
        s.b = find(scope, [&](const Shape& b) { return b.rows == a.cols && b.cols <= 4; });
        if (s.b < 0) continue;
        const remat::Index n = scope[static_cast<std::size_t>(s.b)].cols;
        s.c = find(scope, [&](const Shape& c) { return c.rows == 1 && c.cols == n; });
        if (s.c < 0) continue;
        out = {a.rows, n};
      } else if (r < 0.76) {
        if (a.cols < 4) continue;  // with 2 columns x̂ = ±1 and the gradient is ill-conditioned for FD
        s.kind = Kind::layer_norm;
        s.b = find(scope, [&](const Shape& g) { return g.rows == 1 && g.cols == a.cols; });
        s.c = find(scope, [&](const Shape& g) { return g.rows == 1 && g.cols == a.cols; });
        if (s.b < 0 || s.c < 0) continue;
      } else if (r < 0.80) {
        s.kind = Kind::sum_rows;
        out = {a.rows, 1};
      } else if (r < 0.83) {
        s.kind = Kind::softmax;
      } else if (r < 0.86) {
        s.kind = Kind::log_softmax;
      } else if (r < 0.89) {
        s.kind = Kind::reduce;
        s.op = random_.integer(2);
        out = {1, 1};
      } else if (r < 0.93) {
        s.kind = Kind::dropout;
      } else if (r < 0.97) {
        s.kind = Kind::name;
        s.op = random_.integer(3);
      } else if (r < 0.985) {
        s.kind = Kind::cross_entropy;
        out = {1, 1};
      } else {
        s.kind = Kind::mse_loss;
        s.b = find(scope, [&](const Shape& b) { return b == a; });
        out = {1, 1};
      }
      scope.push_back(out);
      return s;
    }
  }

  remat_test::Random random_;
};

const char* const tag_names[] = {"a", "b", "c"};

/// The policy of a region step, as one callable type. Policies 0–5 are the library's; 6 is a custom
/// policy that decides at random (its own generator, seeded per region call, so the two runs agree);
/// 7 is a custom policy on the OpInfo fields.
std::function<bool(const OpInfo&)> make_policy(int which, std::uint64_t seed) {
  using namespace remat::policies;
  switch (which) {
    case 0:
      return nothing_saveable;
    case 1:
      return everything_saveable;
    case 2:
      return dots_saveable;
    case 3:
      return save_only_these_names({"a", "c"});
    case 4:
      return save_any_names_but_these({"b"});
    case 5:
      return save_from_both_policies(dots_saveable, save_only_these_names({"b"}));
    case 6: {
      auto generator = std::make_shared<std::mt19937_64>(seed);
      return [generator](const OpInfo&) { return ((*generator)() & 1) != 0; };
    }
    default:
      return [](const OpInfo& op) {
        return op.kind == remat::OpKind::normalization || op.bytes > 12 * sizeof(double) || op.flops > 40;
      };
  }
}

template <class T>
class Executor {
 public:
  Executor(const Program& program, bool use_checkpoint) : program_(program), use_checkpoint_(use_checkpoint) {}

  /// Records the program on `tape` with `inputs` as its leaves; returns the loss.
  Var<T> run(Tape<T>& tape, const std::vector<Var<T>>& inputs) {
    std::vector<Var<T>> scope = inputs;
    body(tape, program_.steps, scope);
    Var<T> loss;
    for (std::size_t k = 0; k < program_.loss_terms.size(); ++k) {
      const Var<T>& v = scope[static_cast<std::size_t>(program_.loss_terms[k])];
      Var<T> term = k == 0 ? remat::sum(v) : k == 1 ? remat::mean(remat::square(v)) : remat::sum(remat::tanh(v));
      loss = k == 0 ? term : loss + term;
    }
    return loss;
  }

  int calls = 0;  // how many times region bodies ran

 private:
  void body(Tape<T>& tape, const std::vector<Step>& steps, std::vector<Var<T>>& scope) {
    for (const Step& s : steps) {
      if (s.kind == Kind::region)
        region(tape, s, scope);
      else
        scope.push_back(op(tape, s, scope));
    }
  }

  void region(Tape<T>& tape, const Step& s, std::vector<Var<T>>& scope) {
    // The body sees the enclosing scope (captures), with the argument positions replaced by the Vars the
    // checkpointed function received (the same values, passed explicitly).
    auto run_body = [&](const std::vector<Var<T>>& args) {
      ++calls;
      std::vector<Var<T>> inner = scope;
      for (std::size_t k = 0; k < args.size(); ++k) inner[static_cast<std::size_t>(s.args[k])] = args[k];
      body(tape, s.body, inner);
      std::vector<Var<T>> out;
      for (int r : s.returns) out.push_back(inner[static_cast<std::size_t>(r)]);
      return out;
    };
    const auto policy = make_policy(s.policy, s.policy_seed);
    const Var<T> a0 = scope[static_cast<std::size_t>(s.args[0])];
    const Var<T> a1 = s.args.size() > 1 ? scope[static_cast<std::size_t>(s.args[1])] : a0;
    std::vector<Var<T>> results;
    if (!use_checkpoint_) {
      results = run_body(s.args.size() > 1 ? std::vector<Var<T>>{a0, a1} : std::vector<Var<T>>{a0});
    } else if (s.args.size() == 1 && s.returns.size() == 1) {
      results = {remat::checkpoint([&](Var<T> x) { return run_body({x})[0]; }, policy)(a0)};
    } else if (s.args.size() == 1) {
      auto [p, q] = remat::checkpoint(
          [&](Var<T> x) {
            auto o = run_body({x});
            return std::make_tuple(o[0], o[1]);
          },
          policy)(a0);
      results = {p, q};
    } else if (s.returns.size() == 1) {
      results = {remat::checkpoint([&](Var<T> x, Var<T> y) { return run_body({x, y})[0]; }, policy)(a0, a1)};
    } else {
      auto [p, q] = remat::checkpoint(
          [&](Var<T> x, Var<T> y) {
            auto o = run_body({x, y});
            return std::make_tuple(o[0], o[1]);
          },
          policy)(a0, a1);
      results = {p, q};
    }
    for (auto& r : results) scope.push_back(r);
  }

  Var<T> op(Tape<T>& tape, const Step& s, const std::vector<Var<T>>& scope) {
    using namespace remat;
    auto at = [&](int i) { return scope[static_cast<std::size_t>(i)]; };
    const Var<T> a = s.a >= 0 ? at(s.a) : Var<T>();
    auto plus_one_square = [](const Var<T>& x) { return affine(square(x), 1.0, 1.0); };  // x² + 1 ≥ 1
    switch (s.kind) {
      case Kind::constant:
        return tape.constant(s.data.cast<T>());
      case Kind::unary:
        switch (s.op) {
          case 0:
            return tanh(a);
          case 1:
            return sigmoid(a);
          case 2:
            return exp(tanh(a));
          case 3:
            return log(plus_one_square(a));
          case 4:
            return sqrt(plus_one_square(a));
          case 5:
            return sin(a);
          case 6:
            return cos(a);
          case 7:
            return gelu(a);
          case 8:
            return softplus(a);
          case 9:
            return relu(a);
          case 10:
            return abs(a);
          case 11:
            return square(tanh(a));
          case 12:
            return -a;
          case 13:
            return a * 0.5 + 0.25;
          case 14:
            return 1.0 / plus_one_square(a);
          case 15:
            return pow(plus_one_square(a), 1.5);
          case 16:
            return 2.0 * a;
          case 17:
            return 1.0 - a;
          default:
            return a / 2.0;
        }
      case Kind::binary:
        switch (s.op) {
          case 0:
            return a + at(s.b);
          case 1:
            return a - at(s.b);
          case 2:
            return a * at(s.b);
          default:
            return a / plus_one_square(at(s.b));
        }
      case Kind::matmul:
        return matmul(a, at(s.b));
      case Kind::linear:
        return linear(a, at(s.b), at(s.c));
      case Kind::layer_norm:
        return layer_norm(a, at(s.b), at(s.c));
      case Kind::sum_rows:
        return sum_rows(a);
      case Kind::softmax:
        return softmax(a);
      case Kind::log_softmax:
        return log_softmax(a);
      case Kind::reduce:
        return s.op == 0 ? sum(a) : mean(a);
      case Kind::dropout:
        return dropout(a, 0.3);
      case Kind::name:
        return checkpoint_name(a, tag_names[s.op]);
      case Kind::cross_entropy: {
        std::vector<int> labels;
        for (remat::Index i = 0; i < a.rows(); ++i) labels.push_back(static_cast<int>((3 * i + 1) % a.cols()));
        return cross_entropy(a, labels);
      }
      case Kind::mse_loss:
        return mse_loss(a, at(s.b));
      case Kind::region:
        break;
    }
    ADD_FAILURE() << "unhandled step";
    return a;
  }

  const Program& program_;
  bool use_checkpoint_;
};

/// How the gradients are requested: backward(); backward(retain) twice; gradient() of a subset.
enum class Request { backward, twice, subset };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::unary:
      return "unary";
    case Kind::binary:
      return "binary";
    case Kind::matmul:
      return "matmul";
    case Kind::linear:
      return "linear";
    case Kind::layer_norm:
      return "layer_norm";
    case Kind::sum_rows:
      return "sum_rows";
    case Kind::softmax:
      return "softmax";
    case Kind::log_softmax:
      return "log_softmax";
    case Kind::reduce:
      return "reduce";
    case Kind::dropout:
      return "dropout";
    case Kind::name:
      return "name";
    case Kind::cross_entropy:
      return "cross_entropy";
    case Kind::mse_loss:
      return "mse_loss";
    case Kind::constant:
      return "constant";
    case Kind::region:
      return "region";
  }
  return "?";
}

/// The program as text, printed when a graph fails: one line per step, regions indented.
void describe(const std::vector<Step>& steps, int& next, int indent, std::string& out) {
  for (const Step& s : steps) {
    out += std::string(static_cast<std::size_t>(indent) * 2, ' ');
    if (s.kind == Kind::region) {
      const int first = next;
      out += "region policy " + std::to_string(s.policy) + " args";
      for (int a : s.args) out += " v" + std::to_string(a);
      out += " {\n";
      int inner = next;
      describe(s.body, inner, indent + 1, out);
      out += std::string(static_cast<std::size_t>(indent) * 2, ' ') + "} returns";
      for (int r : s.returns) out += " v" + std::to_string(r) + "->v" + std::to_string(next++);
      (void)first;
      out += "\n";
      continue;
    }
    out += "v" + std::to_string(next++) + " = " + kind_name(s.kind) + "#" + std::to_string(s.op) + "(";
    for (int o : {s.a, s.b, s.c})
      if (o >= 0) out += " v" + std::to_string(o);
    out += " )\n";
  }
}
std::string describe(const Program& p) {
  std::string out;
  int next = static_cast<int>(p.inputs.size());
  describe(p.steps, next, 0, out);
  out += "loss terms:";
  for (int t : p.loss_terms) out += " v" + std::to_string(t);
  return out + "\n";
}

template <class T>
void check_graph(const Program& program, int index, Request request, bool finite_differences) {
  SCOPED_TRACE("graph " + std::to_string(index) + ":\n" + describe(program));
  auto execute = [&](bool use_checkpoint, std::vector<Matrix<T>>& grads, Matrix<T>& loss_value, int& calls,
                     std::size_t& replayed) {
    Tape<T> tape(0xC0FFEE + static_cast<std::uint64_t>(index));
    std::vector<Var<T>> inputs;
    for (const auto& m : program.inputs) inputs.push_back(tape.variable(m.cast<T>()));
    Executor<T> executor(program, use_checkpoint);
    Var<T> loss = executor.run(tape, inputs);
    loss_value = loss.value();
    calls = executor.calls;
    if (request == Request::subset && use_checkpoint) {
      std::vector<Var<T>> wanted;
      for (std::size_t k = 0; k < inputs.size(); k += 2) wanted.push_back(inputs[k]);
      const auto g = tape.gradient(loss, wanted);
      for (std::size_t k = 0; k < inputs.size(); ++k)
        grads.push_back(k % 2 == 0 ? g[k / 2] : Matrix<T>(Matrix<T>::Zero(inputs[k].rows(), inputs[k].cols())));
    } else {
      if (request == Request::twice && use_checkpoint) {
        tape.backward(loss, /*retain_graph=*/true);
        const std::size_t first = tape.memory().replayed_ops;
        const auto first_grads = checkpoint_test::gradients_of(inputs);
        for (const auto& v : inputs) v.zero_grad();  // variables accumulate across backward passes
        tape.backward(loss);
        // A retained sweep and a freeing one replay exactly the same ops (one lifetime rule).
        EXPECT_EQ(tape.memory().replayed_ops, first);
        EXPECT_LE(tape.memory().replayed_ops, program.replay_limit);
        const auto second_grads = checkpoint_test::gradients_of(inputs);
        for (std::size_t k = 0; k < inputs.size(); ++k)
          EXPECT_TRUE(BitwiseEqual(first_grads[k], second_grads[k])) << "second backward, input " << k;
      } else {
        tape.backward(loss);
      }
      grads = checkpoint_test::gradients_of(inputs);
    }
    replayed = tape.memory().replayed_ops;
  };
  std::vector<Matrix<T>> reference, checkpointed;
  Matrix<T> reference_loss, checkpointed_loss;
  int reference_calls = 0, checkpointed_calls = 0;
  std::size_t reference_replayed = 0, checkpointed_replayed = 0;
  execute(false, reference, reference_loss, reference_calls, reference_replayed);
  execute(true, checkpointed, checkpointed_loss, checkpointed_calls, checkpointed_replayed);

  EXPECT_TRUE(BitwiseEqual(reference_loss, checkpointed_loss)) << "loss";
  for (std::size_t k = 0; k < reference.size(); ++k) {
    if (request == Request::subset && k % 2 == 1) continue;
    EXPECT_TRUE(BitwiseEqual(reference[k], checkpointed[k])) << "gradient of input " << k;
  }
  EXPECT_EQ(reference_calls, program.regions);
  EXPECT_EQ(checkpointed_calls, program.regions);  // f ran once per call, backward never called it
  EXPECT_EQ(reference_replayed, 0u);
  EXPECT_LE(checkpointed_replayed, program.replay_limit);  // at most one replay per op and enclosing region

  if (finite_differences) {
    const auto result = remat_test::gradcheck(
        [&](Tape<double>& tape, const std::vector<Var<double>>& inputs) {
          return Executor<double>(program, true).run(tape, inputs);
        },
        program.inputs, remat_test::GradcheckOptions{1e-6, 0xC0FFEE + static_cast<std::uint64_t>(index)});
    EXPECT_TRUE(remat_test::passes(result, 1e-6));
  }
}

template <class T>
class RandomGraphs : public ::testing::Test {};
TYPED_TEST_SUITE(RandomGraphs, checkpoint_test::Scalars);

TYPED_TEST(RandomGraphs, CheckpointedGradientsBitwiseEqualAndMatchFiniteDifferences) {
  using T = TypeParam;
  std::size_t regions = 0, replays_possible = 0;
  for (int i = 0; i < graph_count; ++i) {
    const Program program = Generator(1000 + static_cast<std::uint64_t>(i)).generate();
    regions += static_cast<std::size_t>(program.regions);
    replays_possible += program.replay_limit;
    const Request request = i % 3 == 0 ? Request::backward : i % 3 == 1 ? Request::twice : Request::subset;
    try {
      check_graph<T>(program, i, request, std::is_same_v<T, double> && i % 4 == 0);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "graph " << i << " threw: " << e.what() << "\n" << describe(program);
    }
    if (::testing::Test::HasFailure()) break;  // one graph's report is enough to debug
  }
  // The generator must actually produce regions, nested ones included.
  EXPECT_GT(regions, static_cast<std::size_t>(graph_count));
  EXPECT_GT(replays_possible, 0u);
}

}  // namespace
