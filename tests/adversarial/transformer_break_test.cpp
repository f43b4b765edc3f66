// Adversarial tests of the transformer-era public API: the op recipe (remat/custom_op.hpp: OpBase, OpCall,
// apply_op, the contexts' params/indices/scratch), remat::gradcheck, the new ops (embedding, slice_cols,
// concat_cols, transpose, reshape, sum_cols, mean_cols, max_rows, argmax_rows, detach, attention_scores,
// attention_values, scaled_dot_product_attention), Tape::set_training, op temporaries in peak_bytes, the
// optimizers (nn::AdamW, nn::SGD, nn::clip_grad_norm, nn::WarmupCosineSchedule) and the GPT example.
//
// Each test states the behaviour the project's standards ask for (a typed exception naming the op and the
// values, with the tape and its memory() figures unchanged; no UB; no silent wrong gradient; checkpointed
// gradients bitwise equal to plain ones under every policy; exact memory figures) and checks that the
// library does it. The defects these tests found are listed in the comments of the tests that found them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "fma_op.hpp"
#include "gpt/gpt.hpp"
#include "random.hpp"
#include "remat/nn/adamw.hpp"
#include "remat/nn/clip_grad_norm.hpp"
#include "remat/nn/sgd.hpp"
#include "remat/nn/warmup_cosine_schedule.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace transformer_break_test {

using remat_test::fma;
using remat_test::FmaOp;

using remat::Index;
using remat::Matrix;
using remat::Shape;
using remat::Tape;
using remat::Var;
using MF = Matrix<float>;
using MD = Matrix<double>;
using VF = Var<float>;
using VD = Var<double>;

MF rnd(Index rows, Index cols, std::uint64_t seed, double low = -1, double high = 1) {
  return remat_test::random_matrix<float>(rows, cols, seed, remat_test::Domain{low, high, 0});
}
MD rndd(Index rows, Index cols, std::uint64_t seed, double low = -1, double high = 1) {
  return remat_test::random_matrix<double>(rows, cols, seed, remat_test::Domain{low, high, 0});
}

template <class A, class B>
bool same_bits(const A& a, const B& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  const MF x = a, y = b;
  return std::memcmp(x.data(), y.data(), sizeof(float) * static_cast<std::size_t>(x.size())) == 0;
}

bool same_memory(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops && a.cached_bytes == b.cached_bytes;
}
std::string describe(const remat::MemoryStats& m) {
  std::ostringstream s;
  s << "live " << m.live_bytes << " peak " << m.peak_bytes << " saved " << m.saved_bytes << " replayed "
    << m.replayed_bytes << " (" << m.replayed_ops << " ops) cached " << m.cached_bytes;
  return s.str();
}

using remat_test::expect_error_naming;

::testing::AssertionResult passes(const remat::GradcheckResult& r, double tolerance = 1e-6) {
  if (r.checked > 0 && r.max_error <= tolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gradcheck (tolerance " << tolerance << "): " << r.describe();
}

/// A type-erased policy, so that every policy goes through one instantiation of remat::checkpoint.
using AnyPolicy = std::function<bool(const remat::OpInfo&)>;

std::vector<std::pair<std::string, AnyPolicy>> every_policy() {
  namespace p = remat::policies;
  return {{"nothing_saveable", p::nothing_saveable},
          {"everything_saveable", p::everything_saveable},
          {"dots_saveable", p::dots_saveable},
          {"dots_with_no_batch_dims_saveable", p::dots_with_no_batch_dims_saveable},
          {"save_only_these_names(gathered, attn)", p::save_only_these_names({"gathered", "attn"})},
          {"save_any_names_but_these(attn)", p::save_any_names_but_these({"attn"})},
          {"save_anything_except_these_names(gathered)", p::save_anything_except_these_names({"gathered"})}};
}

/// Fault injection through the pool's test hook remat::detail::allocation_hook (as
/// tests/alloc/exception_safety_test.cpp does): counts the system allocations of tensor buffers (pool
/// misses) and makes the `fail_at`-th throw std::bad_alloc.
namespace fault {
long misses = 0;
long fail_at = -1;
void hook(std::size_t) {
  ++misses;
  if (misses == fail_at) throw std::bad_alloc();
}
struct Scope {
  explicit Scope(long fail) {
    misses = 0;
    fail_at = fail;
    remat::detail::allocation_hook = &hook;
  }
  ~Scope() { remat::detail::allocation_hook = nullptr; }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};
}  // namespace fault

// ================================================================ user-defined ops (public recipe only)

/// Writes its output, extra and temporary, then throws: the op must not be recorded.
struct ThrowingForwardOp : remat::OpBase {
  static constexpr const char* name = "throwing_forward";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs) { return remat::reads_input0 | remat::reads_extra; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape extra_shape(const Shape* in, const Params&) { return {in[0].rows, 2}; }
  static Shape scratch_shape(const Shape* in, const Params&) { return {7, in[0].cols}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out().setZero();
    c.extra().setZero();
    c.scratch().setZero();
    throw std::runtime_error("throwing_forward: the user's forward failed");
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>&) {}
  static double flops(const Shape*, int, const Shape&) { return 0; }
};

/// y = x·scale + shift with Params of exactly max_params_bytes (its last field at the last 8 bytes).
struct MaxParamsOp : remat::OpBase {
  static constexpr const char* name = "max_params";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  struct Params {
    double scale = 0;
    double unused[3] = {0, 0, 0};
    double shift = 0;
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    c.out().array() = c.in(0).array() * T(p.scale) + T(p.shift + p.unused[0] + p.unused[1] + p.unused[2]);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto p = remat::params_of<Params>(c);
    if (c.wants_grad(0)) c.add_grad(0, c.grad_out().array() * T(p.scale));
  }
  static double flops(const Shape*, int, const Shape& out) { return 2.0 * static_cast<double>(out.size()); }
};
static_assert(sizeof(MaxParamsOp::Params) == remat::max_params_bytes);

/// y column j = x column idx[j] (indices recorded with the op); the gradient scatters back.
struct GatherColsOp : remat::OpBase {
  static constexpr const char* name = "gather_cols";
  static constexpr remat::OpKind kind = remat::OpKind::data_movement;
  struct Params {
    Index count = 0;
  };
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params& p) { return {in[0].rows, p.count}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    auto y = c.out();
    for (Index j = 0; j < y.cols(); ++j) y.col(j) = c.in(0).col(c.indices()[j]);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    remat::GradTarget<T> d = c.grad_target(0);
    if (!d.accumulate) d.map.setZero();
    const auto g = c.grad_out();
    for (Index j = 0; j < g.cols(); ++j) d.map.col(c.indices()[j]) += g.col(j);
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.size()); }
};

template <class T>
Var<T> gather_cols(const Var<T>& x, const std::vector<int>& idx, std::string_view tag = {}) {
  remat::OpCall<GatherColsOp> call;
  call.params.count = static_cast<Index>(idx.size());
  call.indices = idx.data();
  call.index_count = idx.size();
  call.tag = tag;
  return remat::apply_op<GatherColsOp>(call, x);
}

/// A user's stop_gradient: a copy whose output requires no gradient.
struct UserStopOp : remat::OpBase {
  static constexpr const char* name = "user_stop";
  static constexpr remat::OpKind kind = remat::OpKind::data_movement;
  static constexpr bool stops_gradient = true;
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out() = c.in(0);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>&) {}
  static double flops(const Shape*, int, const Shape&) { return 0; }
};

/// y = 2x computed through a temporary one row and two columns larger than x (forward and backward both
/// fill and read it).
struct ScratchOp : remat::OpBase {
  static constexpr const char* name = "scratch_op";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape scratch_shape(const Shape* in, const Params&) { return {in[0].rows + 1, in[0].cols + 2}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    auto s = c.scratch();
    s.setConstant(T(2));
    const Shape o = c.out_shape();
    c.out().array() = c.in(0).array() * s.topLeftCorner(o.rows, o.cols).array();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (!c.wants_grad(0)) return;
    auto s = c.scratch();
    s.setConstant(T(2));
    const Shape o = c.out_shape();
    c.add_grad(0, c.grad_out().array() * s.topLeftCorner(o.rows, o.cols).array());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.size()); }
};

/// An op whose output, extra or temporary shape is whatever its Params say (a buggy user op).
struct ShapeFromParamsOp : remat::OpBase {
  static constexpr const char* name = "shape_from_params";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  struct Params {  // three shapes as int32 pairs (three remat::Shape would exceed max_params_bytes)
    std::int32_t out[2], extra[2], scratch[2];
  };
  static Params make(Shape out, Shape extra, Shape scratch) {
    auto i = [](Index v) { return static_cast<std::int32_t>(v); };
    return {{i(out.rows), i(out.cols)}, {i(extra.rows), i(extra.cols)}, {i(scratch.rows), i(scratch.cols)}};
  }
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape*, const Params& p) { return {p.out[0], p.out[1]}; }
  static Shape extra_shape(const Shape*, const Params& p) { return {p.extra[0], p.extra[1]}; }
  static Shape scratch_shape(const Shape*, const Params& p) { return {p.scratch[0], p.scratch[1]}; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out().setZero();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>&) {}
  static double flops(const Shape*, int, const Shape&) { return 0; }
};

// ================================================================ custom ops

TEST(TransformerBreakCustomOp, AThrowingForwardIsNotRecordedAndLeavesTheFiguresAndTheIndexStoreAsTheyWere) {
  Tape<float> tape;
  const VF x = tape.variable(rnd(4, 3, 1));
  const VF y = remat::tanh(x);
  const VF loss = remat::sum(y);
  const remat::MemoryStats before = tape.memory();
  const std::size_t nodes = tape.size();
  std::vector<int> ids = {1, 2, 3, 0, 2};
  remat::OpCall<ThrowingForwardOp> call;
  call.indices = ids.data();
  call.index_count = ids.size();
  call.tag = "never_recorded";
  for (int attempt = 0; attempt < 3; ++attempt) {  // repeated: nothing may accumulate
    expect_error_naming<std::runtime_error>([&] { remat::apply_op<ThrowingForwardOp>(call, y); }, {"throwing_forward"});
    EXPECT_EQ(tape.size(), nodes);
    EXPECT_TRUE(same_memory(tape.memory(), before)) << describe(tape.memory()) << " vs " << describe(before);
  }
  // The index store was rolled back: the next op with indices reads its own.
  const std::vector<int> cols = {2, 0, 2};
  const VF g = gather_cols(x, cols);
  for (Index j = 0; j < 3; ++j)
    for (Index i = 0; i < 4; ++i) EXPECT_EQ(g.value()(i, j), x.value()(i, cols[static_cast<std::size_t>(j)]));
  tape.backward(loss + remat::sum(g));
  const MF t = x.value().array().tanh().matrix();
  for (Index i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(x.grad()(i, 0), 1 - t(i, 0) * t(i, 0) + 1);
    EXPECT_FLOAT_EQ(x.grad()(i, 1), 1 - t(i, 1) * t(i, 1));
    EXPECT_FLOAT_EQ(x.grad()(i, 2), 1 - t(i, 2) * t(i, 2) + 2);
  }
}

