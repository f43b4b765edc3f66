// Adversarial tests of compressed residuals (docs/compression.md) through the public API only. Each test checks a
// claim of the contract against an oracle that does not share the library's bookkeeping: bytes counted by hand from
// the formats' sizes, gradients compared bitwise with an uncompressed run (sign, and values the rule keeps as they
// are), or within a stated bound (bf16, int8).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "memory.hpp"
#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"

namespace compression_adversarial_test {

using remat::Compression;
using remat::Index;
using remat::Matrix;
using remat::Parameter;
using remat::Shape;
using remat::Tape;
using remat::Var;
using remat_test::bytes;
namespace policies = remat::policies;

template <class T>
using Fn3 = std::function<Var<T>(const Var<T>&, const Var<T>&, const Var<T>&)>;

/// Runs loss = sum(square(region(x, a, b))) with x constant, a and b variables; returns {dA, dB} and, optionally,
/// the saved bytes after the forward pass and the memory stats after backward.
template <class T>
struct Outcome {
  std::vector<Matrix<T>> grads;
  std::size_t saved = 0, forward_peak = 0, peak = 0, live_after = 0;
  std::string report;
};

template <class T, class Region>
Var<T> build(Tape<T>& tape, const Matrix<T>& xm, Parameter<T>& pa, Parameter<T>& pb, const Region& region) {
  const Var<T> x = tape.constant(xm), a = tape.variable(pa), b = tape.variable(pb);
  return remat::sum(remat::square(region(x, a, b)));
}

template <class T, class Region>
Outcome<T> run_step(const Matrix<T>& xm, const Matrix<T>& am, const Matrix<T>& bm, const Region& region) {
  Outcome<T> r;
  Parameter<T> pa(am), pb(bm);
  Tape<T> tape;
  {
    Var<T> loss = build(tape, xm, pa, pb, region);
    r.saved = tape.memory().saved_bytes;
    r.forward_peak = tape.memory().peak_bytes;
    std::ostringstream s;
    tape.print_saved_residuals(s);
    r.report = s.str();
    tape.backward(loss);
    r.peak = tape.memory().peak_bytes;
  }
  r.grads = {pa.grad(), pb.grad()};
  r.live_after = tape.memory().live_bytes;
  return r;
}

template <class T>
bool bitwise(const std::vector<Matrix<T>>& x, const std::vector<Matrix<T>>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(x[i].rows() == y[i].rows() && x[i].cols() == y[i].cols() && x[i] == y[i])) return false;
  return true;
}

template <class T>
double rel(const Matrix<T>& a, const Matrix<T>& b) {
  return static_cast<double>((a - b).norm() / b.norm());
}

template <class T, class Region>
void expect_estimate(const Matrix<T>& xm, const Matrix<T>& am, const Matrix<T>& bm, const Region& region,
                     const Outcome<T>& r) {
  Parameter<T> pa(am), pb(bm);
  const remat::MemoryEstimate e = remat::estimate_memory<T>([&](Tape<T>& t) { return build(t, xm, pa, pb, region); });
  EXPECT_EQ(e.saved_bytes, r.saved);
  EXPECT_EQ(e.forward_peak_bytes, r.forward_peak);
  EXPECT_EQ(e.peak_bytes, r.peak);
}

Matrix<float> rf(Index r, Index c, std::uint64_t seed, float scale = 1) {
  return remat_test::random_matrix<float>(r, c, seed) * scale;
}
Matrix<double> rd(Index r, Index c, std::uint64_t seed, double scale = 1) {
  return remat_test::random_matrix<double>(r, c, seed) * scale;
}

constexpr Index N = 32, D = 64;
constexpr std::size_t sign_bytes = 2048 / 64 * 8;  // a [32, 64] value as sign

// ---------------------------------------------------------------------------------------------------------------
// sign: bitwise gradients whatever the graph (the value stays as it is where a reader needs more than the sign)
// ---------------------------------------------------------------------------------------------------------------

