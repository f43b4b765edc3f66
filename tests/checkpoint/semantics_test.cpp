// What checkpoint() promises beyond equal gradients: f runs once per call, a region replays at most once
// per backward, stale parameters are detected, escaping values are refused, tuple- and multi-argument
// functions work, policies see correct OpInfo, and print_saved_residuals says why each value is held.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint_support.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace semantics_test {

using checkpoint_test::BitwiseEqual;
using checkpoint_test::bytes_of;
using checkpoint_test::random_matrix;
using remat::Matrix;
using remat::OpInfo;
using remat::OpKind;
using remat::Tape;
using remat::Var;

template <class T>
class Semantics : public ::testing::Test {};

/// The report with every run of spaces collapsed to one, so lines compare independently of alignment.
std::string collapse_spaces(const std::string& text) {
  std::string out;
  for (char ch : text)
    if (ch != ' ' || out.empty() || out.back() != ' ') out += ch;
  return out;
}
TYPED_TEST_SUITE(Semantics, checkpoint_test::Scalars);

// f is called once per forward call of the checkpointed callable (3 layers → 3 calls), never by backward,
// and each region replays exactly its dropped ops once: sin reads the matmul output, so 1 op per layer.
TYPED_TEST(Semantics, FunctionRunsOncePerCallAndEachRegionReplaysOnce) {
  using T = TypeParam;
  Tape<T> tape;
  int calls = 0;
  auto w = tape.variable(random_matrix<T>(4, 4, 1, 0.5));
  auto layer = remat::checkpoint([&](Var<T> h) {
    ++calls;
    return remat::sin(remat::matmul(h, w));
  });
  auto h = tape.variable(random_matrix<T>(3, 4, 2));
  for (int i = 0; i < 3; ++i) h = layer(h);
  auto loss = remat::sum(h);
  EXPECT_EQ(calls, 3);
  tape.backward(loss, /*retain_graph=*/true);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(tape.memory().replayed_ops, 3u);
  EXPECT_EQ(tape.memory().replayed_bytes, 3 * bytes_of<T>(3, 4));
  tape.backward(loss);  // the second sweep replays again, once per region, and still never calls f
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(tape.memory().replayed_ops, 3u);
}

// A region output read by several consumers (and a region input used twice inside) is replayed once.
TYPED_TEST(Semantics, RegionWithSeveralConsumersReplaysOnce) {
  using T = TypeParam;
  Tape<T> tape;
  auto x = tape.variable(random_matrix<T>(3, 4, 3));
  auto region = remat::checkpoint([](Var<T> h) { return remat::sin(remat::sin(h) * h); });
  auto y = region(x);
  auto loss = remat::sum(remat::square(y)) + remat::sum(remat::exp(y)) + remat::mean(y);
  tape.backward(loss);
  // Dropped and needed: sin(h) (read by the multiply) and the product (read by the outer sin).
  EXPECT_EQ(tape.memory().replayed_ops, 2u);
}

// A Parameter modified (through mutable_value, which bumps its version) between forward and backward,
// where only the replay would read it: backward throws stale_value_error. Without checkpoint the backward
// of sin(h + P) never reads P, so there it is not an error.
TYPED_TEST(Semantics, StaleParameterReadByReplayThrows) {
  using T = TypeParam;
  for (bool use_checkpoint : {false, true}) {
    remat::Parameter<T> p(random_matrix<T>(1, 4, 4));
    Tape<T> tape;
    auto x = tape.variable(random_matrix<T>(3, 4, 5));
    auto pv = tape.variable(p);
    auto f = [&](Var<T> h) { return remat::sin(h + pv); };
    auto loss = remat::sum(use_checkpoint ? remat::checkpoint(f)(x) : f(x));
    p.mutable_value()(0, 0) += T(1);
    if (use_checkpoint) {
      try {
        tape.backward(loss);
        ADD_FAILURE() << "expected stale_value_error";
      } catch (const remat::stale_value_error& e) {
        EXPECT_NE(std::string(e.what()).find("modified after it was recorded"), std::string::npos) << e.what();
      }
    } else {
      EXPECT_NO_THROW(tape.backward(loss));
    }
  }
}

