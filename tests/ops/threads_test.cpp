// Bitwise identical results for every thread count (docs/design.md §6): every op of the op list — its
// forward value and the gradients of all its inputs — at 1, 2 and 3 threads, on shapes that cross the
// parallel grain with several row blocks and a ragged last one, and on the list's own tiny shapes; and a
// whole GPT training step (examples/gpt), plain and checkpointed, with unfused and fused attention.
// Also: remat::set_num_threads's contract (zero, negative and huge counts, calls from two threads and from inside
// a parallel region, user ops), and that tiny kernels never wake the thread team.
//
// What is compared is what remat computes. OpenBLAS's own multi-threaded products are not bitwise equal to
// its one-thread products (observed here with Debian's OpenBLAS 0.3.21: matmul's value and gradients differ
// in the last bits between 1 and 2 OpenBLAS threads), so where a test's result goes through products that
// OpenBLAS threads itself (matmul, linear, the GPT's linear layers) OpenBLAS is kept on one thread while
// remat's team takes 1, 2 and 3 threads. The attention ops make their products on remat's team with OpenBLAS
// on one thread anyway, so their tests let OpenBLAS follow set_num_threads. conv2d's float kernels run on oneDNN
// when remat is built with it, but the op list's small grouped convolutions are shapes oneDNN would run on its
// GEMM-based kernel, so they run on im2col; oneDNN's direct kernels' weight gradient is not bitwise equal between
// thread counts (conv2d_onednn_test.cpp checks their value and input gradient).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "fma_op.hpp"
#include "gpt/training_step.hpp"  // examples/gpt
#include "op_list.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "remat/threads.hpp"
#include "restore_threads.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace threads_test {

using remat::Index;
using remat::Matrix;
using remat::Shape;
using remat_test::OpCase;
using remat_test::ShapeSet;

/// The thread counts compared; the first is the reference.
constexpr int thread_counts[] = {1, 2, 3};

using remat_test::RestoreThreads;

/// A dimension of the op list's tiny shapes → a large one, consistently (1 stays 1, so broadcasting forms
/// stay broadcasting, and inner dimensions of products still match). [800,45] has 36000 elements, 5 row
/// blocks of 176 rows (the last of 96); [300,130] 6 row blocks (the last of 20), and 16 row blocks of a column
/// sum (the last of 15 rows); [1,40000] one row in 157 column chunks of a column sum (the last of 64 columns).
Index large(Index tiny) {
  switch (tiny) {
    case 1:
      return 1;
    case 2:
      return 130;
    case 3:
      return 800;
    case 4:
      return 45;
    case 5:
      return 300;
    case 6:
      return 40000;
    default:
      throw std::invalid_argument("threads_test: no large dimension for " + std::to_string(tiny));
  }
}

/// Token rows of the large attention layout (op_list.hpp's attention_config: B = 2, S = 150, 3 heads of 16).
const Shape large_q{300, 48};

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

/// An N-D shape set made large: the first dim of its shapes of the highest rank (they align there, so
/// broadcasting, batch dims and inner dims still match) multiplied so that the largest holds at least 40000
/// elements, above the grain as [800,45] is. Empty where that first dim is 1 (the size-1 sets stay tiny).
ShapeSet large_nd(const ShapeSet& tiny) {
  int rank = 0;
  Index most = 1;
  for (const Shape& s : tiny) rank = std::max(rank, s.rank());
  for (const Shape& s : tiny) most = std::max(most, s.numel());
  ShapeSet set = tiny;
  const Index factor = (40000 + most - 1) / most;
  bool scaled = false;
  for (Shape& s : set)
    if (s.rank() == rank && s[0] > 1) {
      s[0] *= factor;
      scaled = true;
    }
  return scaled ? set : ShapeSet{};
}

