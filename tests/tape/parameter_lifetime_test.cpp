// A Parameter's lifetime against the tape that recorded it: a std::vector of Parameters reallocated, erased
// or grown between forward and backward, a Parameter destroyed, move-constructed, move-assigned or swapped
// before the backward (each either receives its gradient or makes the backward throw stale_value_error, never a
// read of freed memory); a temporary Parameter cannot be recorded (compile-time checks). Errors are typed,
// name the op and shapes, and leave the tape usable with its memory() figures unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace parameter_lifetime_test {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using Policy = std::function<bool(const remat::OpInfo&)>;

template <class T>
Matrix<T> rnd(remat::Index r, remat::Index c, unsigned seed, double scale = 1.0) {
  std::srand(seed);
  Matrix<T> m = Matrix<T>::Random(r, c);
  return m * static_cast<T>(scale);
}

template <class T>
bool same_bits(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

// ---------------------------------------------------------------------------------------------------------------
// Parameter lifetime.
template <class P, class = void>
struct can_record : std::false_type {};
template <class P>
struct can_record<P, std::void_t<decltype(std::declval<Tape<float>&>().variable(std::declval<P>()))>> : std::true_type {
};
static_assert(can_record<Parameter<float>&>::value, "a named Parameter can be recorded");
static_assert(!can_record<Parameter<float>>::value, "a temporary Parameter must not be recordable");
static_assert(!can_record<Parameter<float>&&>::value, "an xvalue Parameter must not be recordable");
static_assert(!can_record<const Parameter<float>&&>::value, "a const rvalue Parameter must not be recordable");

/// Records x -> checkpoint(tanh(linear(h, W, b))) -> cross_entropy for W, b at params[0], params[1].
// With x_grad, linear's backward reads W (so a changed W is a stale read); without, it reads only x.
inline Var<float> small_program(Tape<float>& tape, Parameter<float>& W, Parameter<float>& b, bool ck,
                                bool x_grad = false) {
  auto w = tape.variable(W), c = tape.variable(b);
  auto body = [w, c](Var<float> h) { return remat::tanh(remat::linear(h, w, c)); };
  auto x = x_grad ? tape.variable(rnd<float>(8, 16, 3)) : tape.constant(rnd<float>(8, 16, 3));
  Var<float> y = ck ? remat::checkpoint(body, remat::policies::nothing_saveable)(x) : body(x);
  return remat::cross_entropy(y, {0, 1, 2, 3, 4, 5, 6, 7});
}

TEST(ParameterLifetime, VectorReallocationBetweenForwardAndBackward) {
  Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
  Matrix<float> gw, gb;
  {
    Tape<float> t;
    auto l = small_program(t, W0, B0, false);
    t.backward(l);
    gw = W0.grad();
    gb = B0.grad();
  }
  for (bool ck : {false, true}) {
    std::vector<Parameter<float>> v;
    v.reserve(2);
    v.emplace_back(rnd<float>(16, 16, 1, 0.3));
    v.emplace_back(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, v[0], v[1], ck);
    const Parameter<float>* before = v.data();
    for (int i = 0; i < 40; ++i) v.emplace_back(Matrix<float>::Ones(3, 3));
    ASSERT_NE(before, v.data());
    ASSERT_NO_THROW(t.backward(l));
    EXPECT_TRUE(same_bits(gw, Matrix<float>(v[0].grad()))) << ck;
    EXPECT_TRUE(same_bits(gb, Matrix<float>(v[1].grad()))) << ck;
  }
}

TEST(ParameterLifetime, DestroyedParameterBeforeBackward) {
  for (bool ck : {false, true}) {
    auto W = std::make_unique<Parameter<float>>(rnd<float>(16, 16, 1, 0.3));
    Parameter<float> B(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, *W, B, ck);
    W.reset();
    ASSERT_NO_THROW(t.backward(l)) << ck;
    Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
    Tape<float> t0;
    auto l0 = small_program(t0, W0, B0, false);
    t0.backward(l0);
    EXPECT_TRUE(same_bits(Matrix<float>(B0.grad()), Matrix<float>(B.grad()))) << ck;
  }
}

TEST(ParameterLifetime, MoveConstructedParameterReceivesGradient) {
  Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
  Tape<float> t0;
  auto l0 = small_program(t0, W0, B0, false);
  t0.backward(l0);
  for (bool ck : {false, true}) {
    Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, W, B, ck);
    Parameter<float> W2(std::move(W)), B2(std::move(B));
    ASSERT_NO_THROW(t.backward(l));
    EXPECT_TRUE(same_bits(Matrix<float>(W0.grad()), Matrix<float>(W2.grad()))) << ck;
    EXPECT_TRUE(same_bits(Matrix<float>(B0.grad()), Matrix<float>(B2.grad()))) << ck;
  }
}