// A Parameter read by a saved residual's backward (matmul reads W) inside a region: stale as well.
TYPED_TEST(Semantics, StaleParameterReadByBackwardInsideRegionThrows) {
  using T = TypeParam;
  remat::Parameter<T> w(random_matrix<T>(4, 2, 6));
  Tape<T> tape;
  auto x = tape.variable(random_matrix<T>(3, 4, 7));
  auto wv = tape.variable(w);
  auto loss = remat::sum(remat::checkpoint([&](Var<T> h) { return remat::tanh(remat::matmul(h, wv)); })(x));
  w.mutable_value();  // write access alone marks it modified
  EXPECT_THROW(tape.backward(loss), remat::stale_value_error);
}

// A value computed inside f and used outside without being returned: tape_error naming the problem; the
// tape stays usable and the legitimate loss still gets its gradient.
TYPED_TEST(Semantics, ValueUsedOutsideRegionWithoutBeingReturnedThrows) {
  using T = TypeParam;
  Tape<T> tape;
  auto x = tape.variable(random_matrix<T>(3, 4, 8));
  Var<T> leaked;
  auto region = remat::checkpoint([&](Var<T> h) {
    leaked = remat::sin(h);
    return remat::cos(leaked);
  });
  auto y = region(x);
  try {
    auto bad = remat::sum(leaked);
    ADD_FAILURE() << "expected tape_error";
  } catch (const remat::tape_error& e) {
    EXPECT_NE(std::string(e.what()).find("did not return it"), std::string::npos) << e.what();
  }
  // Also refused as an input of a later region (it is still outside the region that computed it).
  EXPECT_THROW(remat::checkpoint([](Var<T> h) { return remat::exp(h); })(leaked), remat::tape_error);
  auto loss = remat::sum(y);
  tape.backward(loss);
  const Matrix<T> xv = x.value();
  const Matrix<T> expected = (-(xv.array().sin().sin()) * xv.array().cos()).matrix();  // d cos(sin x)/dx
  EXPECT_TRUE(Matrix<T>(x.grad()).isApprox(expected, T(1e-5)));
}

// An exception thrown by f closes the region and propagates; the tape remains usable.
TYPED_TEST(Semantics, ExceptionInsideFunctionClosesRegion) {
  using T = TypeParam;
  Tape<T> tape;
  auto x = tape.variable(random_matrix<T>(3, 4, 9));
  auto failing = remat::checkpoint([](Var<T> h) -> Var<T> {
    auto a = remat::sin(h);
    throw std::runtime_error("user error inside f");
  });
  EXPECT_THROW(failing(x), std::runtime_error);
  auto region = remat::checkpoint([](Var<T> h) { return remat::sin(remat::square(h)); });
  auto loss = remat::sum(region(x));
  tape.backward(loss);
  const Matrix<T> xv = x.value();
  const Matrix<T> expected = (xv.array().square().cos() * 2 * xv.array()).matrix();
  EXPECT_TRUE(Matrix<T>(x.grad()).isApprox(expected, T(1e-5)));
}

// f with several Var arguments, a non-Var argument passed through, and a tuple of results: gradients
// bitwise equal to the same function without checkpoint.
TYPED_TEST(Semantics, TupleResultsAndSeveralArguments) {
  using T = TypeParam;
  auto run = [](bool use_checkpoint, std::size_t* replayed) {
    Tape<T> tape;
    auto a = tape.variable(random_matrix<T>(3, 4, 10));
    auto b = tape.variable(random_matrix<T>(1, 4, 11));
    auto w = tape.variable(random_matrix<T>(4, 2, 12));
    auto f = [&](double scale, Var<T> u, Var<T> v) {
      auto s = remat::sin(u * v);
      return std::make_tuple(remat::tanh(remat::matmul(s, w)) * scale, remat::cos(s + u));
    };
    auto [p, q] = use_checkpoint ? remat::checkpoint(f)(0.5, a, b) : f(0.5, a, b);
    auto loss = remat::sum(p) + remat::mean(remat::square(q));
    tape.backward(loss);
    *replayed = tape.memory().replayed_ops;
    return checkpoint_test::gradients_of<T>({a, b, w});
  };
  std::size_t plain_ops = 0, checkpoint_ops = 0;
  const auto plain = run(false, &plain_ops);
  const auto checkpointed = run(true, &checkpoint_ops);
  for (std::size_t k = 0; k < plain.size(); ++k) EXPECT_TRUE(BitwiseEqual(plain[k], checkpointed[k])) << k;
  // Dropped and read by a backward: u*v (sin reads it), s (the matmul reads it), tanh(...) (tanh reads its
  // output) and s + u (cos reads it); the matmul output is recomputed as tanh's input: 5 ops.
  EXPECT_EQ(checkpoint_ops, 5u);
  EXPECT_EQ(plain_ops, 0u);
}

