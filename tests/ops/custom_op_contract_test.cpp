// The op recipe's contract (remat/op.hpp: OpBase, OpCall, apply_op, the contexts' params, indices and
// scratch) from the user's side: a forward that throws is not recorded, Params of the maximum size, indices
// copied at record time, tags and the name policies, output/extra/temporary shapes that are empty or negative, a
// temporary counted in the peak, three inputs with some requiring gradients, batch dims and the dot policies, an
// op of several records made atomic with check_input, same_tape and reserve_records, and tag_in_place.
//
// Each test states the behaviour asked for (a typed exception naming the op and the values, with the tape and
// its memory() figures unchanged; no UB; no silent wrong gradient; checkpointed gradients bitwise equal to plain
// ones under every policy; exact memory figures) and checks that the library does it; a "Regression:" comment
// says what the library did before.
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

#include "api_checks.hpp"
#include "expect_error.hpp"
#include "fma_op.hpp"
#include "pool_faults.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "sample_ops.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace custom_op_contract_test {

using remat_test::gather_cols;
using remat_test::GatherColsOp;
using remat_test::ScratchOp;

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

using remat_test::AnyPolicy;
using remat_test::describe;
using remat_test::every_policy;
using remat_test::expect_error_naming;
using remat_test::passes;
using remat_test::rnd;
using remat_test::rndd;
using remat_test::same_bits;
using remat_test::same_memory;

// ================================================================ user-defined ops (public recipe only)

/// Writes its output, extra and temporary, then throws: the op must not be recorded.
struct ThrowingForwardOp : remat::OpBase {
  static constexpr const char* name = "throwing_forward";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs) { return remat::reads_input0 | remat::reads_extra; }
  static Shape output_shape(const Shape* in, const Params&) { return in[0]; }
  static Shape extra_shape(const Shape* in, const Params&) { return {in[0].rows(), 2}; }
  static Shape scratch_shape(const Shape* in, const Params&) { return {7, in[0].cols()}; }
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
  static double flops(const Shape*, int, const Shape& out) { return 2.0 * static_cast<double>(out.numel()); }
};
static_assert(sizeof(MaxParamsOp::Params) == remat::max_params_bytes);

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