TEST(TransformerBreakCustomOp, AThrowingForwardInsideNestedRegionsLeavesTheTapeUsable) {
  Tape<float> tape;
  const VF x = tape.variable(rnd(3, 3, 2));
  const auto live = tape.memory().live_bytes;
  const auto saved = tape.memory().saved_bytes;
  auto inner = remat::checkpoint(
      [](const VF& b) {
        const VF t = remat::tanh(b);
        return remat::apply_op<ThrowingForwardOp>(t);
      },
      remat::policies::dots_saveable);
  EXPECT_THROW(remat::checkpoint([&](const VF& a) { return inner(remat::sin(a)); })(x), std::runtime_error);
  // The aborted region's nodes stay on the tape (docs/design.md §3): its dropped values are gone, and x is
  // held for sin's backward as it would be without the regions, until the next backward.
  EXPECT_EQ(tape.memory().live_bytes, live) << describe(tape.memory());
  EXPECT_EQ(tape.memory().saved_bytes, saved + 3 * 3 * sizeof(float)) << describe(tape.memory());
  // A region recorded afterwards replays and gives the plain gradient, bitwise.
  const VF y = remat::checkpoint([](const VF& a) { return remat::square(remat::tanh(a)); })(x);
  tape.backward(remat::sum(y));
  Tape<float> plain;
  const VF px = plain.variable(x.value());
  plain.backward(remat::sum(remat::square(remat::tanh(px))));
  EXPECT_TRUE(same_bits(x.grad(), px.grad()));
  EXPECT_EQ(tape.memory().saved_bytes, 0u) << describe(tape.memory());
}

TEST(TransformerBreakCustomOp, ParamsOfTheMaximumSizeSurviveRecordingReplayAndBackward) {
  MaxParamsOp::Params p;
  p.scale = -1.5;
  p.unused[0] = 0.125;
  p.unused[2] = -0.0625;
  p.shift = 0.25;
  const MF xv = rnd(3, 4, 3);
  Tape<float> tape;
  const VF x = tape.variable(xv);
  const VF y = remat::checkpoint([&](const VF& a) { return remat::square(remat::apply_op<MaxParamsOp>(p, a)); })(x);
  tape.backward(remat::sum(y));
  EXPECT_EQ(tape.memory().replayed_ops, 1u);  // the replay re-ran max_params from its stored Params
  Tape<float> plain;
  const VF px = plain.variable(xv);
  const VF py = remat::square(remat::apply_op<MaxParamsOp>(p, px));
  plain.backward(remat::sum(py));
  EXPECT_TRUE(same_bits(y.value(), py.value()));
  EXPECT_TRUE(same_bits(x.grad(), px.grad()));
  const float shift = static_cast<float>(0.25 + 0.125 - 0.0625);
  EXPECT_FLOAT_EQ(py.value()(1, 2), (xv(1, 2) * -1.5f + shift) * (xv(1, 2) * -1.5f + shift));
  EXPECT_FLOAT_EQ(px.grad()(1, 2), 2 * (xv(1, 2) * -1.5f + shift) * -1.5f);
}

TEST(TransformerBreakCustomOp, IndicesAreCopiedSoAReplayAfterTheCallersVectorChangedUsesTheOriginals) {
  const MF xv = rnd(3, 5, 4);
  std::vector<int> idx = {4, 4, 0, 2};
  Tape<float> tape;
  const VF x = tape.variable(xv);
  const VF y = remat::checkpoint([&](const VF& a) { return remat::square(gather_cols(a, idx)); })(x);
  idx.assign(1000, 1);  // reallocated and overwritten before the backward replays gather_cols
  tape.backward(remat::sum(y));
  EXPECT_EQ(tape.memory().replayed_ops, 1u);
  MF expected = MF::Zero(3, 5);
  for (int j : {4, 4, 0, 2}) expected.col(j) += 2 * xv.col(j);
  EXPECT_TRUE(x.grad().isApprox(expected, 1e-6f)) << x.grad() << "\nvs\n" << expected;
}

TEST(TransformerBreakCustomOp, GatherWithRepeatedIndicesPassesTheGradcheck) {
  const MD w = rndd(3, 6, 6);
  const auto result = remat::gradcheck(
      [&](Tape<double>& t, const std::vector<VD>& v) {
        return remat::sum(gather_cols(v[0], {2, 0, 2, 2, 1, 0}) * t.constant(w));
      },
      {rndd(3, 3, 5)});
  EXPECT_TRUE(passes(result));
}

TEST(TransformerBreakCustomOp, ATagSelectsTheOpForTheNamePoliciesAndOutlivesTheCallersString) {
  const MF xv = rnd(4, 3, 7);
  const std::vector<int> idx = {2, 1, 0, 0};
  const std::size_t gathered_bytes = 4 * 4 * sizeof(float), x_bytes = 4 * 3 * sizeof(float);
  auto run = [&](const AnyPolicy& policy, std::size_t expected_saved, std::size_t expected_replayed_ops) {
    Tape<float> tape;
    const VF x = tape.variable(xv);
    const VF y = remat::checkpoint(
        [&](const VF& a) {
          std::string tag = "gath";
          tag += "ered";  // a heap-free temporary string destroyed when the lambda returns
          return remat::square(gather_cols(a, idx, tag));
        },
        policy)(x);
    const VF loss = remat::sum(y);
    EXPECT_EQ(tape.memory().saved_bytes, expected_saved) << describe(tape.memory());
    std::ostringstream report;
    tape.print_saved_residuals(report);
    if (expected_replayed_ops == 0) {
      EXPECT_NE(report.str().find("named 'gathered'"), std::string::npos) << report.str();
    }
    tape.backward(loss);
    EXPECT_EQ(tape.memory().replayed_ops, expected_replayed_ops);
    MF expected = MF::Zero(4, 3);
    for (int j : idx) expected.col(j) += 2 * xv.col(j);
    EXPECT_TRUE(x.grad().isApprox(expected, 1e-6f));
  };
  // square reads gather_cols' output: saved when named and listed, else regenerated from x.
  run(remat::policies::save_only_these_names({"gathered"}), gathered_bytes, 0);
  run(remat::policies::save_any_names_but_these({"other"}), gathered_bytes, 0);
  run(remat::policies::save_anything_except_these_names({"gathered"}), x_bytes, 1);
  run(remat::policies::save_only_these_names({"gather"}), x_bytes, 1);  // a prefix is not the name
}

// Found defect: apply_op did not check the shapes an op's output_shape, extra_shape and scratch_shape return.
// An empty output ([0,3]) was recorded as a value of no elements (every tensor of remat has at least one row
// and column, and leaves throw shape_error for less), a negative one ([-1,-3], whose size() is positive) was
// allocated and mapped with negative dimensions (UB), and [-2,5] became a huge allocation (std::bad_alloc
// instead of shape_error). Fixed in include/remat/detail/apply.hpp: shape_error naming the op and the shape.
TEST(TransformerBreakCustomOp, AnOpReturningAnEmptyOrNegativeShapeThrowsShapeErrorAndRecordsNothing) {
  Tape<float> tape;
  const VF x = tape.variable(rnd(2, 3, 8));
  const remat::MemoryStats before = tape.memory();
  const std::size_t nodes = tape.size();
  for (const Shape out : {Shape{0, 3}, Shape{3, 0}, Shape{-1, -3}, Shape{-2, 5}, Shape{0, 0}}) {
    SCOPED_TRACE(remat::to_string(out));
    expect_error_naming<remat::shape_error>(
        [&] { remat::apply_op<ShapeFromParamsOp>(ShapeFromParamsOp::make(out, {}, {}), x); },
        {"shape_from_params", remat::to_string(out)});
  }
  for (const Shape bad : {Shape{-1, -2}, Shape{-4, 1}, Shape{2, -1}}) {
    SCOPED_TRACE(remat::to_string(bad));
    expect_error_naming<remat::shape_error>(
        [&] {
          remat::apply_op<ShapeFromParamsOp>(ShapeFromParamsOp::make({2, 2}, bad, {}), x);
        },
        {"shape_from_params", remat::to_string(bad)});
    expect_error_naming<remat::shape_error>(
        [&] {
          remat::apply_op<ShapeFromParamsOp>(ShapeFromParamsOp::make({2, 2}, {}, bad), x);
        },
        {"shape_from_params", remat::to_string(bad)});
  }
  EXPECT_EQ(tape.size(), nodes);
  EXPECT_TRUE(same_memory(tape.memory(), before)) << describe(tape.memory());
  // Valid shapes, and "none" ([0,0]) for the extra and the temporary, are accepted.
  const VF y = remat::apply_op<ShapeFromParamsOp>(ShapeFromParamsOp::make({1, 4}, {0, 0}, {2, 2}), x);
  EXPECT_EQ(y.shape(), (Shape{1, 4}));
}

TEST(TransformerBreakCustomOp, ItsTemporaryCountsInThePeakOfForwardAndBackwardExactly) {
  // x [4,3] float (48 B); the op's output 48 B and its [5,5] temporary 100 B; the loss 4 B.
  Tape<float> tape;
  const VF x = tape.variable(rnd(4, 3, 9));
  const VF y = remat::apply_op<ScratchOp>(x);
  EXPECT_EQ(tape.memory().live_bytes, 96u);
  EXPECT_EQ(tape.memory().peak_bytes, 196u);  // x + y + the temporary while the forward ran
  EXPECT_EQ(tape.memory().saved_bytes, 0u);   // never saved
  const VF loss = remat::sum(y);
  tape.backward(loss);
  // Backward: seed (4) → 104; sum: dy (48) → 152, seed freed → 148; scratch_op: dx (48) → 196, its temporary
  // (100) → 296.
  EXPECT_EQ(tape.memory().peak_bytes, 296u) << describe(tape.memory());
  EXPECT_EQ(tape.memory().live_bytes, 148u) << describe(tape.memory());  // x, y, loss, dx
  EXPECT_TRUE(x.grad().isApprox(MF::Constant(4, 3, 2), 0));
}