// Move assignment (what std::swap, vector::erase and std::sort do) of a recorded weight whose value
// backward reads: must throw stale_value_error (typed), never a silent wrong gradient.
TEST(ParameterLifetime, MoveAssignedWeightIsStale) {
  for (bool ck : {false, true}) {
    Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2)), other(rnd<float>(16, 16, 9));
    Tape<float> t;
    auto l = small_program(t, W, B, ck, /*x_grad=*/true);
    other = std::move(W);  // W's storage loses its value
    EXPECT_THROW(t.backward(l), remat::stale_value_error) << ck;
  }
}

// Assignments of recorded Parameters whose values backward never reads (biases; W when x is a constant), between
// forward and backward. Assignment keeps the object's storage (so optimizers keep updating the object), so the
// recorded value's gradient would land in whichever value replaced it, or nowhere. backward must refuse with
// stale_value_error and leave every gradient untouched. (A regression test: the gradients were lost or silently
// misrouted.)
TEST(ParameterLifetime, SwappedBiasesMakeBackwardThrow) {
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2)), spare(rnd<float>(1, 16, 5));
  Tape<float> t;
  auto l = small_program(t, W, B, false);
  std::swap(B, spare);  // move construct + two move assignments
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
  EXPECT_FALSE(W.has_grad());
  EXPECT_FALSE(B.has_grad());
  EXPECT_FALSE(spare.has_grad());
  std::swap(B, spare);  // the values are back, but in each other's storage: still refused
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
}

TEST(ParameterLifetime, MoveAssignedUnreadWeightMakesBackwardThrow) {
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2)), other(rnd<float>(16, 16, 9));
  Tape<float> t;
  auto l = small_program(t, W, B, false);
  other = std::move(W);
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
  EXPECT_FALSE(other.has_grad());
  EXPECT_FALSE(B.has_grad());
  // A fresh forward pass on the parameters as they are now works.
  Tape<float> t2;
  t2.backward(small_program(t2, other, B, false));
  EXPECT_TRUE(other.has_grad());
}

TEST(ParameterLifetime, VectorEraseOfRecordedBiasesMakesBackwardThrow) {
  std::vector<Parameter<float>> v;
  for (unsigned i = 0; i < 3; ++i) v.emplace_back(rnd<float>(1, 16, 20 + i));
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3));
  Tape<float> t;
  auto w = t.variable(W);
  auto x = t.constant(rnd<float>(8, 16, 3));
  auto h = remat::tanh(remat::linear(x, w, t.variable(v[0])));
  h = remat::tanh(remat::linear(h * 2.0f, w, t.variable(v[1])));
  h = remat::tanh(remat::linear(h * 3.0f, w, t.variable(v[2])));
  auto l = remat::cross_entropy(h, {0, 1, 2, 3, 4, 5, 6, 7});
  v.erase(v.begin());  // v[0] = move(v[1]), v[1] = move(v[2])
  EXPECT_THROW(t.backward(l), remat::stale_value_error);
  EXPECT_FALSE(W.has_grad());
  for (const auto& b : v) EXPECT_FALSE(b.has_grad());
}

// Reallocation moves by construction: the storages move with the objects, nothing is assigned.
TEST(ParameterLifetime, VectorGrowthOfRecordedBiasesKeepsGradients) {
  std::vector<Parameter<float>> v, ref;
  for (unsigned i = 0; i < 2; ++i) v.emplace_back(rnd<float>(1, 16, 20 + i));
  ref = v;
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), W0 = W;
  auto build = [](Tape<float>& t, Parameter<float>& W, Parameter<float>& b0, Parameter<float>& b1) {
    auto w = t.variable(W);
    auto h = remat::tanh(remat::linear(t.constant(rnd<float>(8, 16, 3)), w, t.variable(b0)));
    h = remat::tanh(remat::linear(h, w, t.variable(b1)));
    return remat::cross_entropy(h, {0, 1, 2, 3, 4, 5, 6, 7});
  };
  Tape<float> t0;
  t0.backward(build(t0, W0, ref[0], ref[1]));
  Tape<float> t;
  auto l = build(t, W, v[0], v[1]);
  const auto* before = v.data();
  for (int i = 0; i < 64; ++i) v.emplace_back(rnd<float>(1, 16, 99));
  ASSERT_NE(v.data(), before);
  t.backward(l);
  EXPECT_TRUE(same_bits(Matrix<float>(ref[0].grad()), Matrix<float>(v[0].grad())));
  EXPECT_TRUE(same_bits(Matrix<float>(ref[1].grad()), Matrix<float>(v[1].grad())));
  EXPECT_TRUE(same_bits(Matrix<float>(W0.grad()), Matrix<float>(W.grad())));
}

// ---------------------------------------------------------------------------------------------------------------
// Errors are typed, name the op and shapes, and leave the tape usable with unchanged memory().
inline bool same_mem(const remat::MemoryStats& a, const remat::MemoryStats& b) {
  return a.live_bytes == b.live_bytes && a.peak_bytes == b.peak_bytes && a.saved_bytes == b.saved_bytes &&
         a.replayed_bytes == b.replayed_bytes && a.replayed_ops == b.replayed_ops && a.cached_bytes == b.cached_bytes;
}

