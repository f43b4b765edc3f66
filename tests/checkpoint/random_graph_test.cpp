// Property test: the random programs of random_program.hpp (chains and DAGs of mixed ops with
// broadcasting, matmul, linear, layer stacks, layer_norm, softmax, dropout, reductions, checkpoint_name,
// the transformer ops (data movement, embedding, column reductions, max_rows, detach, attention unfused
// and fused), constants recorded inside regions; constant, variable and Parameter leaves), with checkpoint regions at
// random places, nested up to three deep, each with a random policy (the library's and custom ones), called
// with one or two Var arguments and returning one Var or a tuple of two.
//
// For every graph, in float and double: the loss and every gradient are bitwise equal to the same graph
// without checkpoint, with the gradients requested by backward(), by backward(retain_graph) twice (the
// second replays the same ops and gives the same gradients after zero_grad) or by gradient() of a subset;
// each checkpointed function ran once per call; the replay count is at most one per op and enclosing
// region. On every fourth graph (double) the gradients are also within 1e-6 of central finite differences
// (tests/support/gradcheck.hpp), detach differentiated as a constant (Recorder::FrozenDetach). Fixed seeds;
// the whole test takes well under a second.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "checkpoint_support.hpp"
#include "gradcheck.hpp"
#include "oracle.hpp"
#include "random_program.hpp"
#include "remat/remat.hpp"