TEST(TransformerBreakCustomOp, ThreeInputsWithSomeRequiringGradKeepOnlyWhatTheirBackwardsRead) {
  const std::size_t b = 2 * 3 * sizeof(float);
  struct Case {
    bool a, b, c;
    std::size_t saved;
  };
  for (const Case k : {Case{false, false, true, 0}, Case{true, false, false, b}, Case{false, true, false, b},
                       Case{true, true, false, 2 * b}, Case{true, true, true, 2 * b}, Case{false, false, false, 0}}) {
    SCOPED_TRACE(::testing::Message() << "requires grad: a " << k.a << " b " << k.b << " c " << k.c);
    Tape<float> tape;
    auto leaf = [&](bool variable, std::uint64_t seed) {
      return variable ? tape.variable(rnd(2, 3, seed)) : tape.constant(rnd(2, 3, seed));
    };
    VF a = leaf(k.a, 11), bb = leaf(k.b, 12), c = leaf(k.c, 13);
    const MF av = a.value(), bv = bb.value();
    VF loss = remat::sum(fma(a, bb, c));
    EXPECT_EQ(tape.memory().saved_bytes, k.saved) << describe(tape.memory());
    std::ostringstream report;
    tape.print_saved_residuals(report);
    EXPECT_NE(report.str().find("total " + std::to_string(k.saved) + " B"), std::string::npos) << report.str();
    tape.backward(loss);
    if (k.a) {
      EXPECT_TRUE(same_bits(a.grad(), bv));
    }
    if (k.b) {
      EXPECT_TRUE(same_bits(bb.grad(), av));
    }
    if (k.c) {
      EXPECT_TRUE(same_bits(c.grad(), MF::Ones(2, 3)));
    }
  }
  // One Var as all three inputs: read twice, kept once.
  Tape<float> tape;
  const VF x = tape.variable(rnd(2, 3, 14));
  const VF loss = remat::sum(fma(x, x, x));
  EXPECT_EQ(tape.memory().saved_bytes, b);
  tape.backward(loss);
  EXPECT_TRUE(x.grad().isApprox((2 * x.value().array() + 1).matrix(), 1e-6f));
  const MD w = rndd(2, 3, 15);
  EXPECT_TRUE(passes(remat::gradcheck(
      [&](Tape<double>& t, const std::vector<VD>& v) { return remat::sum(fma(v[0], v[0], v[0]) * t.constant(w)); },
      {rndd(2, 3, 16)})));
}

/// A batched product of its own: kind dot with batch_dims, y = a ⊙ b (to see what the dot policies do).
struct BatchedDotOp : FmaOp {
  static constexpr const char* name = "batched_dot";
  static constexpr remat::OpKind kind = remat::OpKind::dot;
  static constexpr bool batch_dims = true;
  static unsigned reads(remat::GradInputs g) { return FmaOp::reads(g); }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out().array() = c.in(0).array() * c.in(1).array();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    const auto g = c.grad_out().array();
    if (c.wants_grad(0)) c.add_grad(0, g * c.in(1).array());
    if (c.wants_grad(1)) c.add_grad(1, g * c.in(0).array());
  }
};

TEST(TransformerBreakCustomOp, BatchDimsDecideTheDotPoliciesAndAnEmptyIndexListIsRefused) {
  const MF xv = rnd(3, 3, 17);
  auto replayed = [&](const AnyPolicy& policy) {
    Tape<float> tape;
    const VF x = tape.variable(xv);
    const VF y = remat::checkpoint(
        [](const VF& a) {
          const VF s = remat::sin(a);
          return remat::square(remat::apply_op<BatchedDotOp>(s, s));
        },
        policy)(x);
    tape.backward(remat::sum(y));
    return tape.memory().replayed_ops;
  };
  EXPECT_EQ(replayed(remat::policies::dots_saveable), 1u);                     // sin only
  EXPECT_EQ(replayed(remat::policies::dots_with_no_batch_dims_saveable), 2u);  // sin and the batched dot
  Tape<float> tape;
  const VF x = tape.variable(xv);
  const std::size_t nodes = tape.size();
  expect_error_naming<remat::shape_error>([&] { gather_cols(x, {}); }, {"gather_cols", "[3,0]"});
  EXPECT_EQ(tape.size(), nodes);
}

// ================================================================ nested regions, every policy, every new op

struct NetInputs {
  MF x, w, table;
  std::vector<int> ids;
};

NetInputs net_inputs() {
  return {rnd(6, 4, 21), rnd(4, 12, 22), rnd(5, 4, 23), {4, 0, 4, 1, 3, 3}};
}

struct NetResult {
  MF loss, dx, dw, dtable;
};

/// Everything new in one graph of x [6,4] (B = 2 sequences of S = 3, H = 4, 2 heads): an outer region
/// around the attention block, an inner region around attention, a gather, the scratch op, fma, dropout,
/// reshape, transpose, detach, embedding, slice/concat, max_rows, sum_cols and mean_cols. A null policy
/// means no region.
NetResult run_net(const NetInputs& in, const AnyPolicy* outer, const AnyPolicy* inner, bool fused, bool causal,
                  bool eval_before_backward) {
  Tape<float> tape(42);
  const VF x = tape.variable(in.x), w = tape.variable(in.w), table = tape.variable(in.table);
  const std::vector<int> cols = {11, 0, 5, 5};
  auto attention = [&](const VF& h) {
    const VF q = remat::slice_cols(h, 0, 4), k = remat::slice_cols(h, 4, 4), v = remat::slice_cols(h, 8, 4);
    const VF a = fused ? remat::scaled_dot_product_attention(q, k, v, 2, 3, causal)
                       : remat::attention_values(remat::softmax(remat::attention_scores(q, k, 2, 3, causal)), v, 2, 3);
    const VF named = remat::checkpoint_name(a, "attn");
    const VF z = remat::dropout(fma(named, gather_cols(h, cols, "gathered"), remat::apply_op<ScratchOp>(q)), 0.25);
    const VF t = remat::reshape(remat::transpose(z), 6, 4);
    return t + remat::detach(q) * z;
  };
  auto block = [&](const VF& xin) {
    const VF h = remat::tanh(remat::matmul(xin, w));
    const VF e = inner ? remat::checkpoint(attention, *inner)(h) : attention(h);
    const VF both = remat::concat_cols({e, remat::embedding(table, in.ids)});
    return remat::matmul(remat::slice_cols(both, 0, 4), remat::transpose(remat::slice_cols(w, 0, 4))) +
           remat::slice_cols(both, 4, 4) * e;
  };
  const VF y = outer ? remat::checkpoint(block, *outer)(x) : block(x);
  const VF loss = remat::sum(remat::square(y)) + remat::sum(remat::max_rows(y)) +
                  remat::sum(remat::mean_cols(y) * remat::sum_cols(y));
  if (eval_before_backward) tape.set_training(false);  // the replay must still draw the recorded mask
  tape.backward(loss);
  return {MF(loss.value()), MF(x.grad()), MF(w.grad()), MF(table.grad())};
}

TEST(TransformerBreakCheckpoint, NestedRegionsGiveBitwiseEqualGradientsForEveryPolicyPairFusedAndUnfused) {
  const NetInputs in = net_inputs();
  const auto policies = every_policy();
  for (const bool fused : {false, true})
    for (const bool causal : {false, true}) {
      const NetResult plain = run_net(in, nullptr, nullptr, fused, causal, false);
      ASSERT_TRUE(plain.dx.allFinite() && plain.dw.allFinite() && plain.dtable.allFinite());
      auto check = [&](const NetResult& r, const std::string& what) {
        EXPECT_TRUE(same_bits(r.loss, plain.loss)) << what;
        EXPECT_TRUE(same_bits(r.dx, plain.dx)) << what;
        EXPECT_TRUE(same_bits(r.dw, plain.dw)) << what;
        EXPECT_TRUE(same_bits(r.dtable, plain.dtable)) << what;
      };
      const std::string mode = std::string(fused ? "fused" : "unfused") + (causal ? " causal" : "");
      for (const auto& [outer_name, outer] : policies) {
        check(run_net(in, &outer, nullptr, fused, causal, false), mode + ", outer " + outer_name);
        check(run_net(in, nullptr, &outer, fused, causal, false), mode + ", inner " + outer_name);
        for (const auto& [inner_name, inner] : policies)
          check(run_net(in, &outer, &inner, fused, causal, inner_name == outer_name),
                mode + ", outer " + outer_name + ", inner " + inner_name);
      }
    }
}

// ================================================================ attention

VD unfused_attention(const VD& q, const VD& k, const VD& v, Index heads, Index S, bool causal) {
  return remat::attention_values(remat::softmax(remat::attention_scores(q, k, heads, S, causal)), v, heads, S);
}

// Found defect: scaled_dot_product_attention took its three gradient targets (dq, dk, dv) before writing
// any of them, then wrote each (sequence, head) block in the order dv, dq, dk. When two of q, k, v are the
// same Var (self-attention written as sdpa(x, x, x), or k = v) and the op is that Var's first gradient
// contribution, the later target is told to accumulate: dv's block was added to the uninitialised buffer and
// then overwritten by dq's assignment, so the gradient silently lacked dv (k = v: dk overwrote dv). Fixed in
// include/remat/ops/scaled_dot_product_attention.hpp: the targets are taken in the order they are written.
TEST(TransformerBreakAttention, FusedSelfAttentionWithSharedInputsPassesTheGradcheck) {
  const Index S = 3, H = 4, heads = 2;
  const MD w = rndd(2 * S, H, 31);
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    auto loss = [&](int which) {
      return [&, which](Tape<double>& t, const std::vector<VD>& v) {
        const VD& a = v[0];
        const VD& b = v.size() > 1 ? v[1] : v[0];
        VD y;
        switch (which) {
          case 0:  // q = k = v
            y = remat::scaled_dot_product_attention(a, a, a, heads, S, causal);
            break;
          case 1:  // k = v
            y = remat::scaled_dot_product_attention(b, a, a, heads, S, causal);
            break;
          case 2:  // q = v
            y = remat::scaled_dot_product_attention(a, b, a, heads, S, causal);
            break;
          case 3:  // q = k
            y = remat::scaled_dot_product_attention(a, a, b, heads, S, causal);
            break;
          default:  // the unfused ops, q = k = v
            y = unfused_attention(a, a, a, heads, S, causal);
        }
        return remat::sum(y * t.constant(w));
      };
    };
    const MD x = rndd(2 * S, H, 32, -2, 2), other = rndd(2 * S, H, 33, -2, 2);
    EXPECT_TRUE(passes(remat::gradcheck(loss(0), {x}))) << "q = k = v";
    EXPECT_TRUE(passes(remat::gradcheck(loss(1), {x, other}))) << "k = v";
    EXPECT_TRUE(passes(remat::gradcheck(loss(2), {x, other}))) << "q = v";
    EXPECT_TRUE(passes(remat::gradcheck(loss(3), {x, other}))) << "q = k";
    EXPECT_TRUE(passes(remat::gradcheck(loss(4), {x}))) << "unfused q = k = v";
  }
}