template <class E, class F>
void expect_error(Tape<float>& tape, F f, std::vector<std::string> must_contain) {
  const auto before = tape.memory();
  const std::size_t n = tape.size();
  bool caught = false;
  try {
    f();
  } catch (const E& e) {
    caught = true;
    const std::string w = e.what();
    for (const auto& s : must_contain) EXPECT_NE(w.find(s), std::string::npos) << "'" << s << "' not in: " << w;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  EXPECT_TRUE(caught);
  EXPECT_TRUE(same_mem(before, tape.memory())) << must_contain[0];
  EXPECT_EQ(n, tape.size()) << must_contain[0];
}

TEST(TypedErrors, TypedErrorsThenTapeStillWorks) {
  Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2));
  Parameter<float> W0(rnd<float>(16, 16, 1, 0.3)), B0(rnd<float>(1, 16, 2));
  Tape<float> t0;
  auto l0 = small_program(t0, W0, B0, false);
  t0.backward(l0);

  Tape<float> t;
  auto a = t.variable(rnd<float>(3, 4, 1)), b = t.variable(rnd<float>(5, 2, 2)), w = t.variable(rnd<float>(15, 16, 3));
  auto bias_bad = t.variable(rnd<float>(1, 15, 4)), x = t.constant(rnd<float>(8, 16, 5));
  auto wv = t.variable(W), bv = t.variable(B);
  auto c = t.variable(rnd<float>(2, 4, 6));
  expect_error<remat::shape_error>(t, [&] { remat::matmul(a, b); }, {"matmul", "[3,4]", "[5,2]"});
  expect_error<remat::shape_error>(t, [&] { remat::linear(x, w, bv); }, {"linear", "[8,16]", "[15,16]"});
  expect_error<remat::shape_error>(t, [&] { remat::linear(x, wv, bias_bad); }, {"linear", "[1,15]"});
  expect_error<remat::shape_error>(t, [&] { (void)(a + c); }, {"add", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { (void)(a - c); }, {"subtract", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { (void)(a * c); }, {"multiply", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { remat::cross_entropy(a, {0, 1}); }, {"cross_entropy", "[3,4]", "2"});
  expect_error<remat::index_error>(t, [&] { remat::cross_entropy(a, {0, 1, 4}); }, {"cross_entropy", "4"});
  expect_error<remat::index_error>(t, [&] { remat::cross_entropy(a, {0, -1, 1}); }, {"cross_entropy", "-1"});
  expect_error<remat::shape_error>(t, [&] { remat::mse_loss(a, c); }, {"mse_loss", "[3,4]", "[2,4]"});
  expect_error<remat::shape_error>(t, [&] { t.backward(a); }, {"backward", "[3,4]"});
  expect_error<remat::shape_error>(t, [&] { t.gradient(a, {a}); }, {"gradient", "[3,4]"});
  // Inside a checkpointed function: the error propagates typed.
  auto bad_region = remat::checkpoint([&](Var<float> h) { return remat::matmul(h, b); });
  EXPECT_THROW(bad_region(a), remat::shape_error);

  // The tape still works: a real program on it gives the oracle gradient.
  auto wv2 = t.variable(W), bv2 = t.variable(B);
  auto body = [wv2, bv2](Var<float> h) { return remat::tanh(remat::linear(h, wv2, bv2)); };
  auto loss = remat::cross_entropy(remat::checkpoint(body)(t.constant(rnd<float>(8, 16, 3))), {0, 1, 2, 3, 4, 5, 6, 7});
  t.backward(loss);
  EXPECT_TRUE(same_bits(Matrix<float>(W0.grad()), Matrix<float>(W.grad())));
  EXPECT_TRUE(same_bits(Matrix<float>(B0.grad()), Matrix<float>(B.grad())));
  // Second freeing backward: freed_value_error, gradients and memory untouched.
  const Matrix<float> g1 = W.grad();
  expect_error<remat::freed_value_error>(t, [&] { t.backward(loss); }, {"backward"});
  EXPECT_TRUE(same_bits(g1, Matrix<float>(W.grad())));
  expect_error<remat::freed_value_error>(t, [&] { t.gradient(loss, {wv2}); }, {"gradient"});
}

TEST(TypedErrors, StaleParameterTypedAndNothingChanged) {
  for (bool ck : {false, true}) {
    Parameter<float> W(rnd<float>(16, 16, 1, 0.3)), B(rnd<float>(1, 16, 2));
    Tape<float> t;
    auto l = small_program(t, W, B, ck, /*x_grad=*/true);
    W.mutable_value()(0, 0) += 1.0f;
    expect_error<remat::stale_value_error>(t, [&] { t.backward(l); }, {"[16,16]"});
    EXPECT_FALSE(W.has_grad());
    EXPECT_FALSE(B.has_grad());
  }
}

}  // namespace parameter_lifetime_test