// The policy is asked once per op, at record time, with the op's name, kind, tag, output shape, bytes
// and FLOP estimate, and once more for a value checkpoint_name names (with its name); nested regions ask
// every enclosing region's policy; backward asks nothing.
TYPED_TEST(Semantics, PolicySeesCorrectOpInfoOncePerOpAndOnceMoreWhenNamed) {
  using T = TypeParam;
  struct Seen {
    std::string name;
    OpKind kind;
    std::string tag;
    remat::Shape shape;
    std::size_t bytes;
    double flops;
  };
  auto inner_seen = std::make_shared<std::vector<Seen>>();
  auto outer_seen = std::make_shared<std::vector<Seen>>();
  auto recorder = [](std::shared_ptr<std::vector<Seen>> log, bool answer) {
    return [log, answer](const OpInfo& op) {
      log->push_back({std::string(op.name), op.kind, std::string(op.tag), op.shape, op.bytes, op.flops});
      return answer;
    };
  };
  Tape<T> tape;
  auto x = tape.variable(random_matrix<T>(3, 4, 13));
  auto w = tape.variable(random_matrix<T>(4, 5, 14));
  auto inner =
      remat::checkpoint([&](Var<T> h) { return remat::checkpoint_name(remat::tanh(remat::matmul(h, w)), "hidden"); },
                        recorder(inner_seen, false));
  auto outer = remat::checkpoint([&](Var<T> h) { return remat::sum_rows(inner(h)); }, recorder(outer_seen, true));
  auto loss = remat::sum(outer(x));
  tape.backward(loss);

  ASSERT_EQ(inner_seen->size(), 3u);
  const std::size_t out_bytes = bytes_of<T>(3, 5);
  const Seen& mm = (*inner_seen)[0];
  EXPECT_EQ(mm.name, "matmul");
  EXPECT_EQ(mm.kind, OpKind::dot);
  EXPECT_EQ(mm.tag, "");
  EXPECT_EQ(mm.shape, (remat::Shape{3, 5}));
  EXPECT_EQ(mm.bytes, out_bytes);
  EXPECT_EQ(mm.flops, 2.0 * 3 * 4 * 5);  // 2mkn, as documented in matmul.hpp
  const Seen& th = (*inner_seen)[1];
  EXPECT_EQ(th.name, "tanh");
  EXPECT_EQ(th.kind, OpKind::elementwise);
  EXPECT_EQ(th.shape, (remat::Shape{3, 5}));
  EXPECT_EQ(th.bytes, out_bytes);
  EXPECT_GT(th.flops, 0.0);
  // checkpoint_name names tanh's output itself and asks the policies again, with the name.
  const Seen& named = (*inner_seen)[2];
  EXPECT_EQ(named.name, "tanh");
  EXPECT_EQ(named.kind, OpKind::elementwise);
  EXPECT_EQ(named.tag, "hidden");
  EXPECT_EQ(named.bytes, out_bytes);
  // The outer policy saw the inner region's ops (tanh again with its name) and its own sum_rows, in order.
  ASSERT_EQ(outer_seen->size(), 4u);
  EXPECT_EQ((*outer_seen)[0].name, "matmul");
  EXPECT_EQ((*outer_seen)[2].tag, "hidden");
  EXPECT_EQ((*outer_seen)[3].name, "sum_rows");
  EXPECT_EQ((*outer_seen)[3].kind, OpKind::reduction);
  EXPECT_EQ((*outer_seen)[3].shape, (remat::Shape{3, 1}));
  EXPECT_EQ((*outer_seen)[3].bytes, bytes_of<T>(3, 1));
}