/// The op's large shape sets: its own sets with every dimension made large, or the large attention layout.
std::vector<ShapeSet> large_shape_sets(const OpCase& op) {
  if (starts_with(op.name, "attention_values")) return {{remat_test::attention_matrix_shape(large_q), large_q}};
  if (starts_with(op.name, "attention_scores") || starts_with(op.name, "scaled_dot_product_attention"))
    return {ShapeSet(static_cast<std::size_t>(op.arity), large_q)};
  std::vector<ShapeSet> sets;
  if (op.name == "conv2d") {  // only the batch grows: the weight's and the bias's dims are tied to the channels
    for (ShapeSet set : op.shape_sets)
      if (set[0][0] > 1) {
        set[0][0] *= (40000 + set[0].numel() - 1) / set[0].numel();
        sets.push_back(set);
      }
    return sets;
  }
  if (remat_test::is_nd(op.shape_sets.back())) {  // an N-D entry: at most 4 of its sets made large, spread over them
    std::vector<ShapeSet> all;
    for (const ShapeSet& tiny : op.shape_sets)
      if (ShapeSet set = large_nd(tiny); !set.empty()) all.push_back(set);
    const std::size_t n = all.size(), keep = std::min<std::size_t>(n, 4);
    for (std::size_t k = 0; k < keep; ++k) sets.push_back(all[keep == 1 ? 0 : k * (n - 1) / (keep - 1)]);
    return sets;
  }
  for (const ShapeSet& tiny : op.shape_sets) {
    ShapeSet set;
    for (const Shape& s : tiny) set.push_back({large(s.rows()), large(s.cols())});
    sets.push_back(set);
  }
  return sets;
}

/// remat::set_num_threads(threads); then OpenBLAS back on one thread unless `blas_follows`.
void set_threads(int threads, bool blas_follows) {
  remat::set_num_threads(threads);
  if (!blas_follows && remat::detail::have_openblas_threads()) openblas_set_num_threads(1);
}

/// Whether the op's result comes from a product OpenBLAS threads itself (see the top of this file).
bool openblas_threads_it(const OpCase& op) {
  return op.name == "matmul" || op.name == "matmul_nd" || op.name == "linear";
}

/// The op's output value, then the gradients of all its inputs (of scalar_loss), at `threads` threads.
template <class T>
std::vector<Matrix<T>> run_op(const OpCase& op, const ShapeSet& shapes, int threads) {
  set_threads(threads, !openblas_threads_it(op));
  remat::Tape<T> tape(123);
  std::vector<remat::Var<T>> in;
  const std::vector<Matrix<T>> inputs = remat_test::make_inputs<T>(op, shapes, 17);
  for (std::size_t k = 0; k < inputs.size(); ++k) in.push_back(remat_test::leaf(tape, inputs[k], shapes[k]));
  const remat::Var<T> out = op.build(in);
  std::vector<Matrix<T>> results{Matrix<T>(out.value())};
  for (Matrix<T>& g : tape.gradient(remat_test::scalar_loss(tape, out, 17), in)) results.push_back(std::move(g));
  return results;
}

/// "" if a and b are bitwise equal, else where they first differ.
template <class T>
std::string first_difference(const Matrix<T>& a, const Matrix<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return "shapes differ";
  for (Index k = 0; k < a.size(); ++k)
    if (std::memcmp(a.data() + k, b.data() + k, sizeof(T)) != 0)
      return "element " + std::to_string(k) + " of " + std::to_string(a.size()) + ": " + std::to_string(a.data()[k]) +
             " vs " + std::to_string(b.data()[k]);
  return "";
}

/// Every matrix of `results[t]` bitwise equal to `results[0]`'s; `what` names them.
template <class T>
void expect_bitwise_equal(const std::vector<std::vector<Matrix<T>>>& results, const std::vector<std::string>& what) {
  for (std::size_t t = 1; t < results.size(); ++t) {
    ASSERT_EQ(results[t].size(), results[0].size());
    for (std::size_t k = 0; k < results[0].size(); ++k) {
      const std::string difference = first_difference(results[t][k], results[0][k]);
      EXPECT_EQ(difference, "") << what[k] << " at " << thread_counts[t] << " threads differs from " << thread_counts[0]
                                << " thread";
    }
  }
}

std::vector<std::string> op_result_names(const OpCase& op) {
  std::vector<std::string> names{"value"};
  for (int k = 0; k < op.arity; ++k) names.push_back("gradient of input " + std::to_string(k));
  return names;
}

