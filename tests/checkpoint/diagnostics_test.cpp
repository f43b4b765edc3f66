// Checkpoint diagnostics (Tape::diagnostics, diagnose, set_diagnostics_handler): each case on a program
// where it applies and on a neighbouring one where it must not, with the bytes at stake written here from
// the shapes (float, 4 bytes an element), not read from the tape.
#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint_support.hpp"
#include "remat/remat.hpp"

namespace diagnostics_test {

using checkpoint_test::random_matrix;
using remat::CheckpointDiagnostic;
using remat::Matrix;
using remat::Tape;
using remat::Var;
using Kind = CheckpointDiagnostic::Kind;

constexpr remat::Index rows = 4, width = 8;
constexpr std::size_t value_bytes = rows * width * sizeof(float);  // one [4,8] float value: 128 bytes

/// tanh(tanh(h·W)) under nothing_saveable: it keeps its input; its replay regenerates the product, the inner
/// tanh (whose backward reads its output) and the outer one, its output (JAX's rule: an output only its own
/// backward reads is dropped like any other value): 3 values of [4,8].
Var<float> layer(const Var<float>& h, const Var<float>& w) {
  return remat::tanh(remat::tanh(remat::matmul(h, w)));
}
constexpr std::size_t layer_replay_bytes = 3 * value_bytes;

std::vector<CheckpointDiagnostic> of_kind(const std::vector<CheckpointDiagnostic>& all, Kind k) {
  std::vector<CheckpointDiagnostic> out;
  for (const auto& d : all)
    if (d.kind == k) out.push_back(d);
  return out;
}

bool same(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.cached_bytes == b.cached_bytes;
}

TEST(CheckpointDiagnostics, TheLastCheckpointedLayerBeforeTheLossIsReportedAndOnlyIt) {
  Tape<float> tape;
  const Var<float> x = tape.variable(random_matrix<float>(rows, width, 1));
  std::vector<Var<float>> w;
  for (int i = 0; i < 3; ++i) w.push_back(tape.variable(random_matrix<float>(width, width, 10 + i, 0.3)));
  Var<float> h = x;
  for (int i = 0; i < 3; ++i) h = remat::checkpoint([&, i](const Var<float>& a) { return layer(a, w[i]); })(h);
  const Var<float> loss = remat::sum(h);  // its backward reads nothing: the sweep frees nothing before region 2
  const remat::MemoryStats before = tape.memory();
  const auto found = tape.diagnostics(loss);
  EXPECT_TRUE(same(tape.memory(), before));
  ASSERT_EQ(found.size(), 1u);
  const CheckpointDiagnostic& d = found[0];
  EXPECT_EQ(d.kind, Kind::replays_at_once);
  EXPECT_EQ(d.region, 2);
  EXPECT_EQ(d.depth, 1);
  EXPECT_EQ(d.replay_bytes, layer_replay_bytes);
  EXPECT_EQ(d.freed_before_replay, 0u);
  EXPECT_EQ(d.loss, remat::detail::VarAccess::id(loss));
  EXPECT_NE(d.message.find("checkpoint region #2"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("last region before the loss"), std::string::npos) << d.message;
  EXPECT_NE(d.message.find("384 bytes"), std::string::npos) << d.message;
  // Without an explicit loss the last recorded value is taken: the same finding.
  ASSERT_EQ(tape.diagnostics().size(), 1u);
  EXPECT_EQ(tape.diagnostics()[0].region, 2);
}

TEST(CheckpointDiagnostics, ALastLayerIsNotReportedWhenTheSweepFreesMoreBeforeReachingIt) {
  Tape<float> tape;
  const Var<float> x = tape.variable(random_matrix<float>(rows, width, 2));
  const Var<float> w = tape.variable(random_matrix<float>(width, width, 20, 0.3));
  const Var<float> h = remat::checkpoint([&](const Var<float>& a) { return layer(a, w); })(x);
  // Outside any region: three tanh outputs of [4,8] are saved (each read by its own backward), 384 bytes
  // freed before the sweep reaches the region, at least half of its 384-byte replay.
  const Var<float> y = remat::tanh(remat::tanh(remat::tanh(h)));
  const Var<float> loss = remat::sum(y);
  EXPECT_TRUE(tape.diagnostics(loss).empty());
  // Reported when the sweep frees less than half of the replay's 384 bytes before it: two tanh of [4,8]
  // after the region free 256 bytes (not reported), one of [4,1] after the row sums 16 (reported).
  auto last_layer_then = [](auto&& tail) {
    Tape<float> t;
    const Var<float> x1 = t.variable(random_matrix<float>(rows, width, 2));
    const Var<float> w1 = t.variable(random_matrix<float>(width, width, 20, 0.3));
    const Var<float> h1 = remat::checkpoint([&](const Var<float>& a) { return layer(a, w1); })(x1);
    return t.diagnostics(remat::sum(tail(h1)));
  };
  EXPECT_TRUE(last_layer_then([](const Var<float>& v) { return remat::tanh(remat::tanh(v)); }).empty());
  const auto found = last_layer_then([](const Var<float>& v) { return remat::tanh(remat::sum_rows(v)); });
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, Kind::replays_at_once);
  EXPECT_EQ(found[0].freed_before_replay, rows * sizeof(float));
}

TEST(CheckpointDiagnostics, ARegionThatComputesTheLossIsReported) {
  Tape<float> tape;
  const Var<float> x = tape.variable(random_matrix<float>(rows, width, 3));
  const Var<float> w = tape.variable(random_matrix<float>(width, width, 30, 0.3));
  const Var<float> loss = remat::checkpoint([&](const Var<float>& a) { return remat::sum(layer(a, w)); })(x);
  const auto found = tape.diagnostics(loss);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, Kind::replays_at_once);
  EXPECT_NE(found[0].message.find("contains the loss"), std::string::npos) << found[0].message;
  // The outer tanh's output is no longer returned: the replay regenerates it too.
  EXPECT_EQ(found[0].replay_bytes, 3 * value_bytes);
}