// Each named policy decides as documented on a tagged value, seen through saved bytes: in
// y = sin(checkpoint_name(sin(x·W), "keep")) the named value, the inner sin's output itself, is read by the
// outer sin's backward; nothing reads y.
TYPED_TEST(Semantics, NamePoliciesSelectTaggedValues) {
  using T = TypeParam;
  auto saved_with = [](auto policy) {
    Tape<T> tape;
    auto x = tape.variable(random_matrix<T>(3, 4, 15));
    auto w = tape.variable(random_matrix<T>(4, 5, 16));
    auto region = remat::checkpoint(
        [&](Var<T> h) { return remat::sin(remat::checkpoint_name(remat::sin(remat::matmul(h, w)), "keep")); }, policy);
    auto loss = remat::sum(region(x));
    const std::size_t saved = tape.memory().saved_bytes;
    tape.backward(loss);
    return std::make_pair(saved, tape.memory().replayed_ops);
  };
  // Always saved: x [3,4] and W [4,5] (region inputs, read by the matmul).
  const std::size_t inputs = bytes_of<T>(3, 4) + bytes_of<T>(4, 5);
  const std::size_t named = bytes_of<T>(3, 5);    // the inner sin's output, read by the outer sin
  const std::size_t product = bytes_of<T>(3, 5);  // matmul output, read by the inner sin
  using namespace remat::policies;
  EXPECT_EQ(saved_with(save_only_these_names({"keep"})), std::make_pair(inputs + named, std::size_t{1}));
  EXPECT_EQ(saved_with(save_only_these_names({"other"})), std::make_pair(inputs, std::size_t{2}));
  // JAX semantics: save_any_names_but_these saves only *named* values (not listed); the unnamed product is
  // recomputed either way. save_anything_except_these_names saves everything but the listed names.
  EXPECT_EQ(saved_with(save_any_names_but_these({"keep"})), std::make_pair(inputs, std::size_t{2}));
  EXPECT_EQ(saved_with(save_any_names_but_these({"other"})), std::make_pair(inputs + named, std::size_t{1}));
  // Everything but the named value is saved, so the replay recomputes it (the inner sin) from the saved
  // product (a replay source) in 1 op.
  EXPECT_EQ(saved_with(save_anything_except_these_names({"keep"})), std::make_pair(inputs + product, std::size_t{1}));
  EXPECT_EQ(saved_with(save_anything_except_these_names({"other"})),
            std::make_pair(inputs + named + product, std::size_t{0}));
  EXPECT_EQ(saved_with(save_from_both_policies(dots_saveable, save_only_these_names({"keep"}))),
            std::make_pair(inputs + named + product, std::size_t{0}));
  EXPECT_EQ(saved_with(dots_saveable), std::make_pair(inputs + product, std::size_t{1}));
  EXPECT_EQ(saved_with(nothing_saveable), std::make_pair(inputs, std::size_t{2}));
  EXPECT_EQ(saved_with(everything_saveable), std::make_pair(inputs + named + product, std::size_t{0}));
}

// An op whose extra buffer is a residual of its own backward (layer_norm's row statistics) inside a region,
// with an output that no backward reads (the affine after it reads nothing): the region must still replay
// it for its statistics. Found by the random-graph test; bitwise equal to no checkpoint.
TYPED_TEST(Semantics, ExtraBufferOfOpWhoseOutputNobodyReadsIsReplayed) {
  using T = TypeParam;
  auto run = [](bool use_checkpoint, std::size_t* replayed) {
    Tape<T> tape;
    auto x = tape.variable(random_matrix<T>(3, 4, 20));
    auto gain = tape.variable(random_matrix<T>(1, 4, 21));
    auto bias = tape.variable(random_matrix<T>(1, 4, 22));
    auto f = [&](Var<T> h) { return remat::layer_norm(h, gain, bias) * 2.0; };
    auto loss = remat::sum(remat::sin(use_checkpoint ? remat::checkpoint(f)(x) : f(x)));
    tape.backward(loss);
    *replayed = tape.memory().replayed_ops;
    return checkpoint_test::gradients_of<T>({x, gain, bias});
  };
  std::size_t plain_ops = 0, checkpoint_ops = 0;
  const auto plain = run(false, &plain_ops);
  const auto checkpointed = run(true, &checkpoint_ops);
  for (std::size_t k = 0; k < plain.size(); ++k) EXPECT_TRUE(BitwiseEqual(plain[k], checkpointed[k])) << k;
  EXPECT_EQ(checkpoint_ops, 1u);  // layer_norm, for its statistics
}