namespace random_graph_test {

using namespace random_program;
using checkpoint_test::BitwiseEqual;

constexpr int graph_count = 200;

/// How the gradients are requested: backward(); backward(retain) twice; gradient() of a subset.
enum class Request { backward, twice, subset };

/// At most one replay per op and enclosing region: Σ over the recorded ops of the regions around each
/// (an op's saved_by has one entry per enclosing region).
std::size_t replay_limit(const remat_oracle::Graph& graph) {
  std::size_t limit = 0;
  for (const remat_oracle::Node& n : graph.nodes) limit += n.saved_by.size();
  return limit;
}

template <class T>
struct Outcome {
  Matrix<T> loss;
  std::vector<Matrix<T>> grads;  // one per differentiable leaf (zeros where a subset did not ask)
  int calls = 0;                 // region bodies run, counted after backward
  std::size_t replayed = 0, replay_limit = 0;
};

/// Records `program` (with or without checkpoint) and requests its gradients as `request` says (the
/// reference run without checkpoint always calls backward() once).
template <class T>
Outcome<T> execute(const Program& program, std::uint64_t tape_seed, bool checkpoint, Request request) {
  Run<T> run(program, tape_seed, checkpoint);
  const std::vector<Var<T>> inputs = run.differentiable();
  Outcome<T> out;
  out.loss = run.loss.var.value();
  out.replay_limit = replay_limit(run.rec.graph);
  if (request == Request::subset && checkpoint) {
    std::vector<Var<T>> wanted;
    for (std::size_t k = 0; k < inputs.size(); k += 2) wanted.push_back(inputs[k]);
    const auto g = run.tape.gradient(run.loss.var, wanted);
    for (std::size_t k = 0; k < inputs.size(); ++k)
      out.grads.push_back(k % 2 == 0 ? g[k / 2] : Matrix<T>(Matrix<T>::Zero(inputs[k].rows(), inputs[k].cols())));
  } else {
    if (request == Request::twice && checkpoint) {
      run.tape.backward(run.loss.var, /*retain_graph=*/true);
      const std::size_t first = run.tape.memory().replayed_ops;
      const auto first_grads = checkpoint_test::gradients_of(inputs);
      for (const auto& v : inputs) v.zero_grad();  // variables accumulate across backward passes
      run.tape.backward(run.loss.var);
      // A retained sweep and a freeing one replay exactly the same ops (one lifetime rule).
      EXPECT_EQ(run.tape.memory().replayed_ops, first);
      EXPECT_LE(run.tape.memory().replayed_ops, out.replay_limit);
      const auto second_grads = checkpoint_test::gradients_of(inputs);
      for (std::size_t k = 0; k < inputs.size(); ++k)
        EXPECT_TRUE(BitwiseEqual(first_grads[k], second_grads[k])) << "second backward, input " << k;
    } else {
      run.tape.backward(run.loss.var);
    }
    out.grads = checkpoint_test::gradients_of(inputs);
  }
  out.replayed = run.tape.memory().replayed_ops;
  out.calls = run.rec.body_calls;
  return out;
}

/// Checks one graph; returns its bound on replays (the checkpointed run's replay_limit).
template <class T>
std::size_t check_graph(const Program& program, int index, Request request, bool finite_differences) {
  SCOPED_TRACE("graph " + std::to_string(index) + ":\n" + describe(program));
  const std::uint64_t tape_seed = 0xC0FFEE + static_cast<std::uint64_t>(index);
  const Outcome<T> reference = execute<T>(program, tape_seed, false, request);
  const Outcome<T> checkpointed = execute<T>(program, tape_seed, true, request);

  EXPECT_TRUE(BitwiseEqual(reference.loss, checkpointed.loss)) << "loss";
  EXPECT_EQ(reference.grads.size(), checkpointed.grads.size());
  for (std::size_t k = 0; k < std::min(reference.grads.size(), checkpointed.grads.size()); ++k) {
    if (request == Request::subset && k % 2 == 1) continue;
    EXPECT_TRUE(BitwiseEqual(reference.grads[k], checkpointed.grads[k])) << "gradient of input " << k;
  }
  EXPECT_EQ(reference.calls, program.regions);
  EXPECT_EQ(checkpointed.calls, program.regions);  // f ran once per call, backward never called it
  EXPECT_EQ(reference.replayed, 0u);
  EXPECT_LE(checkpointed.replayed, checkpointed.replay_limit);  // at most one replay per op and enclosing region

  if (finite_differences) {
    // The differentiable leaves are gradcheck's inputs (Parameters become tape variables there); the
    // constants stay the program's.
    std::vector<Matrix<double>> inputs;
    std::vector<Shape> shapes;
    for (const LeafSpec& l : program.leaves)
      if (l.kind != remat_oracle::Leaf::constant) {
        inputs.push_back(l.data);
        shapes.push_back(l.shape);
      }
    Recorder<double>::FrozenDetach frozen;
    const auto result = remat_test::gradcheck(
        [&](Tape<double>& tape, const std::vector<Var<double>>& vars) {
          Recorder<double> rec(tape, true, /*describe=*/false);
          // The reverse-mode run (on variables) keeps each detach's value; the perturbed runs (on
          // constants) use it.
          frozen.replay = !vars.front().is_variable();
          frozen.next = 0;
          if (!frozen.replay) frozen.values.clear();
          rec.frozen = &frozen;
          std::vector<Recorder<double>::Value> leaves;
          std::size_t next = 0;
          for (const LeafSpec& l : program.leaves)
            leaves.push_back(l.kind == remat_oracle::Leaf::constant ? rec.constant(l.shape, l.data)
                                                                    : rec.input(vars[next++], l.shape));
          return Executor<double>(program, rec).run(leaves).var;
        },
        inputs, shapes, remat_test::GradcheckOptions{1e-6, tape_seed});
    // The central difference's rounding error is about 2.2e-16 |L| / h = 2.2e-10 |L|: a loss beyond 10^3
    // (the generator's products of (x²+1)^1.5, layer_norm gains from column sums and squares reach 10^6)
    // needs a tolerance above it.
    const double loss = std::abs(static_cast<double>(reference.loss(0, 0)));
    EXPECT_TRUE(remat_test::passes(result, std::max(1e-6, 1e-9 * loss)));
  }
  return checkpointed.replay_limit;
}

template <class T>
class RandomGraphs : public ::testing::Test {};
TYPED_TEST_SUITE(RandomGraphs, checkpoint_test::Scalars);

TYPED_TEST(RandomGraphs, CheckpointedGradientsBitwiseEqualAndMatchFiniteDifferences) {
  using T = TypeParam;
  std::size_t regions = 0, replays_possible = 0;
  int deepest = 0;
  for (int i = 0; i < graph_count; ++i) {
    const Program program = Generator(1000 + static_cast<std::uint64_t>(i)).generate();
    regions += static_cast<std::size_t>(program.regions);
    deepest = std::max(deepest, program.deepest);
    const Request request = i % 3 == 0 ? Request::backward : i % 3 == 1 ? Request::twice : Request::subset;
    try {
      replays_possible += check_graph<T>(program, i, request, std::is_same_v<T, double> && i % 4 == 0);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "graph " << i << " threw: " << e.what() << "\n" << describe(program);
    }
    if (::testing::Test::HasFailure()) break;  // one graph's report is enough to debug
  }
  // The generator must actually produce regions, nested ones included.
  EXPECT_GT(regions, static_cast<std::size_t>(graph_count));
  EXPECT_EQ(deepest, max_depth);
  EXPECT_GT(replays_possible, 0u);
}

}  // namespace random_graph_test