TEST(TransformerBreakAttention, SharedInputsOfTheUnfusedOpsPassTheGradcheck) {
  const Index S = 4, H = 4;
  for (const bool causal : {false, true}) {
    // attention_scores(x, x): dq and dk into one buffer.
    const MD ws = rndd(2 * 2 * S, S, 34);
    EXPECT_TRUE(passes(remat::gradcheck(
        [&](Tape<double>& t, const std::vector<VD>& v) {
          const VD s = remat::attention_scores(v[0], v[0], 2, S, causal);
          return remat::sum(remat::softmax(s) * t.constant(ws));
        },
        {rndd(2 * S, H, 35, -2, 2)})))
        << causal;
  }
  // attention_values(p, v) with p any matrix (not probabilities; negative entries) and with p = v (one head,
  // S = H, so p [B·S, S] and v [B·S, H] have one shape).
  const MD wv = rndd(2 * S, H, 36);
  EXPECT_TRUE(passes(remat::gradcheck(
      [&](Tape<double>& t, const std::vector<VD>& v) {
        return remat::sum(remat::attention_values(v[0], v[1], 2, S) * t.constant(wv));
      },
      {rndd(2 * 2 * S, S, 37, -3, 3), rndd(2 * S, H, 38, -2, 2)})));
  EXPECT_TRUE(passes(remat::gradcheck(
      [&](Tape<double>& t, const std::vector<VD>& v) {
        return remat::sum(remat::attention_values(v[0], v[0], 1, S) * t.constant(wv));
      },
      {rndd(2 * S, S, 39, -2, 2)})));
}

/// Runs fused or unfused attention in float on its own tape; returns y, dq, dk, dv for loss sum(y ⊙ w).
struct AttentionRun {
  MF y, dq, dk, dv;
};
AttentionRun run_attention(const MF& q, const MF& k, const MF& v, const MF& w, Index heads, Index S, bool causal,
                           bool fused) {
  Tape<float> tape;
  const VF vq = tape.variable(q), vk = tape.variable(k), vv = tape.variable(v);
  const VF y =
      fused ? remat::scaled_dot_product_attention(vq, vk, vv, heads, S, causal)
            : remat::attention_values(remat::softmax(remat::attention_scores(vq, vk, heads, S, causal)), vv, heads, S);
  tape.backward(remat::sum(y * tape.constant(w)));
  return {MF(y.value()), MF(vq.grad()), MF(vk.grad()), MF(vv.grad())};
}

double max_abs_diff(const MF& a, const MF& b) {
  return (a - b).cwiseAbs().maxCoeff();
}

TEST(TransformerBreakAttention, DegenerateLayoutsAgreeFusedAndUnfused) {
  struct Layout {
    Index B, S, H, heads;
  };
  for (const Layout l : {Layout{1, 1, 4, 4}, Layout{3, 1, 4, 2}, Layout{1, 1, 1, 1}, Layout{1, 5, 3, 3},
                         Layout{2, 4, 6, 6}, Layout{1, 6, 2, 1}})
    for (const bool causal : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "B " << l.B << " S " << l.S << " H " << l.H << " heads " << l.heads
                                        << (causal ? " causal" : ""));
      const MF q = rnd(l.B * l.S, l.H, 41), k = rnd(l.B * l.S, l.H, 42), v = rnd(l.B * l.S, l.H, 43),
               w = rnd(l.B * l.S, l.H, 44);
      const AttentionRun f = run_attention(q, k, v, w, l.heads, l.S, causal, true);
      const AttentionRun u = run_attention(q, k, v, w, l.heads, l.S, causal, false);
      EXPECT_LT(max_abs_diff(f.y, u.y), 1e-6);
      EXPECT_LT(max_abs_diff(f.dq, u.dq), 1e-5);
      EXPECT_LT(max_abs_diff(f.dk, u.dk), 1e-5);
      EXPECT_LT(max_abs_diff(f.dv, u.dv), 1e-5);
      if (l.S == 1) {  // one position: softmax of one score is 1, so y = v and no gradient reaches q or k
        EXPECT_TRUE(same_bits(f.y, v));
        EXPECT_TRUE(same_bits(u.y, v));
        EXPECT_TRUE(same_bits(f.dv, w));
        EXPECT_LT(f.dq.cwiseAbs().maxCoeff(), 1e-7);
        EXPECT_LT(f.dk.cwiseAbs().maxCoeff(), 1e-7);
      }
      if (causal) {  // the first position attends to itself alone
        for (Index b = 0; b < l.B; ++b) EXPECT_TRUE(same_bits(f.y.row(b * l.S), v.row(b * l.S)));
      }
    }
}

TEST(TransformerBreakAttention, LargeScoresStayFiniteAndFusedMatchesUnfusedInFloat) {
  // Scores of magnitude ~1e4: the softmax must subtract the row maximum (fused: the log-sum-exp). The
  // reference is the unfused graph in double on the same float inputs.
  const Index B = 2, S = 5, H = 4, heads = 2;
  const MF q = rnd(B * S, H, 51, -100, 100), k = rnd(B * S, H, 52, -100, 100), v = rnd(B * S, H, 53),
           w = rnd(B * S, H, 54);
  for (const bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    Tape<double> tape;
    const VD dq = tape.variable(q.cast<double>()), dk = tape.variable(k.cast<double>()),
             dv = tape.variable(v.cast<double>());
    const VD y = unfused_attention(dq, dk, dv, heads, S, causal);
    tape.backward(remat::sum(y * tape.constant(w.cast<double>())));
    const MF ry = y.value().cast<float>(), rdq = dq.grad().cast<float>(), rdk = dk.grad().cast<float>(),
             rdv = dv.grad().cast<float>();
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(fused ? "fused" : "unfused");
      const AttentionRun r = run_attention(q, k, v, w, heads, S, causal, fused);
      ASSERT_TRUE(r.y.allFinite() && r.dq.allFinite() && r.dk.allFinite() && r.dv.allFinite());
      // float scores of 1e4 carry rounding errors of ~1e-3: the probabilities, and so y, to about 1e-2
      EXPECT_LT(max_abs_diff(r.y, ry), 2e-2);
      EXPECT_LT(max_abs_diff(r.dv, rdv), 2e-2);
      const double scale = std::max(1.0, static_cast<double>(rdq.cwiseAbs().maxCoeff()));
      EXPECT_LT(max_abs_diff(r.dq, rdq) / scale, 5e-2);
      EXPECT_LT(max_abs_diff(r.dk, rdk) / std::max(1.0, static_cast<double>(rdk.cwiseAbs().maxCoeff())), 5e-2);
    }
  }
}

TEST(TransformerBreakAttention, CausalRowsWhoseOnlyFiniteScoreIsTheDiagonal) {
  // One head of width S: q_i = 1e20·e_i, k_j = e_j − 1e20·Σ_{i>j} e_i, so score (i, i) = 1e20/√S is finite
  // and every unmasked score left of the diagonal overflows to −∞ in float: each row's probabilities are
  // exactly one-hot on the diagonal (y = v) and the gradients must stay finite (no ∞ − ∞, no 0·∞).
  const Index S = 4;
  MF q = MF::Zero(S, S), k = MF::Zero(S, S);
  for (Index i = 0; i < S; ++i) q(i, i) = 1e20f;
  for (Index j = 0; j < S; ++j) {
    k(j, j) = 1;
    for (Index i = j + 1; i < S; ++i) k(j, i) = -1e20f;
  }
  const MF v = rnd(S, S, 55), w = rnd(S, S, 56);
  for (const bool fused : {false, true}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    const AttentionRun r = run_attention(q, k, v, w, 1, S, true, fused);
    EXPECT_TRUE(same_bits(r.y, v)) << r.y;
    EXPECT_TRUE(same_bits(r.dv, w)) << r.dv;
    EXPECT_TRUE(r.dq.allFinite()) << r.dq;
    EXPECT_TRUE(r.dk.allFinite()) << r.dk;
  }
}

TEST(TransformerBreakAttention, ANaNInOneSequenceStaysInThatSequence) {
  const Index B = 2, S = 3, H = 4, heads = 2;
  MF q = rnd(B * S, H, 57), k = rnd(B * S, H, 58), v = rnd(B * S, H, 59);
  const MF w = rnd(B * S, H, 60);
  q(1, 0) = std::numeric_limits<float>::quiet_NaN();  // sequence 0, head 0
  for (const bool causal : {false, true})
    for (const bool fused : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (fused ? "fused" : "unfused") << (causal ? " causal" : ""));
      const AttentionRun r = run_attention(q, k, v, w, heads, S, causal, fused);
      const AttentionRun u = run_attention(q, k, v, w, heads, S, causal, false);
      EXPECT_TRUE(r.y.bottomRows(S).allFinite());
      EXPECT_TRUE(r.dq.bottomRows(S).allFinite() && r.dk.bottomRows(S).allFinite() && r.dv.bottomRows(S).allFinite());
      EXPECT_LT(max_abs_diff(r.y.bottomRows(S), u.y.bottomRows(S)), 1e-6);
      EXPECT_LT(max_abs_diff(r.dk.bottomRows(S), u.dk.bottomRows(S)), 1e-5);
      EXPECT_TRUE(std::isnan(r.y(1, 0)));  // row 1 of head 0 reads the NaN score
    }
}

// ================================================================ data-movement ops

TEST(TransformerBreakEmbedding, EveryIdTheSameAndAHugeTableAndIdsChangedBeforeTheReplay) {
  {
    Tape<float> tape;
    const MF tv = rnd(7, 3, 61);
    const VF table = tape.variable(tv);
    std::vector<int> ids(5, 6);
    const VF y = remat::checkpoint([&](const VF& t) { return remat::square(remat::embedding(t, ids)); })(table);
    ids.assign(500, 0);  // the tape copied the ids: the replay must use the original ones
    tape.backward(remat::sum(y));
    EXPECT_EQ(tape.memory().replayed_ops, 1u);
    MF expected = MF::Zero(7, 3);
    expected.row(6) = 10 * tv.row(6);
    EXPECT_TRUE(table.grad().isApprox(expected, 1e-6f)) << table.grad();
  }
  {
    const Index V = Index{1} << 20;  // 4 MiB of float
    Tape<float> tape;
    MF tv = MF::Zero(V, 1);
    tv(V - 1, 0) = 3;
    tv(0, 0) = -2;
    const VF table = tape.variable(tv);
    const VF y = remat::embedding(table, {static_cast<int>(V - 1), 0, static_cast<int>(V - 1)});
    EXPECT_EQ(y.value()(0, 0), 3);
    EXPECT_EQ(y.value()(1, 0), -2);
    tape.backward(remat::sum(remat::square(y)));
    EXPECT_EQ(table.grad()(V - 1, 0), 12);
    EXPECT_EQ(table.grad()(0, 0), -4);
    EXPECT_EQ(table.grad().cwiseAbs().sum(), 16);
    expect_error_naming<remat::index_error>(
        [&] {
          remat::embedding(table, {0, static_cast<int>(V)});
        },
        {"embedding", std::to_string(V)});
  }
}