// print_saved_residuals: one line per held value with node, op, shape, bytes and the reason.
TYPED_TEST(Semantics, PrintSavedResidualsListsOpShapeBytesAndReason) {
  using T = TypeParam;
  Tape<T> tape;
  auto x = tape.constant(random_matrix<T>(3, 4, 17));  // node 0
  auto w = tape.variable(random_matrix<T>(4, 5, 18));  // node 1
  auto region = remat::checkpoint(
      [&](Var<T> h) {
        auto u = remat::matmul(h, w);                              // node 2: dropped (read by sin)
        auto v = remat::checkpoint_name(remat::sin(u), "hidden");  // node 3, named: saved by the policy
        return remat::sin(v);                                      // node 4: the region output
      },
      remat::policies::save_only_these_names({"hidden"}));
  auto y = region(x);
  auto z = remat::square(y);                       // node 5, outside: reads node 4
  auto loss = remat::cross_entropy(z, {0, 4, 2});  // node 6: keeps its softmax [3,5] as extra
  std::ostringstream os;
  tape.print_saved_residuals(os);
  const std::string report = os.str();
  SCOPED_TRACE(report);
  const std::size_t b34 = bytes_of<T>(3, 4), b45 = bytes_of<T>(4, 5), b35 = bytes_of<T>(3, 5);
  const std::string collapsed = collapse_spaces(report);
  auto has_line = [&](int node, const std::string& op, const std::string& shape, std::size_t bytes,
                      const std::string& reason) {
    return collapsed.find(" #" + std::to_string(node) + " " + op + " " + shape + " " + std::to_string(bytes) + " B " +
                          reason + "\n") != std::string::npos;
  };
  EXPECT_TRUE(has_line(0, "constant", "[3,4]", b34, "region input"));
  EXPECT_TRUE(has_line(1, "variable", "[4,5]", b45, "region input"));
  // JAX's test_remat_saved_residuals: the named value is reported under its name.
  EXPECT_TRUE(has_line(3, "sin", "[3,5]", b35, "allowed by policy, named 'hidden'"));
  // The policy drops it; square's backward, outside the region, reads it.
  EXPECT_TRUE(has_line(4, "sin", "[3,5]", b35, "region output, read outside its region"));
  EXPECT_TRUE(has_line(6, "cross_entropy.extra", "[3,5]", b35, "residual of its own backward"));
  EXPECT_EQ(report.find("#2 "), std::string::npos);  // the dropped matmul output is not listed
  EXPECT_EQ(report.find("#5 "), std::string::npos);  // nor square's output (cross_entropy reads only its extra)
  const std::size_t total = b34 + b45 + b35 + b35 + b35;
  EXPECT_NE(report.find("total " + std::to_string(total) + " B"), std::string::npos);
  EXPECT_EQ(tape.memory().saved_bytes, total);
}

// A constant made inside a checkpointed function is kept as data, whatever the policy: it says so, not that
// the policy allowed it.
TYPED_TEST(Semantics, PrintSavedResidualsNamesAConstantMadeInsideARegion) {
  using T = TypeParam;
  Tape<T> tape;
  auto x = tape.variable(random_matrix<T>(2, 3, 20));
  auto loss = remat::sum(remat::checkpoint(
      [&](Var<T> v) { return remat::multiply(tape.constant(random_matrix<T>(2, 3, 21)), v); },  // node 1
      remat::policies::nothing_saveable)(x));
  std::ostringstream os;
  tape.print_saved_residuals(os);
  EXPECT_NE(collapse_spaces(os.str()).find(" #1 constant [2,3] " + std::to_string(bytes_of<T>(2, 3)) +
                                           " B constant recorded inside a checkpointed function (a leaf's data is "
                                           "kept, never regenerated)\n"),
            std::string::npos)
      << os.str();
  tape.backward(loss);
}

// An outside value that a backward outside any region reads is reported as such.
TYPED_TEST(Semantics, PrintSavedResidualsOutsideAnyRegion) {
  using T = TypeParam;
  Tape<T> tape;
  auto x = tape.variable(random_matrix<T>(2, 3, 19));  // node 0: read by sin's backward, no region
  auto loss = remat::sum(remat::sin(x));
  std::ostringstream os;
  tape.print_saved_residuals(os);
  EXPECT_NE(collapse_spaces(os.str()).find(" #0 variable [2,3] " + std::to_string(bytes_of<T>(2, 3)) +
                                           " B outside any region\n"),
            std::string::npos)
      << os.str();
}

}  // namespace semantics_test