template <class T>
void expect_same_at_every_thread_count(const OpCase& op, const ShapeSet& shapes) {
  std::string trace = op.name;
  for (const Shape& s : shapes) trace += " " + remat::to_string(s);
  SCOPED_TRACE(trace + (std::is_same_v<T, float> ? " float" : " double"));
  std::vector<std::vector<Matrix<T>>> results;
  for (const int threads : thread_counts) results.push_back(run_op<T>(op, shapes, threads));
  expect_bitwise_equal(results, op_result_names(op));
}

class EveryOp : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryOp, ValueAndGradientsAreBitwiseEqualAt1And2And3Threads) {
  const RestoreThreads restore;
  const OpCase& op = remat_test::find_op(GetParam());
  const std::vector<ShapeSet> large_sets = large_shape_sets(op);
  for (const ShapeSet& shapes : large_sets) expect_same_at_every_thread_count<float>(op, shapes);
  expect_same_at_every_thread_count<double>(op, large_sets[0]);
  for (const ShapeSet& shapes : op.shape_sets) expect_same_at_every_thread_count<float>(op, shapes);
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const OpCase& op : remat_test::op_list()) names.push_back(op.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, EveryOp, ::testing::ValuesIn(op_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// The large shapes do what the test above says: they cross the grain, in several row blocks with a ragged
// last one (and row blocks and column chunks, for the column sums), and the attention layout in several row tiles.
TEST(ThreadsTestShapes, CrossTheGrainInSeveralBlocksWithARaggedLastOne) {
  for (const Shape& s : {Shape{800, 45}, Shape{300, 130}}) {
    const remat::detail::Blocks rows = remat::detail::row_blocks(s.rows(), s.cols(), 1);
    EXPECT_GE(rows.count, 3) << remat::to_string(s);
    EXPECT_NE(rows.total % rows.size, 0) << remat::to_string(s);
    EXPECT_GE(remat::detail::reduction_blocks(s.rows(), s.cols(), 1).count, 3) << remat::to_string(s);
  }
  // Column sums (bias gradients, sum_cols, layer_norm's dgain): [300,130] in 16 row blocks, the last shorter;
  // [1,40000] in 157 column chunks, the last shorter.
  const remat::detail::ColumnSumPartition sums = remat::detail::column_sum_partition(300, 130, 1);
  EXPECT_TRUE(sums.team);
  EXPECT_EQ(sums.rows.count, 16);
  EXPECT_NE(sums.rows.total % sums.rows.size, 0);
  const remat::detail::ColumnSumPartition wide = remat::detail::column_sum_partition(1, 40000, 1);
  EXPECT_EQ(wide.columns.count, 157);
  EXPECT_NE(wide.columns.total % wide.columns.size, 0);
  const auto c = remat_test::attention_config(large_q);
  const remat::detail::AttentionLayout l{large_q.rows() / c.seq_len, c.seq_len, c.heads, large_q.cols() / c.heads};
  for (const bool causal : {false, true}) {
    const remat::detail::AttentionTiles tiles = remat::detail::attention_tiles(l, causal);
    EXPECT_TRUE(tiles.team);
    EXPECT_EQ(tiles.rows.count, 3);
    EXPECT_NE(tiles.rows.total % tiles.rows.size, 0);
  }
}

// ---- a GPT training step ----

struct GptCase {
  const char* name;
  gpt::Recompute recompute;
  gpt::Attention attention;
  double dropout;
};

/// A training step (examples/gpt/training_step.hpp: loss, backward, gradient clipping, AdamW) of a small GPT
/// whose activations cross the grain: 2 sequences of S = 96 tokens (2 attention row tiles, the last of 32),
/// H = 64 (2 row blocks of [192,64], the last of 64 rows), 4 heads, 2 blocks, a 64-byte vocabulary; OpenBLAS
/// on one thread (see the top of this file). Returns the loss, the gradient norm, the gradients and the
/// parameters after the update.
std::vector<Matrix<float>> gpt_step(const GptCase& g, int threads) {
  set_threads(threads, false);
  gpt::Config config;
  config.vocabulary = 64;
  config.width = 64;
  config.heads = 4;
  config.seq_len = 96;
  config.blocks = 2;
  config.dropout = g.dropout;
  remat::nn::Generator init(7), batches(9);
  gpt::Model<float> model = gpt::Model<float>::random(config, init);
  const std::vector<remat::Parameter<float>*> parameters = model.parameters();
  remat::nn::AdamW<float> optimizer({{model.decayed_parameters()}, {model.undecayed_parameters(), 0.0}});
  remat::Tape<float> tape;
  const std::size_t tokens = 2 * static_cast<std::size_t>(config.seq_len);
  std::vector<int> ids(tokens), targets(tokens);
  for (std::size_t i = 0; i < tokens; ++i) {
    ids[i] = static_cast<int>(batches.below(64));
    targets[i] = static_cast<int>(batches.below(64));
  }
  const gpt::StepResult r =
      gpt::training_step(tape, model, parameters, optimizer, ids, targets, {g.recompute, g.attention}, 5, 1e-3, 1.0);
  std::vector<Matrix<float>> results{Matrix<float>::Constant(1, 1, static_cast<float>(r.loss)),
                                     Matrix<float>::Constant(1, 1, static_cast<float>(r.grad_norm))};
  for (const remat::Parameter<float>* p : parameters) results.push_back(p->grad());
  for (const remat::Parameter<float>* p : parameters) results.push_back(p->value());
  return results;
}

class GptStep : public ::testing::TestWithParam<GptCase> {};

TEST_P(GptStep, LossGradientsAndUpdateAreBitwiseEqualAt1And2And3RematThreads) {
  const RestoreThreads restore;
  std::vector<std::vector<Matrix<float>>> results;
  for (const int threads : thread_counts) results.push_back(gpt_step(GetParam(), threads));
  std::vector<std::string> names{"loss", "gradient norm"};
  const std::size_t parameters = (results[0].size() - 2) / 2;
  for (std::size_t k = 0; k < 2 * parameters; ++k)
    names.push_back((k < parameters ? "gradient of parameter " : "parameter ") + std::to_string(k % parameters));
  expect_bitwise_equal(results, names);
}

INSTANTIATE_TEST_SUITE_P(Modes, GptStep,
                         ::testing::Values(GptCase{"plain", gpt::Recompute::none, gpt::Attention::unfused, 0.1},
                                           GptCase{"per_block", gpt::Recompute::block, gpt::Attention::unfused, 0.1},
                                           GptCase{"fused", gpt::Recompute::none, gpt::Attention::fused, 0}),
                         [](const ::testing::TestParamInfo<GptCase>& info) { return info.param.name; });

// ---- the thread setting ----

TEST(SetNumThreads, SetsTheKernelsThreadsAndRejectsFewerThanOne) {
  const RestoreThreads restore;
  remat::set_num_threads(3);
  EXPECT_EQ(remat::num_threads(), 3);
  if (remat::detail::have_openblas_threads()) {
    EXPECT_EQ(openblas_get_num_threads(), 3);  // OpenBLAS together
  }
  remat::set_num_threads(1);
  EXPECT_EQ(remat::num_threads(), 1);
  remat_test::expect_error_naming<remat::domain_error>([] { remat::set_num_threads(0); }, {"set_num_threads", "0"});
  remat_test::expect_error_naming<remat::domain_error>([] { remat::set_num_threads(-2); }, {"set_num_threads", "-2"});
  EXPECT_EQ(remat::num_threads(), 1);  // unchanged by the rejected calls
}

// W0's tensors ([16,32]) and every op on the op list's tiny shapes stay below the grain: no parallel region is
// entered, at any thread count. A large one enters one (with OpenMP).
TEST(ParallelGrain, TinyKernelsNeverEnterAParallelRegion) {
  const RestoreThreads restore;
  remat::set_num_threads(2);
  const long before = remat::detail::parallel_regions_entered.load();
  for (const OpCase& op : remat_test::op_list())
    for (const ShapeSet& shapes : op.shape_sets) run_op<float>(op, shapes, 2);
  {
    remat::Tape<float> tape;
    remat::Var<float> h = tape.constant(Matrix<float>::Random(16, 32));
    const remat::Var<float> w = tape.variable(Matrix<float>::Random(32, 32));
    const remat::Var<float> b = tape.variable(Matrix<float>::Random(1, 32));
    for (int layer = 0; layer < 4; ++layer) h = remat::tanh(remat::linear(h, w, b));
    tape.backward(remat::cross_entropy(h, std::vector<int>(16, 3)));
  }
  EXPECT_EQ(remat::detail::parallel_regions_entered.load(), before);
#ifdef _OPENMP
  run_op<float>(remat_test::find_op("tanh"), {{800, 45}}, 2);
  EXPECT_GT(remat::detail::parallel_regions_entered.load(), before);
#endif
}

// Products above the grain: the team zeroes the output by row blocks before the GEMM adds into it
// (detail::zero_for_product) instead of Eigen zeroing it on the calling thread. linear's value and dx (above
// the grain) and dW (below it) are bitwise Eigen's own dst = a·b at 1, 2 and 3 threads, in buffers the pool
// hands out dirty (so a block left unzeroed shows), with OpenBLAS on one thread (see the top of this file).
TEST(ProductZeroFill, LinearIsBitwiseEigensProductInReusedBuffersAt1And2And3Threads) {
  const RestoreThreads restore;
  const Index m = 300, k = 120, n = 130;  // y [300,130] and dx [300,120] above the grain, dW [120,130] below
  ASSERT_GT(remat::detail::row_blocks(m, n, 1).count, 1);
  ASSERT_GT(remat::detail::row_blocks(m, k, 1).count, 1);
  ASSERT_EQ(remat::detail::row_blocks(k, n, 1).count, 1);
  set_threads(1, false);
  const Matrix<float> x = Matrix<float>::Random(m, k), w = Matrix<float>::Random(k, n);
  const Matrix<float> b = Matrix<float>::Random(1, n), g = Matrix<float>::Random(m, n);
  Matrix<float> y_reference = x * w;
  y_reference.rowwise() += b.row(0);
  const Matrix<float> dx_reference = g * w.transpose(), dw_reference = x.transpose() * g;
  std::vector<std::vector<Matrix<float>>> results;
  for (const int threads : thread_counts) {
    set_threads(threads, false);
    remat::Tape<float> tape;
    // Two buffers of each of y's, dx's and dW's sizes go back to the pool full of 7s (the inputs take one).
    {
      std::vector<remat::Var<float>> dirty;
      for (int copy = 0; copy < 2; ++copy)
        for (const Shape& s : {Shape{m, n}, Shape{m, k}, Shape{k, n}})
          dirty.push_back(tape.constant(Matrix<float>::Constant(s.rows(), s.cols(), 7)));
    }
    const remat::Var<float> xv = tape.variable(x), wv = tape.variable(w), bv = tape.variable(b);
    const remat::Var<float> y = remat::linear(xv, wv, bv);
    // d(sum(y ⊙ g))/dy = 1 ⊙ g = g exactly.
    std::vector<Matrix<float>> r{Matrix<float>(y.value())};
    for (Matrix<float>& d : tape.gradient(remat::sum(y * tape.constant(g)), {xv, wv})) r.push_back(std::move(d));
    results.push_back(std::move(r));
  }
  for (std::size_t t = 0; t < results.size(); ++t) {
    SCOPED_TRACE(std::to_string(thread_counts[t]) + " threads");
    EXPECT_EQ(first_difference(results[t][0], y_reference), "") << "value";
    EXPECT_EQ(first_difference(results[t][1], dx_reference), "") << "dx";
    EXPECT_EQ(first_difference(results[t][2], dw_reference), "") << "dW";
  }
}

#ifdef _OPENMP
// Without set_num_threads the team has omp_get_max_threads() threads. The attention ops put OpenBLAS on one
// thread around their items only with OpenBLAS's pthreads build: in the OpenMP build openblas_set_num_threads(1)
// would also set omp_set_num_threads(1), and the op's own team would shrink to one thread.
TEST(ParallelGrain, AttentionOpsUseTheDefaultTeamAndLeaveTheThreadSettingsAsTheyWere) {
  const RestoreThreads restore;
  remat::detail::thread_setting.store(0);  // as if set_num_threads had never been called
  if (remat::detail::have_openblas_threads()) openblas_set_num_threads(2);
  omp_set_num_threads(2);
  const int blas_before = remat::detail::have_openblas_threads() ? openblas_get_num_threads() : 0;
  for (const char* name : {"attention_scores", "scaled_dot_product_attention"}) {
    SCOPED_TRACE(name);
    const OpCase& op = remat_test::find_op(name);
    remat::Tape<float> tape(123);
    std::vector<remat::Var<float>> in;
    for (const Matrix<float>& m : remat_test::make_inputs<float>(op, large_shape_sets(op)[0], 17))
      in.push_back(tape.variable(m));
    const long before = remat::detail::parallel_regions_entered.load();
    const remat::Var<float> out = op.build(in);
    EXPECT_GT(remat::detail::parallel_regions_entered.load(), before) << "forward ran on one thread";
    const long after_forward = remat::detail::parallel_regions_entered.load();
    tape.gradient(remat_test::scalar_loss(tape, out, 17), in);
    EXPECT_GT(remat::detail::parallel_regions_entered.load(), after_forward) << "backward ran on one thread";
    EXPECT_EQ(omp_get_max_threads(), 2);
    if (remat::detail::have_openblas_threads()) {
      EXPECT_EQ(openblas_get_num_threads(), blas_before);
    }
  }
}
#endif

// ================================================================ remat::set_num_threads itself: refusing zero and
// negative counts naming the value, results bitwise identical for every thread count on user ops, calls from two
// threads and from inside a parallel region, and a huge count that must not kill the next kernel (a regression
// test, run in a death-test child).

using remat_test::fma;
using remat_test::FmaOp;

using remat::Index;
using remat::Matrix;
using remat::Parameter;
using remat::Shape;
using remat::Tape;
using remat::Var;
using Policy = std::function<bool(const remat::OpInfo&)>;

/// y = exp(x) · s with exp(x) kept as its extra, and a [1, cols] temporary (the column maxima, unused
/// arithmetic-wise except as a scratch write) in forward and backward.
struct ScaledExpOp : remat::OpBase {
  static constexpr const char* name = "scaled_exp";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  struct Params {
    double s;
  };
  static unsigned reads(remat::GradInputs g) { return remat::wants(g, 0) ? remat::reads_extra : 0u; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape extra_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape scratch_shape(const Shape* in, const Params&) { return Shape{1, in[0].cols()}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    c.extra() = c.in(0).array().exp().matrix();
    c.scratch() = c.extra().colwise().maxCoeff();
    c.out() = static_cast<T>(p.s) * c.extra();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    c.scratch().setZero();
    c.add_grad(0, static_cast<T>(p.s) * c.grad_out().array() * c.extra().array());
  }
  static double flops(const Shape*, int, const Shape& out) { return 3.0 * static_cast<double>(out.numel()); }
};

template <class T>
Var<T> scaled_exp(const Var<T>& x, double s) {
  return remat::apply_op<ScaledExpOp>(ScaledExpOp::Params{s}, x);
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(*a.data())) == 0;
}
template <class Body>
void run_in_child(Body body) {
  alarm(20);
  body();
  std::fflush(stdout);
  std::_Exit(0);
}
TEST(ThreadCount, SetNumThreadsRefusesZeroAndNegativeNamingTheValue) {
  const int before = remat::num_threads();
  for (int n : {0, -1, INT_MIN}) {
    remat_test::expect_error_naming<remat::domain_error>([&] { remat::set_num_threads(n); },
                                                         {"set_num_threads", std::to_string(n)});
    EXPECT_EQ(remat::num_threads(), before);
  }
}

/// A program of remat's own kernels above the parallel grain (no matrix product: OpenBLAS's products are
/// exempt from the guarantee): every result bitwise the same for 1, 2, 3, 5 and 8 threads.
TEST(ThreadCount, ResultsAreBitwiseIdenticalForEveryThreadCount) {
  const int saved = remat::num_threads();
  const Matrix<float> X = remat_test::random_matrix<float>(300, 130, 4, remat_test::Domain{-2, 2, 0});
  const Matrix<float> G = remat_test::random_matrix<float>(1, 130, 5, remat_test::Domain{0.5, 1.5, 0});
  std::vector<int> labels;
  for (int i = 0; i < 300; ++i) labels.push_back((i * 7) % 130);
  auto run = [&](Matrix<float>& gx, Matrix<float>& gg, float& loss_value) {
    Tape<float> tape;
    Parameter<float> gain(G), bias(Matrix<float>::Zero(1, 130));
    Var<float> x = tape.variable(X);
    Var<float> h =
        remat::layer_norm(remat::gelu(x) + fma(x, remat::sin(x), x), tape.variable(gain), tape.variable(bias));
    h = scaled_exp(remat::tanh(h), 0.5) + remat::softmax(h) + remat::log_softmax(h);
    Var<float> loss = remat::cross_entropy(h, labels) + remat::mean(h * h) + remat::sum(remat::sum_rows(h)) * 1e-3f;
    loss_value = loss.item();
    tape.backward(loss);
    gx = x.grad();
    gg = gain.grad();
  };
  Matrix<float> gx1, gg1;
  float l1 = 0;
  remat::set_num_threads(1);
  run(gx1, gg1, l1);
  for (int n : {2, 3, 5, 8}) {
    SCOPED_TRACE(std::to_string(n) + " threads");
    remat::set_num_threads(n);
    Matrix<float> gx, gg;
    float l = 0;
    const long regions = remat::detail::parallel_regions_entered.load();
    run(gx, gg, l);
#ifdef _OPENMP
    // The kernels went to the team: the comparison is of a run where the thread count changes the schedule.
    EXPECT_GT(remat::detail::parallel_regions_entered.load(), regions);
#endif
    EXPECT_EQ(std::memcmp(&l, &l1, sizeof l), 0);
    EXPECT_TRUE(same_bits(gx, gx1));
    EXPECT_TRUE(same_bits(gg, gg1));
  }
  remat::set_num_threads(saved);
}

/// set_num_threads from two threads at once, and from inside an OpenMP parallel region: no crash, the setting
/// is one of the values given, and a kernel run afterwards gives the one-thread result.
TEST(ThreadCount, SetNumThreadsFromTwoThreadsAndInsideAParallelRegion) {
  const int saved = remat::num_threads();
  std::thread a([] {
    for (int i = 0; i < 200; ++i) remat::set_num_threads(2);
  });
  std::thread b([] {
    for (int i = 0; i < 200; ++i) remat::set_num_threads(3);
  });
  a.join();
  b.join();
  EXPECT_TRUE(remat::num_threads() == 2 || remat::num_threads() == 3);
#ifdef _OPENMP
#pragma omp parallel num_threads(2)
  { remat::set_num_threads(2 + omp_get_thread_num()); }
  EXPECT_TRUE(remat::num_threads() == 2 || remat::num_threads() == 3);
#endif
  const Matrix<float> X = remat_test::random_matrix<float>(256, 256, 8);
  auto grad = [&] {
    Tape<float> tape;
    Var<float> x = tape.variable(X);
    tape.backward(remat::sum(remat::tanh(x) * x));
    return Matrix<float>(x.grad());
  };
  const Matrix<float> many = grad();
  remat::set_num_threads(1);
  EXPECT_TRUE(same_bits(grad(), many));
  remat::set_num_threads(saved);
}

// Regression (crash): set_num_threads accepts any n ≥ 1, and every kernel above the grain then asks libgomp for a
// team of exactly n threads (parallel.hpp parallel_for: "always the same team size", never min(n, blocks)); for
// n = 2^30 libgomp cannot allocate or start the team and ends the process ("libgomp: Out of memory" / "Thread
// creation failed"), from an ordinary op. Expected: set_num_threads throws domain_error for an n it cannot
// honour (e.g. above omp_get_thread_limit() or a documented cap), or clamps it; never a dead process.
TEST(ThreadCount, AHugeThreadCountDoesNotKillTheNextKernel) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_in_child([] {
                try {
                  remat::set_num_threads(1 << 30);
                } catch (const remat::domain_error&) {
                  std::_Exit(0);  // refused: fine
                }
                Tape<float> tape;
                Var<float> x = tape.variable(Matrix<float>::Constant(512, 512, 0.5f));
                tape.backward(remat::sum(remat::tanh(x)));
                if (!x.grad().isApproxToConstant(1 - std::tanh(0.5f) * std::tanh(0.5f))) std::_Exit(3);
              }),
              ::testing::ExitedWithCode(0), "");
}

}  // namespace threads_test