TEST(TransformerBreakDataMovement, ConcatSliceReshapeTransposeAtTheirEdges) {
  const MD w = rndd(9, 12, 62);
  auto check = [&](const char* what, std::function<VD(const std::vector<VD>&)> f, std::vector<MD> inputs) {
    EXPECT_TRUE(passes(remat::gradcheck(
        [&](Tape<double>& t, const std::vector<VD>& v) {
          const VD y = f(v);
          return remat::sum(y * t.constant(w.topLeftCorner(y.rows(), y.cols())));
        },
        std::move(inputs))))
        << what;
  };
  const MD a = rndd(3, 2, 63), b = rndd(3, 1, 64), c = rndd(3, 3, 65);
  check("concat of the same Var twice", [](const std::vector<VD>& v) { return remat::concat_cols({v[0], v[0]}); }, {a});
  check("concat of five parts with repeats",
        [](const std::vector<VD>& v) {
          return remat::concat_cols({v[0], v[1], v[0], v[2], v[1]});
        },
        {a, b, c});
  check("slice of the full width", [](const std::vector<VD>& v) { return remat::slice_cols(v[0], 0, 3); }, {c});
  check("slice of the last column", [](const std::vector<VD>& v) { return remat::slice_cols(v[0], 2, 1); }, {c});
  check("reshape round trip",
        [](const std::vector<VD>& v) {
          return remat::reshape(remat::reshape(remat::reshape(v[0], 1, 9), 9, 1), 3, 3) * remat::reshape(v[0], 3, 3);
        },
        {c});
  check("reshape [3,3] to [1,9]", [](const std::vector<VD>& v) { return remat::reshape(v[0], 1, 9); }, {c});
  check("transpose of 1×n", [](const std::vector<VD>& v) { return remat::transpose(remat::reshape(v[0], 1, 9)); }, {c});

  Tape<float> tape;
  const VF x = tape.variable(rnd(2, 6, 66));
  const std::size_t nodes = tape.size();
  const VF one = remat::concat_cols({x});
  EXPECT_EQ(one.id(), x.id());  // one part is returned as it is, nothing recorded
  EXPECT_EQ(tape.size(), nodes);
  const VF round = remat::reshape(remat::reshape(remat::reshape(x, 3, 4), 12, 1), 2, 6);
  EXPECT_TRUE(same_bits(round.value(), x.value()));
  EXPECT_TRUE(same_bits(remat::transpose(remat::transpose(x)).value(), x.value()));
  const MF row = MF(x.value()).reshaped<Eigen::RowMajor>(1, 12);
  EXPECT_TRUE(same_bits(remat::reshape(x, 1, 12).value(), row));
  EXPECT_TRUE(same_bits(remat::transpose(remat::reshape(x, 1, 12)).value(), row.transpose()));
}

// Found defect: concat_cols of k ≥ 3 parts records a tree of two-part concatenations, and checked each pair
// only when it recorded it: a bad part (a different number of rows, an empty or stale Var, another tape's
// Var, a value that escaped a checkpointed function, a modified Parameter) threw after the pairs before it
// were recorded, so the tape grew by those nodes and its peak_bytes by their buffers; the row error also
// named the intermediate concatenation's shape, not the parts'. Fixed in include/remat/ops/concat_cols.hpp:
// every part is checked before anything is recorded (TapeState::check_input, the record's own checks).
TEST(TransformerBreakDataMovement, ConcatWithABadPartThrowsBeforeRecordingAnyPair) {
  Tape<float> tape, other;
  remat::Parameter<float> p(rnd(2, 1, 69));
  const VF a = tape.variable(rnd(2, 1, 70)), b = tape.variable(rnd(2, 2, 71)), c = tape.variable(rnd(2, 3, 72));
  const VF wrong_rows = tape.variable(rnd(3, 1, 73)), foreign = other.variable(rnd(2, 1, 74));
  const VF param = tape.variable(p);
  VF escaped;
  const VF returned = remat::checkpoint([&](const VF& in) {
    escaped = remat::tanh(in);
    return remat::sin(in);
  })(a);
  const remat::MemoryStats before = tape.memory();
  const std::size_t nodes = tape.size();
  auto expect_unchanged = [&](const char* what) {
    EXPECT_EQ(tape.size(), nodes) << what;
    EXPECT_TRUE(same_memory(tape.memory(), before)) << what << ": " << describe(tape.memory());
  };
  // The bad part first and last: whichever pair the recursion records first, nothing may stay.
  for (const bool bad_first : {true, false}) {
    auto parts = [&](const VF& bad) {
      return bad_first ? std::vector<VF>{bad, a, b, c, a} : std::vector<VF>{a, b, c, a, bad};
    };
    const std::string at = bad_first ? "0" : "4";
    expect_error_naming<remat::shape_error>([&] { remat::concat_cols(parts(wrong_rows)); },
                                            {"concat_cols", "part " + at, "[3,1]", "[2,1]"});
    expect_unchanged("rows");
    expect_error_naming<remat::tape_error>([&] { remat::concat_cols(parts(foreign)); }, {"concat_cols"});
    expect_unchanged("foreign");
    expect_error_naming<remat::tape_error>([&] { remat::concat_cols(parts(VF())); }, {"concat_cols", "empty"});
    expect_unchanged("empty");
    expect_error_naming<remat::tape_error>([&] { remat::concat_cols(parts(escaped)); }, {"concat_cols"});
    expect_unchanged("escaped");
  }
  p.mutable_value()(0, 0) += 1;  // the recorded Parameter changes
  expect_error_naming<remat::stale_value_error>([&] { remat::concat_cols({a, b, c, param}); }, {"concat_cols"});
  expect_unchanged("stale parameter");
  // The tape is usable: a five-part concatenation with repeats and a region output.
  const VF y = remat::concat_cols({a, b, returned, c, a});
  EXPECT_EQ(y.shape(), (Shape{2, 8}));
  tape.backward(remat::sum(y));
  EXPECT_EQ(b.grad(), MF::Ones(2, 2));
}

// Found defect: concat_cols of k ≥ 3 parts was not strongly exception safe for std::bad_alloc. Its two-part
// records each were, but a failure in a later pair left the earlier pairs on the tape (size() and peak_bytes
// changed), against the guarantee of docs/design.md §3 for a library call. Fixed: concat_cols reserves the
// buffers and nodes of its whole tree (Recorder::reserve_records) before it records the first pair. Checked
// outside regions and inside a checkpointed function (which also reserves what closing the region needs),
// failing each pool miss in turn; the tape stays usable and its gradients right.
TEST(TransformerBreakDataMovement, ConcatOfManyPartsIsStronglyExceptionSafeForBadAlloc) {
  const MF av = rnd(2, 1, 75), bv = rnd(2, 2, 76), cv = rnd(2, 3, 77);
  for (const bool in_region : {false, true}) {
    SCOPED_TRACE(in_region ? "inside a checkpointed function" : "outside regions");
    long misses = 0;
    {
      Tape<float> tape;
      const VF a = tape.variable(av), b = tape.variable(bv), c = tape.variable(cv);
      fault::Scope count(-1);
      remat::concat_cols({a, b, c, a});
      misses = fault::misses;
    }
    ASSERT_GE(misses, 2);  // a new size at each level of the tree
    for (long k = 1; k <= misses; ++k) {
      SCOPED_TRACE("failing pool miss " + std::to_string(k));
      Tape<float> tape;
      const VF a = tape.variable(av), b = tape.variable(bv), c = tape.variable(cv);
      auto attempt = [&](const VF& x) {
        const VF t = remat::tanh(x);  // a region member before the failing call
        const std::size_t nodes = tape.size();
        const remat::MemoryStats before = tape.memory();
        {
          fault::Scope inject(k);
          EXPECT_THROW(remat::concat_cols({t, b, c, t}), std::bad_alloc);
        }
        EXPECT_EQ(tape.size(), nodes);
        EXPECT_TRUE(same_memory(tape.memory(), before)) << describe(tape.memory()) << " vs " << describe(before);
        return remat::concat_cols({t, b, c, t});
      };
      const VF y = in_region ? remat::checkpoint(attempt)(a) : attempt(a);
      EXPECT_EQ(y.shape(), (Shape{2, 7}));
      tape.backward(remat::sum(y));
      EXPECT_EQ(b.grad(), MF::Ones(2, 2));
      const MF tanh_derivative = 1 - av.array().tanh().square();
      EXPECT_TRUE(a.grad().isApprox(2 * tanh_derivative)) << a.grad();
    }
  }
}

// Found defect: slice_cols checked begin + count > n and reshape checked rows·cols ≠ m·n in Index arithmetic
// that overflows (signed overflow: UB, reported by UBSan): slice_cols(x, INT64_MAX, 1) passed the check and
// read far outside x, slice_cols(x, 1, INT64_MAX) became a huge allocation (std::bad_alloc, not shape_error),
// and reshape(x [2,6], 4, 2^62 + 3) — whose product wraps to 12 — was recorded as a [4, 2^62+3] value of 12
// elements. Fixed in include/remat/ops/slice_cols.hpp and reshape.hpp: the checks cannot overflow.
TEST(TransformerBreakDataMovement, HugeSliceAndReshapeArgumentsThrowShapeErrorWithoutOverflow) {
  Tape<float> tape;
  const VF x = tape.variable(rnd(2, 6, 67));
  const remat::MemoryStats before = tape.memory();
  const std::size_t nodes = tape.size();
  const Index big = std::numeric_limits<Index>::max();
  expect_error_naming<remat::shape_error>([&] { remat::slice_cols(x, big, 1); }, {"slice_cols", "[2,6]"});
  expect_error_naming<remat::shape_error>([&] { remat::slice_cols(x, 1, big); }, {"slice_cols", "[2,6]"});
  expect_error_naming<remat::shape_error>([&] { remat::slice_cols(x, big - 2, big - 2); }, {"slice_cols"});
  expect_error_naming<remat::shape_error>([&] { remat::slice_cols(x, 2, 0); }, {"slice_cols"});
  expect_error_naming<remat::shape_error>([&] { remat::slice_cols(x, -1, 2); }, {"slice_cols"});
  expect_error_naming<remat::shape_error>([&] { remat::reshape(x, 4, (Index{1} << 62) + 3); }, {"reshape", "[2,6]"});
  expect_error_naming<remat::shape_error>([&] { remat::reshape(x, Index{1} << 32, Index{1} << 32); },
                                          {"reshape", "[2,6]"});
  expect_error_naming<remat::shape_error>([&] { remat::reshape(x, big, big); }, {"reshape"});
  expect_error_naming<remat::shape_error>([&] { remat::reshape(x, 5, 2); }, {"reshape", "[5,2]"});
  expect_error_naming<remat::shape_error>([&] { remat::reshape(x, -3, -4); }, {"reshape"});
  EXPECT_EQ(tape.size(), nodes);
  EXPECT_TRUE(same_memory(tape.memory(), before));
}