/// Every value answered save_as(sign), on graphs where some reader needs more than the sign: the gradients must be
/// bitwise plain's in every case (the rule keeps such values as they are).
TEST(CompressionAdversarial, SignEverywhereKeepsGradientsBitwiseOnMixedGraphs) {
  const Matrix<float> xm = rf(N, D, 1), am = rf(D, D, 2, 0.2f), bm = rf(D, D, 3, 0.2f);
  using V = Var<float>;
  const std::vector<std::pair<const char*, Fn3<float>>> cases = {
      {"relu squared",
       [](const V& x, const V& a, const V&) {
         const V h = remat::relu(remat::matmul(x, a));
         return remat::multiply(h, h);
       }},
      {"relu then matmul",
       [](const V& x, const V& a, const V& b) { return remat::matmul(remat::relu(remat::matmul(x, a)), b); }},
      {"leaky input also read by exp",
       [](const V& x, const V& a, const V&) {
         const V m = remat::matmul(x, a);
         return remat::leaky_relu(m, 0.1) + remat::exp(m);
       }},
      {"leaky input also squared, leaky recorded last",
       [](const V& x, const V& a, const V&) {
         const V m = remat::matmul(x, a);
         const V s = remat::square(m);
         return s + remat::leaky_relu(m, 0.1);
       }},
      {"relu through reshape then matmul",
       [](const V& x, const V& a, const V& b) {
         const V h = remat::relu(remat::matmul(x, a));
         return remat::matmul(remat::reshape(h, N, D), b);
       }},
      {"relu of reshape, reshape read by matmul",
       [](const V& x, const V& a, const V& b) {
         const V r = remat::reshape(remat::matmul(x, a), N, D);
         return remat::matmul(remat::relu(r), b) + remat::leaky_relu(r, 0.3);
       }},
      {"relu then leaky then matmul",
       [](const V& x, const V& a, const V& b) {
         const V h = remat::relu(remat::matmul(x, a));
         return remat::matmul(remat::leaky_relu(h, 0.2), b);
       }},
      {"relu read by concat then matmul",
       [](const V& x, const V& a, const V& b) {
         const V h = remat::relu(remat::matmul(x, a));
         const V c = remat::concat({h, h}, 0);
         return remat::matmul(remat::reshape(c, 2 * N, D), b);
       }},
      {"maximum of relu and leaky",
       [](const V& x, const V& a, const V&) {
         const V m = remat::matmul(x, a);
         return remat::maximum(remat::relu(m), remat::leaky_relu(m, 0.5));
       }},
      {"matmul(h, h) of a relu",
       [](const V& x, const V& a, const V&) {
         const V h = remat::relu(remat::matmul(remat::reshape(x, D, N), remat::reshape(a, N, D * 2)));
         return remat::matmul(remat::reshape(h, D * 2, D), remat::reshape(h, D, D * 2));
       }},
  };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    const Outcome<float> want = run_step(xm, am, bm, f);
    for (const auto& policy : std::vector<std::function<policies::Decision(const remat::OpInfo&)>>{
             policies::save_compressed(Compression::sign(), policies::everything_saveable),
             policies::save_compressed(Compression::sign(), policies::ops_named({"relu", "leaky_relu", "matmul"})),
             policies::save_from_both_policies(
                 policies::dots_saveable,
                 policies::save_compressed(Compression::sign(), policies::everything_saveable))}) {
      const Outcome<float> got = run_step(xm, am, bm, remat::checkpoint(f, policy));
      EXPECT_TRUE(bitwise(got.grads, want.grads)) << got.report;
      EXPECT_EQ(got.live_after, want.live_after);
      expect_estimate(xm, am, bm, remat::checkpoint(f, policy), got);
    }
  }
}