/// An op whose output, extra or temporary shape is whatever its Params say (a buggy user op).
struct ShapeFromParamsOp : remat::OpBase {
  static constexpr const char* name = "shape_from_params";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  struct Params {  // three shapes as int32 pairs (three remat::Shape would exceed max_params_bytes)
    std::int32_t out[2], extra[2], scratch[2];
  };
  static Params make(Shape out, Shape extra, Shape scratch) {
    auto i = [](Index v) { return static_cast<std::int32_t>(v); };
    return {{i(out.rows()), i(out.cols())}, {i(extra.rows()), i(extra.cols())}, {i(scratch.rows()), i(scratch.cols())}};
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

TEST(CustomOpContract, AThrowingForwardIsNotRecordedAndLeavesTheFiguresAndTheIndexStoreAsTheyWere) {
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

TEST(CustomOpContract, AThrowingForwardInsideNestedRegionsLeavesTheTapeUsable) {
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

TEST(CustomOpContract, ParamsOfTheMaximumSizeSurviveRecordingReplayAndBackward) {
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

TEST(CustomOpContract, IndicesAreCopiedSoAReplayAfterTheCallersVectorChangedUsesTheOriginals) {
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

TEST(CustomOpContract, GatherWithRepeatedIndicesPassesTheGradcheck) {
  const MD w = rndd(3, 6, 6);
  const auto result = remat::gradcheck(
      [&](Tape<double>& t, const std::vector<VD>& v) {
        return remat::sum(gather_cols(v[0], {2, 0, 2, 2, 1, 0}) * t.constant(w));
      },
      {rndd(3, 3, 5)});
  EXPECT_TRUE(passes(result));
}

TEST(CustomOpContract, ATagSelectsTheOpForTheNamePoliciesAndOutlivesTheCallersString) {
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

// Regression: apply_op did not check the shapes an op's output_shape, extra_shape and scratch_shape return.
// An empty output ([0,3]) was recorded as a value of no elements (every tensor of remat has at least one row
// and column, and leaves throw shape_error for less), a negative one ([-1,-3], whose size() is positive) was
// allocated and mapped with negative dimensions (UB), and [-2,5] became a huge allocation (std::bad_alloc
// instead of shape_error). Fixed in include/remat/detail/apply.hpp: shape_error naming the op and the shape.
TEST(CustomOpContract, AnOpReturningAnEmptyOrNegativeShapeThrowsShapeErrorAndRecordsNothing) {
  Tape<float> tape;
  const VF x = tape.variable(rnd(2, 3, 8));
  const remat::MemoryStats before = tape.memory();
  const std::size_t nodes = tape.size();
  for (const Shape& out : {Shape{0, 3}, Shape{3, 0}, Shape{-1, -3}, Shape{-2, 5}, Shape{0, 0}}) {
    SCOPED_TRACE(remat::to_string(out));
    expect_error_naming<remat::shape_error>(
        [&] { remat::apply_op<ShapeFromParamsOp>(ShapeFromParamsOp::make(out, {}, {}), x); },
        {"shape_from_params", remat::to_string(out)});
  }
  for (const Shape& bad : {Shape{-1, -2}, Shape{-4, 1}, Shape{2, -1}}) {
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

TEST(CustomOpContract, ItsTemporaryCountsInThePeakOfForwardAndBackwardExactly) {
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

TEST(CustomOpContract, ThreeInputsWithSomeRequiringGradKeepOnlyWhatTheirBackwardsRead) {
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

TEST(CustomOpContract, BatchDimsDecideTheDotPoliciesAndAnEmptyIndexListIsRefused) {
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

// ================================================================ an op of several records, a name in place

/// a + b of one shape: user_sum's record.
struct PairSumOp : remat::OpBase {
  static constexpr const char* name = "pair_sum";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static unsigned reads(remat::GradInputs) { return remat::reads_nothing; }
  static Shape output_shape(const Shape* in, const Params&) {
    if (!(in[0] == in[1]))
      throw remat::shape_error("pair_sum: " + remat::to_string(in[0]) + " and " + remat::to_string(in[1]) + " differ");
    return in[0];
  }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out() = c.in(0) + c.in(1);
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    for (int k = 0; k < 2; ++k)
      if (c.wants_grad(k)) c.add_grad(k, c.grad_out());
  }
  static double flops(const Shape*, int, const Shape& out) { return static_cast<double>(out.numel()); }
};

/// The sum of k parts of one shape as k − 1 pair_sum records, written as concat is, with the recipe's pieces for
/// an op of several records: every part checked and the room of every record reserved before the first, so that
/// a bad part or a std::bad_alloc leaves nothing recorded.
template <class T>
Var<T> user_sum(const std::vector<Var<T>>& parts) {
  const Shape shape = parts.at(0).shape("user_sum");
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Shape s = parts[i].shape("user_sum");
    if (!remat::same_tape(parts[i], parts[0]))
      throw remat::tape_error("user_sum: part " + std::to_string(i) + " is on another tape than part 0");
    if (!(s == shape))
      throw remat::shape_error("user_sum: part " + std::to_string(i) + " is " + remat::to_string(s) +
                               " but part 0 is " + remat::to_string(shape));
    remat::check_input("user_sum", parts[i]);
  }
  const std::vector<Shape> outputs(parts.size() - 1, shape);
  remat::reserve_records("user_sum", parts[0], outputs.data(), outputs.size());
  Var<T> sum = parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i) sum = remat::apply_op<PairSumOp>(sum, parts[i]);
  return sum;
}

namespace fault = remat_test::pool_faults;  // pool misses counted and failed in turn

// A user's op of several records keeps apply_op's guarantee with check_input, same_tape and reserve_records
// (concat, stack and concat_cols are written so): a bad last part (another tape's, empty, computed in a region that
// did not return it, a modified Parameter) or a std::bad_alloc at any pool miss leaves the tape and its figures
// as they were, and the tape stays usable.
TEST(CustomOpContract, AnOpOfSeveralRecordsIsRecordedWholeOrNotAtAll) {
  Tape<float> tape, other;
  remat::Parameter<float> p(rnd(2, 3, 20));
  const VF a = tape.variable(rnd(2, 3, 21)), b = tape.variable(rnd(2, 3, 22)), param = tape.variable(p);
  const VF foreign = other.variable(rnd(2, 3, 23)), wrong = tape.variable(rnd(3, 2, 24));
  VF escaped;
  const VF returned = remat::checkpoint([&](const VF& in) {
    escaped = remat::tanh(in);
    return remat::sin(in);
  })(a);
  const std::size_t nodes = tape.size();
  const remat::MemoryStats before = tape.memory();
  auto expect_unchanged = [&](const char* what) {
    EXPECT_EQ(tape.size(), nodes) << what;
    EXPECT_TRUE(same_memory(tape.memory(), before)) << what << ": " << describe(tape.memory());
  };
  expect_error_naming<remat::tape_error>([&] { user_sum<float>({a, b, a, foreign}); }, {"user_sum", "part 3"});
  expect_unchanged("foreign");
  expect_error_naming<remat::tape_error>([&] { user_sum<float>({a, b, a, VF()}); }, {"user_sum", "empty"});
  expect_unchanged("empty");
  expect_error_naming<remat::tape_error>([&] { user_sum<float>({a, b, a, escaped}); }, {"user_sum"});
  expect_unchanged("escaped");
  expect_error_naming<remat::shape_error>([&] { user_sum<float>({a, b, a, wrong}); }, {"user_sum", "[3,2]"});
  expect_unchanged("shape");
  p.mutable_value()(0, 0) += 1;
  expect_error_naming<remat::stale_value_error>([&] { user_sum<float>({a, b, a, param}); }, {"user_sum"});
  expect_unchanged("stale parameter");
  VF y;
  for (long k = 1; !y.valid(); ++k) {  // each pool miss of the four records in turn, until none is left to fail
    fault::Scope inject(k);
    try {
      y = user_sum<float>({a, b, returned, b, a});
      EXPECT_GT(k, 1) << "the records made no pool miss";
    } catch (const std::bad_alloc&) {
      expect_unchanged("bad_alloc");
    }
  }
  EXPECT_EQ(tape.size(), nodes + 4);
  tape.backward(remat::sum(y));
  EXPECT_EQ(b.grad(), MF::Constant(2, 3, 2));
}

// reserve_records' own checks, and valid_output_shape's limits: a dimension below 1 or more than 2^48 bytes.
TEST(CustomOpContract, ReserveRecordsRefusesBadShapesAndHandlesWithTheTapeUnchanged) {
  Tape<float> tape;
  const VF x = tape.variable(rnd(2, 3, 25));
  const std::size_t nodes = tape.size();
  const remat::MemoryStats before = tape.memory();
  const Index huge = Index{1} << 46;  // floats: 2^48 bytes in a [1, 2^46] tensor, the most a tensor may have
  EXPECT_TRUE(remat::valid_output_shape<float>(Shape{1, huge}));
  EXPECT_FALSE(remat::valid_output_shape<float>(Shape{1, huge + 1}));
  EXPECT_FALSE(remat::valid_output_shape<double>(Shape{1, huge}));
  EXPECT_FALSE(remat::valid_output_shape<float>(Shape{0, 3}));
  EXPECT_TRUE(remat::valid_output_shape<float>(Shape{2, 3, 4}));
  const Shape bad[] = {Shape{2, 3}, Shape{0, 3}};
  expect_error_naming<remat::shape_error>([&] { remat::reserve_records("my_op", x, bad, 2); }, {"my_op", "[0,3]"});
  const Shape too_big[] = {Shape{1, huge + 1}};
  expect_error_naming<remat::shape_error>([&] { remat::reserve_records("my_op", x, too_big, 1); }, {"my_op", "2^48"});
  expect_error_naming<remat::tape_error>([&] { remat::reserve_records("my_op", VF(), bad, 1); }, {"my_op", "empty"});
  EXPECT_EQ(tape.size(), nodes);
  EXPECT_TRUE(same_memory(tape.memory(), before)) << describe(tape.memory());
  EXPECT_FALSE(remat::same_tape(x, VF()));
  EXPECT_TRUE(remat::same_tape(x, remat::sin(x)));
}

// tag_in_place names an op's fresh output itself (no record): the region's name policy then saves it, and the
// backward replays nothing. A leaf, a value already read or already named is not named in place (false).
TEST(CustomOpContract, TagInPlaceNamesAFreshOutputForTheNamePoliciesWithoutARecord) {
  const MF xv = rnd(2, 3, 26);
  auto replayed_ops = [&](bool named) {
    Tape<float> tape;
    const VF x = tape.variable(xv);
    const VF y = remat::checkpoint(
        [&](const VF& a) {
          const VF h = remat::apply_op<PairSumOp>(a, a);
          const std::size_t nodes = tape.size();
          if (named) {
            EXPECT_TRUE(remat::tag_in_place("my_name", h, "h"));
          }
          EXPECT_EQ(tape.size(), nodes);
          const VF out = remat::square(h);
          EXPECT_FALSE(remat::tag_in_place("my_name", h, "h2"));  // read by square
          return out;
        },
        remat::policies::save_only_these_names({"h"}))(x);
    tape.backward(remat::sum(y));
    EXPECT_TRUE(x.grad().isApprox(8 * xv)) << x.grad();
    return tape.memory().replayed_ops;
  };
  EXPECT_EQ(replayed_ops(true), 0u);
  EXPECT_EQ(replayed_ops(false), 1u);
  Tape<float> tape;
  const VF x = tape.variable(xv);
  const VF h = remat::sin(x);
  EXPECT_FALSE(remat::tag_in_place("my_name", x, "leaf"));
  EXPECT_TRUE(remat::tag_in_place("my_name", h, "first"));
  EXPECT_FALSE(remat::tag_in_place("my_name", h, "second"));  // already named
  expect_error_naming<remat::domain_error>([&] { remat::tag_in_place("my_name", h, ""); }, {"my_name", "empty"});
  expect_error_naming<remat::tape_error>([&] { remat::tag_in_place("my_name", VF(), "h"); }, {"my_name", "empty"});
}

}  // namespace custom_op_contract_test