TEST(TransformerBreakReductions, SingleRowsTiesAndNaNRows) {
  Tape<float> tape;
  MF xv(3, 4);
  xv << 1, 5, 5, 2,                                                  // a tie: the first maximum
      -1, -1, -1, -1,                                                // all tied
      std::numeric_limits<float>::quiet_NaN(), 0, 1, std::nanf("");  // NaN
  const VF x = tape.variable(xv);
  const VF m = remat::max_rows(x);
  EXPECT_EQ(m.value()(0, 0), 5);
  EXPECT_EQ(m.value()(1, 0), -1);
  EXPECT_EQ(remat::argmax_rows(x), (std::vector<int>{1, 0, 0}));  // NaN first: nothing compares greater
  tape.backward(remat::sum(m * tape.constant(MF::Constant(3, 1, 3))));
  EXPECT_EQ(x.grad()(0, 1), 3);
  EXPECT_EQ(x.grad()(0, 2), 0);
  EXPECT_EQ(x.grad()(1, 0), 3);
  EXPECT_EQ(x.grad().row(1).sum(), 3);
  EXPECT_EQ(x.grad().row(2).cwiseAbs().sum(), 3);  // whatever the NaN row's maximum, one element gets dy
  // One row: sum_cols and mean_cols are the row itself; dx is dy (and dy / 1).
  Tape<float> t2;
  const VF r = t2.variable(rnd(1, 5, 68));
  EXPECT_TRUE(same_bits(remat::sum_cols(r).value(), r.value()));
  EXPECT_TRUE(same_bits(remat::mean_cols(r).value(), r.value()));
  t2.backward(remat::sum(remat::sum_cols(r) + remat::mean_cols(r)));
  EXPECT_TRUE(same_bits(r.grad(), MF::Constant(1, 5, 2)));
}

// ================================================================ detach and stops_gradient

// Found defect: Tape::gradient(loss, {x}) marked every node downstream of x as wanted, ignoring that a detach
// (or a user op with stops_gradient) cuts the path. So the sweep ran detach's backward, which writes nothing,
// into a freshly allocated gradient buffer of x: gradient(sum(detach(x)), {x}) returned uninitialised pool
// memory (a stale buffer's contents) instead of zeros; and it ran the backward of ops after the detach, which
// had kept no residuals (they require no gradient): gradient(sum(tanh(detach(x))), {x}) made tanh's backward
// read its freed output (a null pointer: SEGV). Fixed in include/remat/detail/tape_state.hpp: in gradient() a
// node is wanted only if it requires a gradient.
TEST(TransformerBreakDetach, GradientThroughADetachedPathIsZeroAndReadsNothingFreed) {
  for (const bool user_op : {false, true}) {
    SCOPED_TRACE(user_op ? "user op with stops_gradient" : "detach");
    auto stop = [&](const VF& v) { return user_op ? remat::apply_op<UserStopOp>(v) : remat::detach(v); };
    Tape<float> tape;
    const VF x = tape.variable(rnd(3, 4, 71));
    {  // leave buffers of x's size with non-zero contents in the pool
      const VF junk1 = remat::exp(x), junk2 = remat::exp(junk1), junk3 = remat::exp(junk2);
    }
    const VF only_detached = remat::sum(stop(x));
    const VF after_detach = remat::sum(remat::tanh(stop(x)));
    const VF mixed = remat::sum(stop(x) * x);  // d/dx = stop(x) = x
    const VF tied = remat::sum(remat::sigmoid(stop(x)) * remat::tanh(x));
    auto g = tape.gradient(only_detached, {x}, true);
    EXPECT_TRUE(g[0].isZero(0)) << g[0];
    g = tape.gradient(after_detach, {x}, true);
    EXPECT_TRUE(g[0].isZero(0)) << g[0];
    g = tape.gradient(mixed, {x}, true);
    EXPECT_TRUE(same_bits(g[0], x.value())) << g[0];
    g = tape.gradient(tied, {x}, true);
    const MF xv = x.value();
    const MF t = xv.array().tanh().matrix();
    const MF s = (1 / (1 + (-xv.array()).exp())).matrix();
    EXPECT_TRUE(g[0].isApprox((s.array() * (1 - t.array() * t.array())).matrix(), 1e-5f)) << g[0];
    // A detached value depends on no variable: differentiating by it is refused.
    const VF stopped = stop(x);
    expect_error_naming<remat::tape_error>([&] { tape.gradient(remat::sum(stopped), {stopped}, true); },
                                           {"gradient", "does not depend on any variable"});
    // backward agrees, and a backward from a loss with no gradient path is a no-op.
    tape.backward(after_detach, true);
    EXPECT_TRUE(x.grad().isZero(0));
    tape.backward(mixed);
    EXPECT_TRUE(same_bits(x.grad(), xv));
  }
}

TEST(TransformerBreakDetach, DetachOfAParameterInsideARegionAndALossOfDetachedValuesOnly) {
  remat::Parameter<float> p(rnd(3, 3, 72));
  const MF xv = rnd(3, 3, 73);
  for (const auto& [name, policy] : every_policy()) {
    SCOPED_TRACE(name);
    p.zero_grad();
    Tape<float> tape;
    const VF x = tape.variable(xv), w = tape.variable(p);
    const VF y = remat::checkpoint(
        [&](const VF& a) { return remat::matmul(remat::detach(remat::tanh(a)), remat::detach(w)) * remat::sin(a); },
        policy)(x);
    tape.backward(remat::sum(y));
    EXPECT_FALSE(p.has_grad());  // detached: no gradient, not even a zero one
    Tape<float> plain;
    const VF px = plain.variable(xv), pw = plain.constant(p.value());
    plain.backward(remat::sum(remat::matmul(remat::detach(remat::tanh(px)), pw) * remat::sin(px)));
    EXPECT_TRUE(same_bits(x.grad(), px.grad()));
  }
  // A loss computed only from detached values: backward runs and adds nothing.
  Tape<float> tape;
  const VF w = tape.variable(p);
  const VF loss = remat::sum(remat::square(remat::detach(w)));
  EXPECT_FALSE(loss.requires_grad());
  tape.backward(loss);
  EXPECT_FALSE(p.has_grad());
  EXPECT_TRUE(p.grad().isZero(0));
}

// ================================================================ training mode and replay

TEST(TransformerBreakTraining, DropoutRecordedInTrainingModeReplaysItsMaskAfterSetTrainingFalse) {
  const MF xv = rnd(4, 6, 81);
  auto run = [&](bool checkpointed, bool toggle_inside) {
    Tape<float> tape(7);
    const VF x = tape.variable(xv);
    auto f = [&](const VF& a) {
      VF h = remat::dropout(remat::tanh(a), 0.5);
      if (toggle_inside) {
        tape.set_training(false);  // evaluation mode inside the function: this dropout records nothing
        h = remat::dropout(h, 0.5);
        tape.set_training(true);
      }
      return remat::square(remat::dropout(h, 0.3));
    };
    const VF y = checkpointed ? remat::checkpoint(f)(x) : f(x);
    tape.set_training(false);  // toggled between forward and backward
    tape.backward(remat::sum(y));
    return std::make_pair(MF(y.value()), MF(x.grad()));
  };
  for (const bool toggle : {false, true}) {
    const auto plain = run(false, toggle), ckpt = run(true, toggle);
    EXPECT_TRUE(same_bits(plain.first, ckpt.first));
    EXPECT_TRUE(same_bits(plain.second, ckpt.second));
    EXPECT_GT((plain.second.array() == 0).count(), 0);  // the masks dropped something
  }
}

TEST(TransformerBreakTraining, ARegionWhoseFunctionRecordsNothingInEvaluationMode) {
  Tape<float> tape;
  tape.set_training(false);
  const VF x = tape.variable(rnd(2, 3, 82));
  const std::size_t nodes = tape.size();
  const VF y = remat::checkpoint([](const VF& a) { return remat::dropout(a, 0.5); })(x);
  EXPECT_EQ(y.id(), x.id());  // dropout is the identity: the region returned its input
  EXPECT_EQ(tape.size(), nodes);
  tape.backward(remat::sum(remat::square(y)));
  EXPECT_TRUE(x.grad().isApprox((2 * x.value().array()).matrix()));
  EXPECT_EQ(tape.memory().replayed_ops, 0u);
}

// ================================================================ memory: the fused op's temporary in replays

TEST(TransformerBreakMemory, FusedAttentionInAReplayCountsItsTemporaryAndStatisticsExactly) {
  // q, k, v [2,2] float (16 B each), one head, S = 2: y 16 B, log-sum-exp [2,1] 8 B, temporary [4,2] 32 B.
  // Region (nothing_saveable): square(sdpa(q, k, v)); square reads sdpa's output, so the replay re-runs sdpa.
  Tape<float> tape;
  const VF q = tape.variable(rnd(2, 2, 91)), k = tape.variable(rnd(2, 2, 92)), v = tape.variable(rnd(2, 2, 93));
  const VF y = remat::checkpoint([](const VF& a, const VF& b, const VF& c) {
    return remat::square(remat::scaled_dot_product_attention(a, b, c, 1, 2, true));
  })(q, k, v);
  const VF loss = remat::sum(y);
  // Forward: 48 + y 16 + lse 8 + temporary 32 = 104 at the peak; the region dropped sdpa's output and lse.
  EXPECT_EQ(tape.memory().peak_bytes, 104u) << describe(tape.memory());
  EXPECT_EQ(tape.memory().live_bytes, 68u) << describe(tape.memory());   // q, k, v, y, loss
  EXPECT_EQ(tape.memory().saved_bytes, 48u) << describe(tape.memory());  // the replay's sources q, k, v
  tape.backward(loss);
  // Backward: seed 4 → 72; sum: dy 16 → 88, seed freed → 84; replay: sdpa 16 + lse 8 + temporary 32 → 140,
  // temporary freed → 108; square: d sdpa 16 → 124, dy freed → 108; sdpa: dq, dk, dv 48 → 156, temporary 32
  // → 188 (the peak); then its temporary, its gradient, its output and lse go → 116.
  EXPECT_EQ(tape.memory().peak_bytes, 188u) << describe(tape.memory());
  EXPECT_EQ(tape.memory().live_bytes, 116u) << describe(tape.memory());
  EXPECT_EQ(tape.memory().replayed_bytes, 24u);
  EXPECT_EQ(tape.memory().replayed_ops, 1u);
}