TEST(CheckpointDiagnostics, CheckpointSequentialLeavesTheLastSegmentUncheckedSoNothingIsReported) {
  Tape<float> tape;
  const Var<float> x = tape.variable(random_matrix<float>(rows, width, 4));
  std::vector<Var<float>> w;
  for (int i = 0; i < 4; ++i) w.push_back(tape.variable(random_matrix<float>(width, width, 40 + i, 0.3)));
  std::vector<std::function<Var<float>(const Var<float>&)>> layers;
  for (int i = 0; i < 4; ++i) layers.push_back([&, i](const Var<float>& a) { return layer(a, w[i]); });
  const Var<float> loss = remat::sum(remat::checkpoint_sequential(layers, 2, x));
  EXPECT_TRUE(tape.diagnostics(loss).empty());
}

TEST(CheckpointDiagnostics, ARegionWhoseInputsNeedNoGradientIsReported) {
  Tape<float> tape;
  const Var<float> c = tape.constant(random_matrix<float>(rows, width, 5));
  const Var<float> wc = tape.constant(random_matrix<float>(width, width, 50, 0.3));
  const Var<float> w = tape.variable(random_matrix<float>(width, width, 51, 0.3));
  const Var<float> features = remat::checkpoint([&](const Var<float>& a) { return layer(a, wc); })(c);
  const Var<float> loss = remat::sum(remat::matmul(features, w));
  const auto found = tape.diagnostics(loss);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, Kind::needs_no_gradient);
  EXPECT_EQ(found[0].region, 0);
  EXPECT_NE(found[0].message.find("nothing in it requires a gradient"), std::string::npos) << found[0].message;
  // detach() makes a variable's region need no gradient too.
  Tape<float> tape2;
  const Var<float> v = tape2.variable(random_matrix<float>(rows, width, 6));
  const Var<float> w2 = tape2.variable(random_matrix<float>(width, width, 60, 0.3));
  const Var<float> f2 =
      remat::checkpoint([&](const Var<float>& a) { return layer(remat::detach(a), remat::detach(w2)); })(v);
  const Var<float> loss2 = remat::sum(remat::matmul(f2, w2));
  EXPECT_EQ(of_kind(tape2.diagnostics(loss2), Kind::needs_no_gradient).size(), 1u);
}

TEST(CheckpointDiagnostics, ARegionWhosePolicyKeepsEverythingItsBackwardReadsIsReported) {
  Tape<float> tape;
  const Var<float> x = tape.variable(random_matrix<float>(rows, width, 7));
  const Var<float> w = tape.variable(random_matrix<float>(width, width, 70, 0.3));
  // everything_saveable: the product is saved for nothing (tanh reads its output), the two tanh outputs
  // for their backwards: 2 values of [4,8] kept by the region (the product's buffer is freed at once).
  const Var<float> h =
      remat::checkpoint([&](const Var<float>& a) { return layer(a, w); }, remat::policies::everything_saveable)(x);
  // A scaled copy reads nothing it computes: nothing_saveable has nothing to drop.
  const Var<float> g = remat::checkpoint([](const Var<float>& a) { return a * 2.0f + 1.0f; })(h);
  const Var<float> loss = remat::sum(remat::tanh(g));
  const auto found = of_kind(tape.diagnostics(loss), Kind::drops_nothing);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].region, 0);
  EXPECT_EQ(found[0].kept_bytes, 2 * value_bytes);
  EXPECT_EQ(found[1].region, 1);
  EXPECT_EQ(found[1].kept_bytes, 0u);
  EXPECT_NE(found[0].message.find("drops nothing"), std::string::npos) << found[0].message;
  EXPECT_NE(found[0].message.find("256 bytes"), std::string::npos) << found[0].message;
  // The same layer under nothing_saveable drops what its backward reads: not reported.
  Tape<float> tape2;
  const Var<float> x2 = tape2.variable(random_matrix<float>(rows, width, 7));
  const Var<float> w2 = tape2.variable(random_matrix<float>(width, width, 70, 0.3));
  const Var<float> h2 = remat::checkpoint([&](const Var<float>& a) { return layer(a, w2); })(x2);
  const Var<float> loss2 = remat::sum(remat::tanh(remat::tanh(remat::tanh(h2))));
  EXPECT_TRUE(tape2.diagnostics(loss2).empty());
}

