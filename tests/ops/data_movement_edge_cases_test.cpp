// Data-movement ops, reductions and detach at their edges: embedding with one repeated id, a huge table and
// ids changed before the replay; concat_cols, slice_cols, reshape and transpose at their edges, a bad part of a
// many-part concat_cols refused before anything is recorded, strong exception safety for bad_alloc (fault
// injection), huge arguments without overflow; max_rows and argmax_rows on single rows, ties and NaN rows;
// gradients through detached paths and a user op that stops the gradient.
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
#include "pool_faults.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace data_movement_edge_cases_test {

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

namespace fault = remat_test::pool_faults;  // pool misses counted and failed in turn

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

// ================================================================ data-movement ops

TEST(EmbeddingEdgeCases, EveryIdTheSameAndAHugeTableAndIdsChangedBeforeTheReplay) {
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

TEST(DataMovementEdgeCases, ConcatSliceReshapeTransposeAtTheirEdges) {
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
  EXPECT_TRUE(one.is_same(x));  // one part is returned as it is, nothing recorded
  EXPECT_EQ(tape.size(), nodes);
  const VF round = remat::reshape(remat::reshape(remat::reshape(x, 3, 4), 12, 1), 2, 6);
  EXPECT_TRUE(same_bits(round.value(), x.value()));
  EXPECT_TRUE(same_bits(remat::transpose(remat::transpose(x)).value(), x.value()));
  const MF row = MF(x.value()).reshaped<Eigen::RowMajor>(1, 12);
  EXPECT_TRUE(same_bits(remat::reshape(x, 1, 12).value(), row));
  EXPECT_TRUE(same_bits(remat::transpose(remat::reshape(x, 1, 12)).value(), row.transpose()));
}

// Regression: concat_cols of k ≥ 3 parts records a tree of two-part concatenations, and checked each pair
// only when it recorded it: a bad part (a different number of rows, an empty or stale Var, another tape's
// Var, a value that escaped a checkpointed function, a modified Parameter) threw after the pairs before it
// were recorded, so the tape grew by those nodes and its peak_bytes by their buffers; the row error also
// named the intermediate concatenation's shape, not the parts'. Fixed in include/remat/ops/concat_cols.hpp:
// every part is checked before anything is recorded (TapeState::check_input, the record's own checks).
TEST(DataMovementEdgeCases, ConcatWithABadPartThrowsBeforeRecordingAnyPair) {
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

// Regression: concat_cols of k ≥ 3 parts was not strongly exception safe for std::bad_alloc. Its two-part
// records each were, but a failure in a later pair left the earlier pairs on the tape (size() and peak_bytes
// changed), against the guarantee of docs/design.md §3 for a library call. Fixed: concat_cols reserves the
// buffers and nodes of its whole tree (Recorder::reserve_records) before it records the first pair. Checked
// outside regions and inside a checkpointed function (which also reserves what closing the region needs),
// failing each pool miss in turn; the tape stays usable and its gradients right.
TEST(DataMovementEdgeCases, ConcatOfManyPartsIsStronglyExceptionSafeForBadAlloc) {
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

// Regression: slice_cols checked begin + count > n and reshape checked rows·cols ≠ m·n in Index arithmetic
// that overflows (signed overflow: UB, reported by UBSan): slice_cols(x, INT64_MAX, 1) passed the check and
// read far outside x, slice_cols(x, 1, INT64_MAX) became a huge allocation (std::bad_alloc, not shape_error),
// and reshape(x [2,6], 4, 2^62 + 3) — whose product wraps to 12 — was recorded as a [4, 2^62+3] value of 12
// elements. Fixed in include/remat/ops/slice_cols.hpp and reshape.hpp: the checks cannot overflow.
TEST(DataMovementEdgeCases, HugeSliceAndReshapeArgumentsThrowShapeErrorWithoutOverflow) {
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

TEST(ReductionEdgeCases, SingleRowsTiesAndNaNRows) {
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

// Regression: Tape::gradient(loss, {x}) marked every node downstream of x as wanted, ignoring that a detach
// (or a user op with stops_gradient) cuts the path. So the sweep ran detach's backward, which writes nothing,
// into a freshly allocated gradient buffer of x: gradient(sum(detach(x)), {x}) returned uninitialised pool
// memory (a stale buffer's contents) instead of zeros; and it ran the backward of ops after the detach, which
// had kept no residuals (they require no gradient): gradient(sum(tanh(detach(x))), {x}) made tanh's backward
// read its freed output (a null pointer: SEGV). Fixed in include/remat/detail/tape_state.hpp: in gradient() a
// node is wanted only if it requires a gradient.
TEST(DetachGradient, GradientThroughADetachedPathIsZeroAndReadsNothingFreed) {
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

TEST(DetachGradient, DetachOfAParameterInsideARegionAndALossOfDetachedValuesOnly) {
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

}  // namespace data_movement_edge_cases_test