TEST(TransformerBreakMemory, AttentionKeepsOnlyWhatItsBackwardReadsForTheGradientsAskedFor) {
  // B = 1, S = 3, H = 2, one head, float: q, k, v, y 24 B each; the fused op's log-sum-exp [3,1] 12 B.
  const std::size_t t = 3 * 2 * sizeof(float), lse = 3 * sizeof(float);
  struct Case {
    bool q, k, v;
    std::size_t fused, scores;  // saved bytes of sdpa(q, k, v); of attention_scores(q, k)
  };
  for (const Case c : {Case{false, false, false, 0, 0}, Case{false, false, true, 2 * t + lse, 0},
                       Case{true, false, false, 4 * t + lse, t}, Case{false, true, false, 4 * t + lse, t},
                       Case{true, true, true, 4 * t + lse, 2 * t}}) {
    SCOPED_TRACE(::testing::Message() << "requires grad: q " << c.q << " k " << c.k << " v " << c.v);
    for (const bool fused : {true, false}) {
      Tape<float> tape;
      auto leaf = [&](bool variable, std::uint64_t seed) {
        return variable ? tape.variable(rnd(3, 2, seed)) : tape.constant(rnd(3, 2, seed));
      };
      const VF q = leaf(c.q, 1), k = leaf(c.k, 2), v = leaf(c.v, 3);
      const VF loss = remat::sum(fused ? remat::scaled_dot_product_attention(q, k, v, 1, 3, true)
                                       : remat::attention_scores(q, k, 1, 3, false));
      EXPECT_EQ(tape.memory().saved_bytes, fused ? c.fused : c.scores)
          << (fused ? "fused " : "scores ") << describe(tape.memory());
      tape.backward(loss);
      EXPECT_EQ(tape.memory().saved_bytes, 0u);
    }
  }
}

/// x [10,4] → matmul(x, w) → (attention in a dots_saveable region) → tanh, all in a nothing_saveable region;
/// loss sum(square(·)). B = 2 sequences of S = 5, 2 heads.
struct FaultNet {
  VF x, w, loss;
  void record(Tape<float>& tape, const MF& xv, const MF& wv, bool fused) {
    x = tape.variable(xv);
    w = tape.variable(wv);
    auto attention = [fused](const VF& h) {
      const VF q = remat::slice_cols(h, 0, 4), k = remat::slice_cols(h, 4, 4), v = remat::slice_cols(h, 8, 4);
      return fused ? remat::scaled_dot_product_attention(q, k, v, 2, 5, true)
                   : remat::attention_values(remat::softmax(remat::attention_scores(q, k, 2, 5, true)), v, 2, 5);
    };
    const VF y = remat::checkpoint(
        [&](const VF& a) {
          const VF h = remat::matmul(a, w);
          return remat::tanh(remat::checkpoint(attention, remat::policies::dots_saveable)(h));
        },
        remat::policies::nothing_saveable)(x);
    loss = remat::sum(remat::square(y));
  }
};

// Every system allocation of a tensor buffer during a backward must happen in the reservation before the
// sweep changes anything. If the real pass (noexcept) needed a buffer its dry run did not foresee — a
// temporary of a replayed op, say — the injected std::bad_alloc would terminate the program.
TEST(TransformerBreakMemory, AttentionBackwardInsideRegionsAllocatesOnlyInItsReservation) {
  const MF xv = rnd(10, 4, 94), wv = rnd(4, 12, 95);
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    MF dx, dw;
    long misses = 0;
    {
      Tape<float> tape;
      FaultNet net;
      net.record(tape, xv, wv, fused);
      fault::Scope count(-1);
      tape.backward(net.loss);
      misses = fault::misses;
      dx = net.x.grad();
      dw = net.w.grad();
    }
    ASSERT_GT(misses, 0);
    for (long k = 1; k <= misses; ++k) {
      SCOPED_TRACE(::testing::Message() << "pool miss " << k << " of " << misses << " fails");
      Tape<float> tape;
      FaultNet net;
      net.record(tape, xv, wv, fused);
      const remat::MemoryStats before = tape.memory();
      {
        fault::Scope inject(k);
        EXPECT_THROW(tape.backward(net.loss), std::bad_alloc);
      }
      EXPECT_TRUE(same_memory(tape.memory(), before)) << describe(tape.memory()) << " vs " << describe(before);
      tape.backward(net.loss);
      EXPECT_TRUE(same_bits(net.x.grad(), dx));
      EXPECT_TRUE(same_bits(net.w.grad(), dw));
    }
    // The second step of the same shapes on the same tape (recording and backward) reaches the system
    // allocator not once: the fused op's temporary in the replay came from the pool.
    Tape<float> tape;
    FaultNet net;
    net.record(tape, xv, wv, fused);
    tape.backward(net.loss);
    tape.clear();
    {
      fault::Scope count(-1);
      net.record(tape, xv, wv, fused);
      tape.backward(net.loss);
      EXPECT_EQ(fault::misses, 0);
    }
    EXPECT_TRUE(same_bits(net.x.grad(), dx));
    EXPECT_TRUE(same_bits(net.w.grad(), dw));
  }
}

// ================================================================ optimizers

TEST(TransformerBreakOptimizers, ANaNGradientPoisonsOnlyItsOwnElementAndClippingLeavesItForTheCaller) {
  remat::Parameter<float> a(rnd(2, 3, 101)), b(rnd(1, 4, 102));
  const MF a0 = a.value(), b0 = b.value();
  remat::nn::AdamW<float> opt({&a, &b});
  MF ga = rnd(2, 3, 103);
  ga(1, 2) = std::numeric_limits<float>::quiet_NaN();
  a.mutable_grad() = ga;
  b.mutable_grad() = rnd(1, 4, 104);
  const MF grad_a = a.grad(), grad_b = b.grad();
  EXPECT_TRUE(std::isnan(remat::nn::clip_grad_norm<float>({&a, &b}, 1.0)));
  EXPECT_TRUE(same_bits(a.grad(), grad_a));
  EXPECT_TRUE(same_bits(b.grad(), grad_b));  // unchanged: the caller decides to skip the step
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::clip_grad_norm<float>({&a, &b}, 1.0, true);
      },
      {"clip_grad_norm", "nan"});
  EXPECT_TRUE(same_bits(b.grad(), grad_b));
  opt.step();
  EXPECT_TRUE(std::isnan(a.value()(1, 2)));
  EXPECT_EQ((a.value().array().isNaN()).count(), 1);
  EXPECT_TRUE(b.value().allFinite());
  EXPECT_FALSE(same_bits(b.value(), b0));
  (void)a0;
}

TEST(TransformerBreakOptimizers, ClipGradNormAtZeroNegativeNaNAndWithAParameterListedTwice) {
  remat::Parameter<float> p(rnd(2, 2, 105)), q(rnd(3, 1, 106));
  p.mutable_grad() = MF::Constant(2, 2, 3);  // norm 6
  q.mutable_grad() = MF::Zero(3, 1);
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p, &q}, 0.0), 6.0);
  EXPECT_TRUE(p.grad().isZero(0));  // max_norm 0: every gradient becomes 0
  p.mutable_grad() = MF::Constant(2, 2, 3);
  for (const double bad : {-1.0, -0.0 - 1e-300, std::nan("")}) {
    expect_error_naming<remat::domain_error>([&] { remat::nn::clip_grad_norm<float>({&p}, bad); },
                                             {"clip_grad_norm", "max_norm"});
    EXPECT_TRUE(same_bits(p.grad(), MF::Constant(2, 2, 3)));
  }
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({}, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, std::numeric_limits<double>::infinity()), 6.0);
  // Found defect: a Parameter listed twice was counted twice in the norm (√2 · 6) and scaled twice (by the
  // square of the factor): a silently wrong gradient. The optimizers reject a parameter given twice with
  // domain_error; clip_grad_norm now does the same (include/remat/nn/clip_grad_norm.hpp), changing nothing.
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::clip_grad_norm<float>({&p, &q, &p}, 1.0);
      },
      {"clip_grad_norm", "0", "2", "same parameter"});
  EXPECT_TRUE(same_bits(p.grad(), MF::Constant(2, 2, 3)));
}

TEST(TransformerBreakOptimizers, GroupsEmptyDuplicatedOrWithWrongShapedStateChangeNothing) {
  remat::Parameter<float> a(rnd(2, 3, 107)), b(rnd(3, 1, 108)), empty;
  // Empty groups and an optimizer of no parameters.
  remat::nn::AdamW<float> none(std::vector<remat::Parameter<float>*>{});
  none.step();
  none.step(std::vector<MF>{});
  EXPECT_EQ(none.step_count(), 2u);
  remat::nn::AdamW<float> with_empty({remat::nn::ParameterGroup<float>{}, {{&a}, 0.0}, {}});
  EXPECT_EQ(with_empty.size(), 1u);
  // A 0×0 parameter steps (nothing to update).
  remat::nn::SGD<float> sgd0({&empty, &b}, {0.1, 0.9});
  sgd0.step(std::vector<MF>{MF(), MF::Ones(3, 1)});
  EXPECT_EQ(sgd0.momentum_buffer(1), MF::Ones(3, 1));
  // The same parameter in two groups.
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::AdamW<float> o({{{&a, &b}}, {{&b}, 0.0}});
      },
      {"nn::AdamW", "same parameter"});
  expect_error_naming<remat::domain_error>(
      [&] {
        remat::nn::SGD<float> o({{{&a}}, {{&b, &a}, 0.0}});
      },
      {"nn::SGD", "same parameter"});
  // Resuming with wrong-shaped state: shape_error before any parameter (even an earlier one) is updated.
  remat::nn::AdamW<float> opt({&a, &b});
  a.mutable_grad() = rnd(2, 3, 109);
  b.mutable_grad() = rnd(3, 1, 110);
  opt.step();
  const MF a1 = a.value(), b1 = b.value(), m0 = opt.first_moment(0);
  opt.second_moment(1) = MF::Zero(1, 3);
  expect_error_naming<remat::shape_error>([&] { opt.step(); }, {"nn::AdamW", "second moment", "[1,3]", "[3,1]"});
  EXPECT_TRUE(same_bits(a.value(), a1));
  EXPECT_TRUE(same_bits(b.value(), b1));
  EXPECT_TRUE(same_bits(opt.first_moment(0), m0));
  EXPECT_EQ(opt.step_count(), 1u);
  remat::nn::SGD<float> sgd({&a, &b}, {0.1, 0.9});
  sgd.momentum_buffer(1) = MF::Zero(3, 3);
  expect_error_naming<remat::shape_error>([&] { sgd.step(); }, {"nn::SGD", "momentum buffer", "[3,3]"});
  EXPECT_TRUE(same_bits(a.value(), a1));
  // A parameter reshaped after construction.
  a.mutable_value().resize(3, 2);
  expect_error_naming<remat::shape_error>(
      [&] {
        opt.step(std::vector<MF>{MF::Ones(3, 2), MF::Ones(3, 1)});
      },
      {"nn::AdamW"});
  EXPECT_TRUE(same_bits(b.value(), b1));
}