TEST(CheckpointDiagnostics, ANestedRegionThatDropsNothingIsReportedWithItsDepth) {
  Tape<float> tape;
  const Var<float> x = tape.variable(random_matrix<float>(rows, width, 8));
  const Var<float> w = tape.variable(random_matrix<float>(width, width, 80, 0.3));
  auto inner =
      remat::checkpoint([&](const Var<float>& a) { return layer(a, w); }, remat::policies::everything_saveable);
  const Var<float> h = remat::checkpoint([&](const Var<float>& a) { return remat::tanh(inner(remat::tanh(a))); })(x);
  const Var<float> loss = remat::sum(remat::tanh(remat::tanh(remat::tanh(remat::tanh(h)))));
  const auto found = tape.diagnostics(loss);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].kind, Kind::drops_nothing);
  EXPECT_EQ(found[0].depth, 2);
  EXPECT_NE(found[0].message.find("nested at depth 2"), std::string::npos) << found[0].message;
}

TEST(CheckpointDiagnostics, TheHandlerHearsOfEachRegionOnceARecordingAndMayThrowWithoutHarm) {
  Tape<float> tape;
  std::vector<CheckpointDiagnostic> heard;
  bool fail = true;
  tape.set_diagnostics_handler([&](const CheckpointDiagnostic& d) {
    heard.push_back(d);
    if (fail) throw std::runtime_error("logger unavailable");
  });
  auto record = [&]() {
    const Var<float> x = tape.variable(random_matrix<float>(rows, width, 9));
    const Var<float> w = tape.variable(random_matrix<float>(width, width, 90, 0.3));
    const Var<float> loss = remat::sum(remat::checkpoint([&](const Var<float>& a) { return layer(a, w); })(x));
    return std::make_pair(x, loss);
  };
  auto [x, loss] = record();
  const remat::MemoryStats before = tape.memory();
  EXPECT_THROW(tape.backward(loss, /*retain_graph=*/true), std::runtime_error);
  EXPECT_EQ(heard.size(), 1u);
  EXPECT_TRUE(same(tape.memory(), before));  // backward did nothing
  EXPECT_EQ(tape.memory().replayed_ops, 0u);
  fail = false;
  tape.backward(loss, /*retain_graph=*/true);  // reported again (the handler threw), then the sweep runs
  EXPECT_EQ(heard.size(), 2u);
  const Matrix<float> once = x.grad();
  tape.backward(loss);  // the same recording: not reported again
  EXPECT_EQ(heard.size(), 2u);
  EXPECT_EQ(x.grad(), Matrix<float>(2 * once));
  tape.clear();
  auto [x2, loss2] = record();
  tape.backward(loss2);  // a new recording: reported again
  EXPECT_EQ(heard.size(), 3u);
  EXPECT_EQ(heard.back().kind, Kind::replays_at_once);
  tape.set_diagnostics_handler(nullptr);
  tape.clear();
  auto [x3, loss3] = record();
  tape.backward(loss3);
  EXPECT_EQ(heard.size(), 3u);
}

TEST(CheckpointDiagnostics, DiagnosePrintsOneLinePerFindingAndNothingWithoutOne) {
  Tape<float> tape;
  const Var<float> x = tape.variable(random_matrix<float>(rows, width, 11));
  const Var<float> w = tape.variable(random_matrix<float>(width, width, 110, 0.3));
  const Var<float> c = tape.constant(random_matrix<float>(rows, width, 12));
  const Var<float> k = remat::checkpoint([&](const Var<float>& a) { return remat::tanh(a); })(c);
  remat::sum(remat::checkpoint([&](const Var<float>& a) { return layer(a, w); })(x) + k);
  std::ostringstream out;
  tape.diagnose(out);
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_NE(text.find("checkpoint region #0"), std::string::npos) << text;
  EXPECT_NE(text.find("checkpoint region #1"), std::string::npos) << text;
  Tape<float> plain;
  remat::sum(remat::tanh(plain.variable(random_matrix<float>(rows, width, 13))));
  std::ostringstream none;
  plain.diagnose(none);
  EXPECT_TRUE(none.str().empty());
}

TEST(CheckpointDiagnostics, ALossOfAnotherTapeIsATapeError) {
  Tape<float> a, b;
  const Var<float> loss = remat::sum(b.variable(random_matrix<float>(2, 2, 14)));
  EXPECT_THROW(a.diagnostics(loss), remat::tape_error);
  EXPECT_THROW(a.diagnostics(Var<float>()), remat::tape_error);
}

}  // namespace diagnostics_test