/// Sign on nested regions, both orders: outer sign around inner nothing_saveable, and inner sign inside outer
/// nothing_saveable. Bitwise gradients, and the bytes: the first stores nothing compressed.
TEST(CompressionAdversarial, SignNestedRegionsBothOrders) {
  const Matrix<float> xm = rf(N, D, 4), am = rf(D, D, 5), bm = rf(D, D, 6);
  using V = Var<float>;
  auto f = [](const V& x, const V& a, const V& b) {
    return remat::relu(remat::matmul(x, a)) + remat::relu(remat::matmul(x, b));
  };
  const Outcome<float> want = run_step(xm, am, bm, f);
  const auto sign_relu = policies::save_compressed(Compression::sign(), policies::ops_named({"relu"}));
  {
    const auto g = remat::checkpoint(remat::checkpoint(f, policies::nothing_saveable), sign_relu);
    const Outcome<float> got = run_step(xm, am, bm, g);
    EXPECT_TRUE(bitwise(got.grads, want.grads));
    // x and the output only.
    EXPECT_EQ(got.saved, 2 * bytes<float>(N, D)) << got.report;
    expect_estimate(xm, am, bm, g, got);
  }
  {
    const auto g = remat::checkpoint(remat::checkpoint(f, sign_relu), policies::nothing_saveable);
    const Outcome<float> got = run_step(xm, am, bm, g);
    EXPECT_TRUE(bitwise(got.grads, want.grads));
    EXPECT_EQ(got.saved, 2 * bytes<float>(N, D)) << got.report;
    expect_estimate(xm, am, bm, g, got);
  }
  {  // sign inside sign: both regions compress
    const auto g = remat::checkpoint(remat::checkpoint(f, sign_relu), sign_relu);
    const Outcome<float> got = run_step(xm, am, bm, g);
    EXPECT_TRUE(bitwise(got.grads, want.grads));
    EXPECT_EQ(got.saved, 2 * bytes<float>(N, D) + 2 * sign_bytes) << got.report;
    expect_estimate(xm, am, bm, g, got);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Bytes by hand
// ---------------------------------------------------------------------------------------------------------------

/// N-D values with odd element counts and last dimensions that are not multiples of the int8 group. f(x, a, b) =
/// tanh(x ⊙ a) ⊙ b with x [3,5,7]: the internal value t = tanh(x ⊙ a) is read by tanh's backward and by the
/// product's (db = t ⊙ g); it is the only compressed one that is kept. Also saved: x (da = x ⊙ g'), b (dt = b ⊙ g)
/// and the output (square reads it), full.
template <class T>
void nd_bytes_case(const Shape& shape, const Compression& c, std::size_t stored_by_hand, double max_error) {
  const Index n = shape.numel();
  std::vector<T> xs(static_cast<std::size_t>(n)), as(xs.size()), bs(xs.size());
  remat_test::Random rng(77);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    xs[i] = static_cast<T>(rng.uniform(-2, 2));
    as[i] = static_cast<T>(rng.uniform(-1, 1));
    bs[i] = static_cast<T>(rng.uniform(-1, 1));
  }
  auto f = [](const Var<T>& x, const Var<T>& a, const Var<T>& b) {
    return remat::multiply(remat::tanh(remat::multiply(x, a)), b);
  };
  auto go = [&](auto region, std::size_t* saved, remat::MemoryStats* stats) {
    Tape<T> tape;
    const Var<T> x = tape.constant(shape, xs.data()), a = tape.variable(shape, as.data()),
                 b = tape.variable(shape, bs.data());
    Var<T> loss = remat::sum(remat::square(region(x, a, b)));
    if (saved) *saved = tape.memory().saved_bytes;
    tape.backward(loss);
    if (stats) *stats = tape.memory();
    std::vector<Matrix<T>> g{Matrix<T>(a.grad()), Matrix<T>(b.grad())};
    return g;
  };
  remat::MemoryStats plain_stats;
  const std::vector<Matrix<T>> want = go(f, nullptr, &plain_stats);
  std::size_t saved = 0;
  remat::MemoryStats stats;
  const auto policy = policies::save_compressed(c, policies::everything_saveable);
  const std::vector<Matrix<T>> got = go(remat::checkpoint(f, policy), &saved, &stats);
  const std::size_t full = static_cast<std::size_t>(n) * sizeof(T);
  EXPECT_EQ(saved, 3 * full + stored_by_hand) << remat_test::describe(stats);
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_LT(rel(got[i], want[i]), max_error) << i;
  const remat::MemoryEstimate e = remat::estimate_memory<T>([&](Tape<T>& tape) {
    const Var<T> x = tape.constant(shape, xs.data()), a = tape.variable(shape, as.data()),
                 b = tape.variable(shape, bs.data());
    return remat::sum(remat::square(remat::checkpoint(f, policy)(x, a, b)));
  });
  EXPECT_EQ(e.saved_bytes, saved);
  // The run holds its leaves' Vars through backward (to read their gradients), the estimate does not: compare the
  // estimate's peak with the run's through the same difference the uncompressed step shows.
  const remat::MemoryEstimate e_plain = remat::estimate_memory<T>([&](Tape<T>& tape) {
    const Var<T> x = tape.constant(shape, xs.data()), a = tape.variable(shape, as.data()),
                 b = tape.variable(shape, bs.data());
    return remat::sum(remat::square(f(x, a, b)));
  });
  EXPECT_EQ(stats.peak_bytes - e.peak_bytes, plain_stats.peak_bytes - e_plain.peak_bytes);
}

TEST(CompressionAdversarial, NdShapesOddCountsBytesByHand) {
  // 105 elements: bf16 210 B, rounded up to whole elements: 212 (float), 216 (double).
  {
    SCOPED_TRACE("bf16 float [3,5,7]");
    nd_bytes_case<float>(Shape{3, 5, 7}, Compression::bf16(), 212, 1e-2);
  }
  {
    SCOPED_TRACE("bf16 double [3,5,7]");
    nd_bytes_case<double>(Shape{3, 5, 7}, Compression::bf16(), 216, 1e-2);
  }
  // int8, groups of 8 consecutive elements across the slices of 7: ⌈105/8⌉ = 14 scales (the last group 1 element).
  // Codes 105 → 108; + 56 = 164 (float), 168 in whole doubles.
  {
    SCOPED_TRACE("int8/8 float [3,5,7]");
    nd_bytes_case<float>(Shape{3, 5, 7}, Compression::int8_per_group(8), 108 + 56, 3e-2);
  }
  {
    SCOPED_TRACE("int8/8 double [3,5,7]");
    nd_bytes_case<double>(Shape{3, 5, 7}, Compression::int8_per_group(8), 168, 3e-2);
  }
  // [2,3,4,20], int8/8: 480 elements in 60 groups of 8 (groups cross the slices of 20). 480 codes + 240 = 720.
  {
    SCOPED_TRACE("int8/8 float [2,3,4,20]");
    nd_bytes_case<float>(Shape{2, 3, 4, 20}, Compression::int8_per_group(8), 480 + 240, 3e-2);
  }
  // per row: 24 scales → 480 + 96.
  {
    SCOPED_TRACE("int8/row double [2,3,4,20]");
    nd_bytes_case<double>(Shape{2, 3, 4, 20}, Compression::int8_per_row(), 480 + 96, 3e-2);
  }
  // sign of 105: 2 words = 16 B; but tanh and the product read more than the sign: stays full.
  {
    SCOPED_TRACE("sign double [3,5,7] (stays full)");
    nd_bytes_case<double>(Shape{3, 5, 7}, Compression::sign(), 105 * 8, 1e-15);
  }
  // rank 1 (a vector of 13): bf16 26 → 28 (float), 32 (double).
  {
    SCOPED_TRACE("bf16 float [13]");
    nd_bytes_case<float>(Shape{13}, Compression::bf16(), 28, 1e-2);
  }
  {
    SCOPED_TRACE("int8/row double [13]");
    nd_bytes_case<double>(Shape{13}, Compression::int8_per_row(), 24, 3e-2);  // 16 + 4 → whole doubles
  }
}

/// A value whose view is read by a backward: t = tanh(x·a), v = reshape(t) read by square's backward; every value
/// answered bf16. Checks that the values around it are compressed, the gradients stay within bf16's error, no buffer
/// outlives the backward and the estimate matches. (t itself stays as it is: AValueReadThroughAViewStaysAsItIs.)
TEST(CompressionAdversarial, ValuesAroundAViewAreStoredCompressed) {
  const Matrix<double> xm = rd(N, D, 8), am = rd(D, D, 9, 0.2), bm = rd(D, D, 10, 0.2);
  using V = Var<double>;
  auto f = [](const V& x, const V& a, const V& b) {
    const V t = remat::tanh(remat::matmul(x, a));
    const V v = remat::reshape(t, D, N);
    return remat::matmul(remat::square(v), remat::reshape(b, N, D * 2));
  };
  const Outcome<double> want = run_step(xm, am, bm, f);
  const auto policy = policies::save_compressed(Compression::bf16(), policies::everything_saveable);
  const Outcome<double> got = run_step(xm, am, bm, remat::checkpoint(f, policy));
  for (std::size_t i = 0; i < 2; ++i) EXPECT_LT(rel(got.grads[i], want.grads[i]), 2e-2);
  // Saved: x (dA), b (reshape(b) is a view of the region input; dS = g·bᵀ), t's buffer (through v: tanh's backward
  // and square's), square's output (dB reads it), the region output.
  // By hand with t in bf16: x 16384 + t 4096 + square(v) 16384 + output [64,128] 65536 (+ b, through its view).
  EXPECT_LT(got.saved, want.saved) << "nothing was compressed: " << got.report;
  EXPECT_EQ(got.live_after, want.live_after);
  expect_estimate(xm, am, bm, remat::checkpoint(f, policy), got);
}

// ---------------------------------------------------------------------------------------------------------------
// n-input ops, the same value read twice
// ---------------------------------------------------------------------------------------------------------------

/// t = tanh(x·a) [64,64] read by matmul(t, t) (both inputs), concat, stack and maximum, stored bf16: t takes
/// 2·4096 B; gradients within bf16's error; the estimate's figures are the run's; no buffer outlives the backward.
TEST(CompressionAdversarial, SameValueReadTwiceByOneOp) {
  const Matrix<double> xm = rd(D, D, 11), am = rd(D, D, 12, 0.2), bm = rd(D, D, 13, 0.2);
  using V = Var<double>;
  const std::vector<std::pair<const char*, Fn3<double>>> cases = {
      {"matmul(t, t)",
       [](const V& x, const V& a, const V& b) {
         const V t = remat::tanh(remat::matmul(x, a));
         return remat::matmul(remat::matmul(t, t), b);
       }},
      {"t * t",
       [](const V& x, const V& a, const V& b) {
         const V t = remat::tanh(remat::matmul(x, a));
         return remat::matmul(remat::multiply(t, t), b);
       }},
      {"maximum(t, -t)",
       [](const V& x, const V& a, const V& b) {
         const V t = remat::tanh(remat::matmul(x, a));
         return remat::matmul(remat::maximum(t, remat::neg(t)), b);
       }},
      {"concat then matmul",
       [](const V& x, const V& a, const V& b) {
         const V t = remat::tanh(remat::matmul(x, a));
         const V c = remat::concat({t, t}, 1);  // [64,128]
         return remat::matmul(remat::reshape(c, D, 2 * D), remat::concat({b, b}, 0));
       }},
      {"stack then square",
       [](const V& x, const V& a, const V& b) {
         const V t = remat::tanh(remat::matmul(x, a));
         const V s = remat::stack({t, remat::matmul(t, b)}, 0);
         return remat::reshape(remat::multiply(s, s), 2 * D, D);
       }},
  };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    const Outcome<double> want = run_step(xm, am, bm, f);
    for (const Compression c : {Compression::bf16(), Compression::int8_per_group(16)}) {
      SCOPED_TRACE(c.name());
      const auto policy = policies::save_compressed(c, policies::everything_saveable);
      const Outcome<double> got = run_step(xm, am, bm, remat::checkpoint(f, policy));
      for (std::size_t i = 0; i < 2; ++i) {
        EXPECT_LT(rel(got.grads[i], want.grads[i]), 3e-2) << i << got.report;
        if (std::string(name) != "concat then matmul" || i == 0) {
          EXPECT_GT(rel(got.grads[i], want.grads[i]), 0) << i;
        }
      }
      EXPECT_LT(got.saved, want.saved) << got.report;
      EXPECT_EQ(got.live_after, want.live_after);
      expect_estimate(xm, am, bm, remat::checkpoint(f, policy), got);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Repeated backwards and steps
// ---------------------------------------------------------------------------------------------------------------

/// retain_graph then a second backward: both backwards give the same gradients (each reads the decoded values);
/// Tape::gradient gives what backward gives; a step with clear() repeated keeps live and cached bytes stable and
/// equal to the uncompressed tape's after backward.
TEST(CompressionAdversarial, RetainGraphGradientAndRepeatedSteps) {
  Parameter<double> w1(rd(D, D, 14, 0.2)), w2(rd(D, D, 15, 0.2));
  const Matrix<double> xm = rd(N, D, 16);
  using V = Var<double>;
  auto f = [](const V& x, const V& a, const V& b) {
    const V h = remat::relu(remat::matmul(x, a));
    return remat::tanh(remat::matmul(h, b));
  };
  for (const Compression c : {Compression::bf16(), Compression::int8_per_row(), Compression::sign()}) {
    SCOPED_TRACE(c.name());
    const auto policy = policies::save_compressed(c, policies::everything_saveable);
    Tape<double> tape;
    auto loss_of = [&] {
      return remat::sum(
          remat::square(remat::checkpoint(f, policy)(tape.constant(xm), tape.variable(w1), tape.variable(w2))));
    };
    {
      const V loss = loss_of();
      const std::size_t saved = tape.memory().saved_bytes;
      tape.backward(loss, true);
      EXPECT_EQ(tape.memory().saved_bytes, saved);
      const Matrix<double> g1 = w1.grad(), g2 = w2.grad();
      w1.zero_grad();
      w2.zero_grad();
      tape.backward(loss, true);
      EXPECT_TRUE(w1.grad() == g1 && w2.grad() == g2) << "second backward differs";
      w1.zero_grad();
      w2.zero_grad();
      tape.backward(loss);
      EXPECT_TRUE(w1.grad() == g1 && w2.grad() == g2) << "third backward differs";
      w1.zero_grad();
      w2.zero_grad();
    }
    tape.clear();
    std::size_t live = 0, cached = 0;
    Matrix<double> g1;
    for (int step = 0; step < 4; ++step) {
      const V loss = loss_of();
      tape.backward(loss);
      if (step == 0) g1 = w1.grad();
      EXPECT_TRUE(w1.grad() == g1) << step;
      w1.zero_grad();
      w2.zero_grad();
      tape.clear();
      if (step == 1) {
        live = tape.memory().live_bytes;
        cached = tape.memory().cached_bytes;
      } else if (step > 1) {
        EXPECT_EQ(tape.memory().live_bytes, live) << step;
        EXPECT_EQ(tape.memory().cached_bytes, cached) << step;
      }
    }
    // Tape::gradient by the weights as Vars == backward's.
    {
      Tape<double> t2;
      const V x = t2.constant(xm), a = t2.variable(w1.value()), b = t2.variable(w2.value());
      const V loss = remat::sum(remat::square(remat::checkpoint(f, policy)(x, a, b)));
      const std::vector<Matrix<double>> g = t2.gradient(loss, {a, b}, true);
      const std::vector<Matrix<double>> g2 = t2.gradient(loss, {a});
      EXPECT_TRUE(g[0] == g1);
      EXPECT_TRUE(g2[0] == g1);
    }
  }
}

/// live_bytes after backward equals the uncompressed run's (no packed buffer outlives its readers), for every
/// format, on the documented worked example, and after the Vars are gone.
TEST(CompressionAdversarial, NoPackedBufferOutlivesBackward) {
  const Matrix<float> xm = rf(N, D, 17), am = rf(D, D, 18), bm = rf(D, D, 19);
  using V = Var<float>;
  auto f = [](const V& x, const V& a, const V& b) {
    const V h = remat::relu(remat::matmul(x, a));
    return remat::matmul(h, b) + remat::relu(remat::matmul(x, b));
  };
  const Outcome<float> want = run_step(xm, am, bm, f);
  for (const Compression c :
       {Compression::bf16(), Compression::int8_per_row(), Compression::int8_per_group(8), Compression::sign()}) {
    SCOPED_TRACE(c.name());
    const auto p = policies::save_compressed(c, policies::everything_saveable);
    const Outcome<float> got = run_step(xm, am, bm, remat::checkpoint(f, p));
    EXPECT_EQ(got.live_after, want.live_after);
    expect_estimate(xm, am, bm, remat::checkpoint(f, p), got);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Non-finite and extreme values
// ---------------------------------------------------------------------------------------------------------------

/// f(x, a) = square(x + a): t = x + a is read by square's backward (dt = 2·t·g), stored in c. loss = sum(f) so
/// that the gradient a receives at element i is 2·t_i exactly, and a NaN in x at one element gives a NaN there.
template <class T>
std::vector<Matrix<T>> square_of_sum(const Matrix<T>& xm, const Matrix<T>& am, const Compression* c) {
  Tape<T> tape;
  const Var<T> x = tape.constant(xm), a = tape.variable(am);
  auto f = [](const Var<T>& x, const Var<T>& a) { return remat::square(remat::add(x, a)); };
  Var<T> out = c ? remat::checkpoint(f, policies::save_compressed(*c, policies::everything_saveable))(x, a) : f(x, a);
  return tape.gradient(remat::sum(out), {a});
}

/// bf16 keeps infinities and NaN (the table). int8: the header says a group that held an infinity or a NaN decodes
/// to non-finite values; at least the NaN itself must not become a finite number (the plain gradient is NaN there).
TEST(CompressionAdversarial, NonFiniteValuesSurviveInt8AndBf16) {
  Matrix<float> xm = rf(4, 16, 20), am = rf(4, 16, 21);
  xm(1, 3) = std::numeric_limits<float>::quiet_NaN();
  xm(2, 0) = std::numeric_limits<float>::infinity();
  const Matrix<float> want = square_of_sum<float>(xm, am, nullptr)[0];
  ASSERT_TRUE(std::isnan(want(1, 3)));
  ASSERT_TRUE(std::isinf(want(2, 0)));
  {
    const Compression c = Compression::bf16();
    const Matrix<float> got = square_of_sum<float>(xm, am, &c)[0];
    EXPECT_TRUE(std::isnan(got(1, 3))) << got(1, 3);
    EXPECT_TRUE(std::isinf(got(2, 0))) << got(2, 0);
  }
  for (const Compression c : {Compression::int8_per_row(), Compression::int8_per_group(8)}) {
    SCOPED_TRACE(c.name());
    const Matrix<float> got = square_of_sum<float>(xm, am, &c)[0];
    EXPECT_FALSE(std::isfinite(got(1, 3))) << "the NaN became " << got(1, 3);
    EXPECT_FALSE(std::isfinite(got(2, 0))) << "the infinity became " << got(2, 0);
  }
}

/// bf16's contract: relative error ≤ 2⁻⁹ for a normal float magnitude. With t = x + a and loss = sum(t²), dA = 2·t̃
/// where t̃ is t read back, so |dA/(2t) − 1| ≤ 2⁻⁹ element by element. Large and small magnitudes in double and float.
TEST(CompressionAdversarial, Bf16RelativeErrorAtExtremeMagnitudes) {
  const Compression c = Compression::bf16();
  auto check = [&](auto zero, double value, const char* what) {
    using T = decltype(zero);
    SCOPED_TRACE(what);
    Matrix<T> xm = Matrix<T>::Constant(1, 8, T(0)), am = Matrix<T>::Constant(1, 8, static_cast<T>(value));
    const Matrix<T> got = square_of_sum<T>(xm, am, &c)[0];
    const double t = static_cast<double>(static_cast<T>(value));
    const double back = static_cast<double>(got(0, 0)) / 2;
    EXPECT_LE(std::fabs(back / t - 1), std::ldexp(1.0, -9)) << "stored " << t << ", read back " << back;
  };
  check(float(0), 1e30, "float 1e30");
  check(float(0), 1e-30, "float 1e-30");
  check(float(0), 1.5e38, "float 1.5e38 (2t below FLT_MAX)");
  check(double(0), 1e30, "double 1e30");
  check(double(0), 1e-30, "double 1e-30");
}

/// bf16 has float's range (docs/compression.md), as PyTorch's float64 → bfloat16: in double, 1e100 reads back as
/// infinity and 1e-100 as 0. int8's scale is a float: a double row of 1e60 reads back non-finite, never as a finite
/// wrong number.
TEST(CompressionAdversarial, Bf16AndInt8ScalesHaveFloatsRange) {
  {
    const Compression c = Compression::bf16();
    Matrix<double> xm = Matrix<double>::Zero(1, 2), am(1, 2);
    am << 1e100, 1e-100;
    const Matrix<double> got = square_of_sum<double>(xm, am, &c)[0];
    EXPECT_TRUE(std::isinf(got(0, 0))) << got(0, 0);
    EXPECT_EQ(got(0, 1), 0.0);
  }
  {
    const Compression c = Compression::int8_per_row();
    Matrix<double> xm = Matrix<double>::Zero(1, 8), am = Matrix<double>::Constant(1, 8, 1e60);
    const Matrix<double> got = square_of_sum<double>(xm, am, &c)[0];
    for (Index j = 0; j < 8; ++j) EXPECT_FALSE(std::isfinite(got(0, j))) << got(0, j);
  }
}

/// int8's contract: each element within absmax/254 of its value, for magnitudes in float's normal range, in double.
TEST(CompressionAdversarial, Int8BoundAtExtremeDoubleMagnitudes) {
  const Compression c = Compression::int8_per_row();
  for (double scale : {1e-3, 1e30, 1e-30}) {
    SCOPED_TRACE(scale);
    Matrix<double> am = rd(2, 16, 22) * scale, xm = Matrix<double>::Zero(2, 16);
    const Matrix<double> got = square_of_sum<double>(xm, am, &c)[0];
    for (Index r = 0; r < 2; ++r) {
      const double absmax = am.row(r).cwiseAbs().maxCoeff();
      for (Index j = 0; j < 16; ++j) {
        const double err = std::fabs(got(r, j) / 2 - am(r, j));
        EXPECT_LE(err, absmax / 254 * (1 + 1e-6))
            << "row " << r << " col " << j << ": " << am(r, j) << " read back " << got(r, j) / 2;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Odd policies
// ---------------------------------------------------------------------------------------------------------------

/// save_as for leaves, for region inputs and for ops that require no gradient (a constant's exp): leaves and inputs
/// are not op outputs of the region (kept as they are); a no-grad value read by a backward is stored compressed
/// (bf16) or kept as it is (sign: its reader needs more than the sign). Gradients: sign bitwise, bf16 within error.
TEST(CompressionAdversarial, SaveAsForLeavesAndNoGradOps) {
  const Matrix<float> xm = rf(N, D, 23), am = rf(D, D, 24, 0.2f), bm = rf(D, D, 25, 0.2f);
  using V = Var<float>;
  auto f = [](const V& x, const V& a, const V& b) {
    const V e = remat::exp(remat::multiply(x, x));  // no gradient
    const V c = remat::full_like(x, 0.5);
    return remat::matmul(remat::multiply(e, remat::matmul(x, a)) + c, b);
  };
  const Outcome<float> want = run_step(xm, am, bm, f);
  {
    const auto p = [](const remat::OpInfo&) { return policies::Decision::save_as(Compression::sign()); };
    const Outcome<float> got = run_step(xm, am, bm, remat::checkpoint(f, p));
    EXPECT_TRUE(bitwise(got.grads, want.grads)) << got.report;
    expect_estimate(xm, am, bm, remat::checkpoint(f, p), got);
  }
  {
    const auto p = [](const remat::OpInfo&) { return policies::Decision::save_as(Compression::bf16()); };
    const Outcome<float> got = run_step(xm, am, bm, remat::checkpoint(f, p));
    for (std::size_t i = 0; i < 2; ++i) EXPECT_LT(rel(got.grads[i], want.grads[i]), 1e-2);
    EXPECT_EQ(got.live_after, want.live_after);
    expect_estimate(xm, am, bm, remat::checkpoint(f, p), got);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Cases the review found
// ---------------------------------------------------------------------------------------------------------------

/// int8: a NaN in a group reads back non-finite, as plain's gradient there is NaN (it read back as 0 before its
/// group's scale became NaN).
TEST(CompressionAdversarial, Int8ReadsANanBackNonFinite) {
  Matrix<float> xm = Matrix<float>::Zero(1, 8), am = Matrix<float>::Ones(1, 8);
  xm(0, 3) = std::numeric_limits<float>::quiet_NaN();
  const Compression c = Compression::int8_per_row();
  const Matrix<float> plain = square_of_sum<float>(xm, am, nullptr)[0];
  const Matrix<float> got = square_of_sum<float>(xm, am, &c)[0];
  ASSERT_TRUE(std::isnan(plain(0, 3)));
  EXPECT_FALSE(std::isfinite(got(0, 3))) << "NaN read back as " << got(0, 3) / 2;
}

/// A value a view of which a reader keeps stays as it is (docs/compression.md: the view shares its buffer):
/// t = tanh(x·a) [32,64] (read by tanh's backward, and through v = reshape(t) by square's), bf16 everywhere.
/// Saved by hand: x (matmul's backward, 16384), t as it is (16384); square's output is the region's output (16384).
TEST(CompressionAdversarial, AValueReadThroughAViewStaysAsItIs) {
  const Matrix<double> xm = rd(N, D, 31), am = rd(D, D, 32, 0.2), bm = rd(D, D, 33);
  using V = Var<double>;
  auto f = [](const V& x, const V& a, const V&) {
    return remat::square(remat::reshape(remat::tanh(remat::matmul(x, a)), D, N));
  };
  const auto policy = policies::save_compressed(Compression::bf16(), policies::everything_saveable);
  const Outcome<double> got = run_step(xm, am, bm, remat::checkpoint(f, policy));
  EXPECT_EQ(got.saved, 2 * bytes<double>(N, D) + bytes<double>(D, N)) << got.report;
}

/// A value stored int8 that relu's backward reads (so it keeps an exact sign mask) and that an inner region's replay
/// also reads: relu's derivative must stay exact (the mask), so a column whose values int8 rounds to 0 keeps its
/// gradient. h = relu(x·W1) with W1's column 0 scaled by 1e-4; out = inner(h, W2), inner = tanh(h·W2) checkpointed
/// with nothing_saveable. dW1's column 0 must be within int8's error of plain's, not 0.
TEST(CompressionAdversarial, ReluMaskExactWhenAReplayAlsoReadsTheValue) {
  Matrix<float> am = rf(D, D, 34);
  am.col(0) *= 1e-4f;
  const Matrix<float> xm = rf(N, D, 35), bm = rf(D, D, 36, 0.1f);
  using V = Var<float>;
  auto inner = remat::checkpoint([](const V& h, const V& b) { return remat::tanh(remat::matmul(h, b)); },
                                 policies::nothing_saveable);
  auto f = [inner](const V& x, const V& a, const V& b) { return inner(remat::relu(remat::matmul(x, a)), b); };
  const Outcome<float> want = run_step(xm, am, bm, f);
  for (const Compression c : {Compression::int8_per_row(), Compression::bf16()}) {
    SCOPED_TRACE(c.name());
    const auto policy = policies::save_compressed(c, policies::everything_saveable);
    const Outcome<float> got = run_step(xm, am, bm, remat::checkpoint(f, policy));
    const Matrix<float> g0 = got.grads[0].col(0), w0 = want.grads[0].col(0);
    // Lost (relu reading int8's rounded values), column 0 would be about 0; kept, it moves by the lossy dh only.
    EXPECT_LT(rel(g0, w0), 0.2) << "relu's derivative on column 0 lost: " << g0.norm() << " vs " << w0.norm() << "\n"
                                << got.report;
    EXPECT_LT(rel(got.grads[1], want.grads[1]), 0.1);
    expect_estimate(xm, am, bm, remat::checkpoint(f, policy), got);
  }
}

/// leaky_relu reads its input's sign (the mask), and an inner region's replay, recorded before it, reads the same
/// input in full: the replay must not read the 0/1 mask decoded for leaky_relu's backward.
TEST(CompressionAdversarial, ReplayAfterASignOnlyReadReadsTheFullValue) {
  const Matrix<float> xm = rf(N, D, 37), am = rf(D, D, 38, 0.3f), bm = rf(D, D, 39, 0.3f);
  using V = Var<float>;
  auto inner = remat::checkpoint([](const V& m, const V& b) { return remat::tanh(remat::matmul(m, b)); },
                                 policies::nothing_saveable);
  auto f = [inner](const V& x, const V& a, const V& b) {
    const V m = remat::matmul(x, a);
    const V r = inner(m, b);
    return r + remat::leaky_relu(m, 0.1);
  };
  const Outcome<float> want = run_step(xm, am, bm, f);
  for (const Compression c : {Compression::int8_per_row(), Compression::bf16(), Compression::sign()}) {
    SCOPED_TRACE(c.name());
    const auto policy = policies::save_compressed(c, policies::everything_saveable);
    const Outcome<float> got = run_step(xm, am, bm, remat::checkpoint(f, policy));
    // int8 per row moves these gradients by ~5 % (tanh of a lossy product); reading the 0/1 mask instead of the
    // value would move them by ~100 %. bf16 (which also keeps a mask) stays within 1 %.
    const double bound = c == Compression::bf16() ? 2e-2 : 0.1;
    for (std::size_t i = 0; i < 2; ++i) EXPECT_LT(rel(got.grads[i], want.grads[i]), bound) << i << got.report;
    if (c == Compression::sign()) {
      EXPECT_TRUE(bitwise(got.grads, want.grads));
    }
    EXPECT_EQ(got.live_after, want.live_after);
    expect_estimate(xm, am, bm, remat::checkpoint(f, policy), got);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------------------------

/// Inside a chain run by its schedule (checkpoint_sequential_auto, run_schedule): refused with tape_error, and the
/// tape stays usable (a plain step on it afterwards gives plain's gradients).
TEST(CompressionAdversarial, RefusedInsideAScheduledChainTapeUsable) {
  Parameter<double> w(rd(D, D, 26, 0.2));
  const Matrix<double> xm = rd(N, D, 27);
  using V = Var<double>;
  const auto p = policies::save_compressed(Compression::bf16(), policies::everything_saveable);
  V wv;  // the weight on the tape in use, set before each run
  auto layer = [&](const V& h) {
    return remat::checkpoint([](const V& h, const V& w) { return remat::tanh(remat::tanh(remat::matmul(h, w))); }, p)(
        h, wv);
  };
  auto plain_layer = [&](const V& h) { return remat::tanh(remat::tanh(remat::matmul(h, wv))); };
  std::vector<std::function<V(const V&)>> layers(6, std::function<V(const V&)>(layer)),
      plain_layers(6, std::function<V(const V&)>(plain_layer));
  Matrix<double> want;
  {
    Tape<double> t;
    wv = t.variable(w);
    t.backward(remat::sum(remat::square(remat::checkpoint_sequential(plain_layers, 2, t.constant(xm)))));
    wv = V();
    want = w.grad();
    w.zero_grad();
  }
  for (const std::size_t budget : {std::size_t{1} << 22, std::size_t{200000}, std::size_t{170000}}) {
    SCOPED_TRACE(budget);
    Tape<double> tape;
    wv = tape.variable(w);
    const V x = tape.constant(xm);
    bool threw_tape_error = false;
    remat::AutoScheduleReport report;
    try {
      const V y = remat::checkpoint_sequential_auto(layers, x, budget, &report);
      tape.backward(remat::sum(remat::square(y)));
      EXPECT_LT(rel(Matrix<double>(w.grad()), want), 1e-2);
    } catch (const remat::tape_error& e) {
      threw_tape_error = true;
      EXPECT_NE(std::string(e.what()).find("save_as(bf16)"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a tape_error: " << e.what();
    }
    // A budget that keeps every layer gives a persistent schedule, run as nested checkpoint regions, where compression
    // is supported (the gradient error is then bf16's); below it the schedule is not persistent: refused.
    if (budget != (std::size_t{1} << 22)) {
      EXPECT_TRUE(threw_tape_error) << "a compressed answer inside a scheduled chain was accepted";
    }
    w.zero_grad();
    tape.clear();
    wv = tape.variable(w);
    tape.backward(remat::sum(remat::square(remat::checkpoint_sequential(plain_layers, 2, tape.constant(xm)))));
    EXPECT_TRUE(w.grad() == want);
    w.zero_grad();
    wv = V();
  }
  {  // a persistent and a non-persistent schedule by run_schedule
    Tape<double> probe;
    wv = probe.variable(w);
    remat::AutoScheduleReport report;
    remat::checkpoint_sequential_auto(plain_layers, probe.constant(xm), std::size_t{200000}, &report);
    w.zero_grad();
    Tape<double> tape;
    wv = tape.variable(w);
    bool threw = false;
    try {
      remat::run_schedule(layers, report.schedule, tape.constant(xm));
    } catch (const remat::tape_error& e) {
      threw = true;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a tape_error: " << e.what();
    }
    // Either way the tape stays usable: a non-persistent schedule (one chain region) refuses, a persistent one runs
    // as nested regions; RefusedInsideAScheduledChainTapeUsable checks the refusal.
    (void)threw;
    tape.backward(remat::sum(remat::square(remat::checkpoint_sequential(plain_layers, 2, tape.constant(xm)))));
    EXPECT_TRUE(w.grad() == want);
    w.zero_grad();
    wv = V();
  }
}

/// A budget set on a tape holding int8 values, after the forward (both orders: the budget before a second step on
/// the same tape): gradients bitwise equal to the run without a budget each time, and after clear() a plain step on
/// the budgeted tape gives plain's gradients.
TEST(CompressionAdversarial, BudgetSetEitherSideOfCompressedValues) {
  Parameter<double> w1(rd(D, D, 28, 0.2)), w2(rd(D, D, 29, 0.2));
  const Matrix<double> xm = rd(N, D, 30);
  using V = Var<double>;
  auto f = [](const V& x, const V& a, const V& b) {
    return remat::tanh(remat::matmul(remat::tanh(remat::matmul(x, a)), b));
  };
  const auto p = policies::save_compressed(Compression::int8_per_row(), policies::everything_saveable);
  auto take = [&] {
    Matrix<double> g = w1.grad();
    w1.zero_grad();
    w2.zero_grad();
    return g;
  };
  auto loss = [&](Tape<double>& t, bool compressed) {
    const V x = t.constant(xm), a = t.variable(w1), b = t.variable(w2);
    return remat::sum(remat::square(compressed ? remat::checkpoint(f, p)(x, a, b) : f(x, a, b)));
  };
  Matrix<double> plain, compressed;
  {
    Tape<double> t;
    t.backward(loss(t, false));
    plain = take();
    t.clear();
    t.backward(loss(t, true));
    compressed = take();
  }
  Tape<double> tape;
  {
    const V l = loss(tape, true);
    tape.set_memory_budget(1 << 24);
    tape.backward(l);
    EXPECT_TRUE(take() == compressed);
  }
  tape.clear();
  tape.backward(loss(tape, true));
  EXPECT_TRUE(take() == compressed);
  tape.clear();
  tape.backward(loss(tape, false));
  EXPECT_TRUE(take() == plain);
}

}  // namespace compression_adversarial_test