// Found defect: a Parameter's gradient keeps the size of the value a backward (or mutable_grad) wrote it for;
// after the value was resized (mutable_value() = a larger matrix), Parameter::grad(), mutable_grad() and so
// nn::clip_grad_norm mapped the old buffer with the new shape and read (and scaled) past its end (an ASan
// heap-buffer-overflow), and an optimizer made after the resize read the old buffer as the new value's
// gradient in step(). backward already refused it ("call zero_grad() after resizing a parameter"). Fixed in
// include/remat/parameter.hpp (ParameterStorage::check_grad_size in grad_matrix() and copies) and
// include/remat/nn/optimizer.hpp (step()): shape_error, changing nothing.
TEST(TransformerBreakOptimizers, AParameterResizedAfterItsGradientWasWrittenThrowsInsteadOfReadingPastIt) {
  remat::Parameter<float> p(MF::Ones(2, 2)), q(rnd(1, 3, 116));
  {
    Tape<float> tape;
    tape.backward(remat::sum(tape.variable(p)) + remat::sum(tape.variable(q)));
  }
  ASSERT_TRUE(p.has_grad());
  p.mutable_value() = MF::Ones(30, 30);  // resized after its gradient (4 elements) was written
  const MF q_grad = q.grad();
  expect_error_naming<remat::shape_error>([&] { p.grad(); }, {"4 elements", "[30,30]", "zero_grad"});
  expect_error_naming<remat::shape_error>([&] { p.mutable_grad(); }, {"4 elements", "[30,30]"});
  expect_error_naming<remat::shape_error>(
      [&] {
        remat::nn::clip_grad_norm<float>({&q, &p}, 1e-3);
      },
      {"4 elements", "[30,30]"});
  EXPECT_TRUE(same_bits(q.grad(), q_grad));  // nothing scaled
  expect_error_naming<remat::shape_error>([&] { remat::Parameter<float> copy(p); }, {"4 elements"});
  remat::nn::AdamW<float> opt({&q, &p});  // made after the resize: the shapes agree, the gradient does not
  const MF q_value = q.value();
  expect_error_naming<remat::shape_error>([&] { opt.step(); }, {"nn::AdamW::step", "4 elements", "[30,30]"});
  EXPECT_TRUE(same_bits(q.value(), q_value));
  EXPECT_EQ(opt.step_count(), 0u);
  {  // the tape's variable refuses it too
    Tape<float> tape;
    const VF v = tape.variable(p);
    EXPECT_THROW(v.grad(), remat::shape_error);
    EXPECT_THROW(tape.backward(remat::sum(v)), remat::shape_error);
  }
  // After zero_grad() everything works at the new shape.
  p.zero_grad();
  EXPECT_TRUE(p.grad().isZero(0));
  EXPECT_EQ(p.grad().rows(), 30);
  opt.step();
  EXPECT_EQ(opt.step_count(), 1u);
  {
    Tape<float> tape;
    tape.backward(remat::sum(tape.variable(p)));
  }
  EXPECT_TRUE(same_bits(p.grad(), MF::Ones(30, 30)));
  EXPECT_DOUBLE_EQ(remat::nn::clip_grad_norm<float>({&p}, 1e9), 30.0);
}

TEST(TransformerBreakOptimizers, WarmupCosineScheduleAtItsEdges) {
  const remat::nn::WarmupCosineSchedule one(1e-3, 0, 1, 1e-5);
  EXPECT_DOUBLE_EQ(one.at(0), 1e-3);
  EXPECT_DOUBLE_EQ(one.at(1), 1e-5);
  EXPECT_DOUBLE_EQ(one.at(std::numeric_limits<std::uint64_t>::max()), 1e-5);
  const remat::nn::WarmupCosineSchedule s(2.0, 3, 4);
  EXPECT_DOUBLE_EQ(s.at(0), 2.0 / 3);
  EXPECT_DOUBLE_EQ(s.at(2), 2.0);
  EXPECT_DOUBLE_EQ(s.at(3), 2.0);
  EXPECT_DOUBLE_EQ(s.at(4), 0.0);
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1, 5, 5); }, {"total_steps"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(1, -1, 5); }, {"warmup_steps"});
  expect_error_naming<remat::domain_error>([] { remat::nn::WarmupCosineSchedule(std::nan(""), 0, 5); }, {"peak_lr"});
}

// ================================================================ gradcheck

TEST(TransformerBreakGradcheck, NonScalarLossNoInputsAndFunctionsThatRecordNothing) {
  expect_error_naming<remat::shape_error>(
      [] { remat::gradcheck([](Tape<double>&, const std::vector<VD>& v) { return v[0]; }, {rndd(2, 2, 111)}); },
      {"[1,1]", "[2,2]"});
  // No inputs: nothing checked (a caller's "max_error ≤ tol" must not pass silently: checked == 0, input −1).
  const auto none =
      remat::gradcheck([](Tape<double>& t, const std::vector<VD>&) { return t.constant(MD::Constant(1, 1, 2.0)); }, {});
  EXPECT_EQ(none.checked, 0u);
  EXPECT_EQ(none.input, -1);
  EXPECT_NE(none.describe().find("over 0 elements"), std::string::npos);
  // Records nothing: the input itself is the loss (derivative 1); a fresh constant (derivative 0).
  const auto identity =
      remat::gradcheck([](Tape<double>&, const std::vector<VD>& v) { return v[0]; }, {MD(MD::Constant(1, 1, 3.0))});
  EXPECT_TRUE(passes(identity));
  EXPECT_EQ(identity.analytic, 1.0);
  const auto constant = remat::gradcheck(
      [](Tape<double>& t, const std::vector<VD>&) { return t.constant(MD::Constant(1, 1, 2.0)); }, {rndd(2, 2, 112)});
  EXPECT_TRUE(passes(constant));
  EXPECT_EQ(constant.checked, 4u);
  // A loss that reaches its input through detach only: the analytic gradient is 0, the numeric one is not,
  // and gradcheck must say so.
  const auto detached = remat::gradcheck(
      [](Tape<double>&, const std::vector<VD>& v) { return remat::sum(remat::square(remat::detach(v[0]))); },
      {rndd(2, 2, 113, 0.5, 1)});
  EXPECT_GT(detached.max_error, 0.5);
  // A step of 0 divides 0 by 0: an infinite error, not a pass.
  remat::GradcheckOptions zero_step;
  zero_step.step = 0;
  const auto zero =
      remat::gradcheck([](Tape<double>&, const std::vector<VD>& v) { return remat::sum(remat::square(v[0])); },
                       {rndd(2, 2, 115)}, zero_step);
  EXPECT_FALSE(passes(zero));
  // A NaN input gives an infinite error, not a pass.
  MD nan_input = rndd(2, 2, 114);
  nan_input(1, 1) = std::nan("");
  const auto nan = remat::gradcheck(
      [](Tape<double>&, const std::vector<VD>& v) { return remat::sum(remat::square(v[0])); }, {nan_input});
  EXPECT_TRUE(std::isinf(nan.max_error));
  EXPECT_FALSE(passes(nan));
}

// ================================================================ the GPT example at its edges

TEST(TransformerBreakGpt, OnePositionOneWidthPerHeadEveryRecomputeModeAndAttention) {
  for (const gpt::Config c : {gpt::Config{7, 4, 4, 1, 2, 0}, gpt::Config{5, 3, 3, 3, 1, 0}}) {
    SCOPED_TRACE(::testing::Message() << "width " << c.width << " heads " << c.heads << " seq_len " << c.seq_len);
    gpt::Model<float> model = gpt::Model<float>::deterministic(c);
    std::vector<int> ids, targets;
    for (Index r = 0; r < 2 * c.seq_len; ++r) {  // B = 2
      ids.push_back(static_cast<int>((3 * r + 1) % c.vocabulary));
      targets.push_back(static_cast<int>((5 * r + 2) % c.vocabulary));
    }
    auto run = [&](gpt::Options o) {
      for (remat::Parameter<float>* p : model.parameters()) p->zero_grad();
      Tape<float> tape;
      const VF loss = model.loss(tape, ids, targets, o);
      tape.backward(loss);
      std::vector<MF> grads = {MF(loss.value())};
      for (remat::Parameter<float>* p : model.parameters()) grads.emplace_back(p->grad());
      return grads;
    };
    for (const gpt::Attention a : {gpt::Attention::unfused, gpt::Attention::fused}) {
      const auto reference = run({gpt::Recompute::none, a});
      for (const MF& g : reference) EXPECT_TRUE(g.allFinite());
      for (const gpt::Recompute r :
           {gpt::Recompute::block, gpt::Recompute::attention, gpt::Recompute::dots_no_batch, gpt::Recompute::sqrt}) {
        const auto got = run({r, a});
        for (std::size_t k = 0; k < got.size(); ++k)
          EXPECT_TRUE(same_bits(got[k], reference[k])) << gpt::to_string(r) << " gradient " << k;
      }
    }
    const auto unfused = run({gpt::Recompute::none, gpt::Attention::unfused});
    const auto fused = run({gpt::Recompute::none, gpt::Attention::fused});
    for (std::size_t k = 0; k < fused.size(); ++k) EXPECT_LT(max_abs_diff(fused[k], unfused[k]), 1e-5) << k;
  }
}

}  // namespace transformer_break_test
