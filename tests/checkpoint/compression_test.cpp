// Compressed residuals (policies::Decision::save_as, remat/compression.hpp): a policy's third answer. Each test
// derives the saved bytes by hand from the formats' sizes (Compression::stored_bytes' comment), checks the
// gradients against an uncompressed run — bitwise for the sign of a relu, within the format's error for bf16 and
// int8 — and that every figure a shapes-only estimate gives equals the real run's.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "int8_reference.hpp"
#include "memory.hpp"
#include "random.hpp"
#include "remat/estimate.hpp"
#include "remat/remat.hpp"
#include "take_grads.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace compression_test {

using remat::Compression;
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
using remat_test::bytes;
namespace policies = remat::policies;

constexpr remat::Index N = 32, D = 64;  // a batch of 32 rows of 64 features: 2048 elements a value

/// Bytes of a [N, D] value stored as sign: ⌈2048 / 64⌉ words of 8 bytes.
constexpr std::size_t sign_bytes = 2048 / 64 * 8;

/// Two relus whose outputs only their own backwards read (add reads nothing): y = relu(x·W1) + relu(x·W2) computed
/// by `region` (a checkpointed function, or the function itself), loss = sum(y²).
template <class Region>
Var<float> two_relus(Tape<float>& tape, Parameter<float>& w1, Parameter<float>& w2, const Matrix<float>& xm,
                     const Region& region) {
  const Var<float> x = tape.constant(xm);
  const Var<float> a = tape.variable(w1), b = tape.variable(w2);
  const Var<float> y = region(x, a, b);
  return remat::sum(remat::square(y));
}

auto relus = [](const Var<float>& x, const Var<float>& a, const Var<float>& b) {
  return remat::relu(remat::matmul(x, a)) + remat::relu(remat::matmul(x, b));
};

/// w1's and w2's gradients, which are then cleared for the next run.
std::pair<Matrix<float>, Matrix<float>> take(Parameter<float>& w1, Parameter<float>& w2) {
  std::pair<Matrix<float>, Matrix<float>> g{w1.grad(), w2.grad()};
  w1.zero_grad();
  w2.zero_grad();
  return g;
}

/// The gradients of two_relus(…, region) without checkpoint: the run every checkpointed one is compared with.
template <class Region>
std::pair<Matrix<float>, Matrix<float>> plain_grads(Parameter<float>& w1, Parameter<float>& w2, const Matrix<float>& xm,
                                                    const Region& region) {
  Tape<float> tape;
  tape.backward(two_relus(tape, w1, w2, xm, region));
  return take(w1, w2);
}

/// Stored as sign, each relu's output takes 256 bytes instead of 8192 while the backward runs, and the gradients
/// equal the uncompressed ones bitwise: relu's derivative reads only y > 0.
TEST(Compression, SignKeepsARelusOutputInOneBitWithBitwiseGradients) {
  Parameter<float> w1(remat_test::random_matrix<float>(D, D, 1)), w2(remat_test::random_matrix<float>(D, D, 2));
  const Matrix<float> xm = remat_test::random_matrix<float>(N, D, 3);
  const auto [g1, g2] = plain_grads(w1, w2, xm, relus);

  Tape<float> tape;
  const auto policy = policies::save_compressed(Compression::sign(), policies::ops_named({"relu"}));
  const Var<float> loss = two_relus(tape, w1, w2, xm, remat::checkpoint(relus, policy));
  // Saved: x (both matmuls' backwards read it), the two masks; and the region's output y (square reads it).
  const std::size_t saved = 2 * bytes<float>(N, D) + 2 * sign_bytes;
  EXPECT_EQ(tape.memory().saved_bytes, saved) << remat_test::describe(tape.memory());
  std::ostringstream report;
  tape.print_saved_residuals(report);
  EXPECT_NE(report.str().find("stored as sign (8192 B as it is)"), std::string::npos) << report.str();
  tape.backward(loss);
  EXPECT_TRUE(w1.grad() == g1);
  EXPECT_TRUE(w2.grad() == g2);
  EXPECT_EQ(tape.memory().replayed_ops, 0u) << "nothing was dropped";
}

/// A relu whose output a matmul's backward also reads (dW2 = hᵀ·g) keeps it as it is: one bit would not give dW2.
/// Saved: x, h in full (8192 B), the output; the gradients are bitwise plain's.
TEST(Compression, SignKeepsTheValueAsItIsWhenAReaderNeedsMoreThanItsSign) {
  Parameter<float> w1(remat_test::random_matrix<float>(D, D, 4)), w2(remat_test::random_matrix<float>(D, D, 5));
  const Matrix<float> xm = remat_test::random_matrix<float>(N, D, 6);
  auto mlp = [](const Var<float>& x, const Var<float>& a, const Var<float>& b) {
    return remat::matmul(remat::relu(remat::matmul(x, a)), b);
  };
  const auto [g1, g2] = plain_grads(w1, w2, xm, mlp);
  Tape<float> tape;
  const Var<float> loss =
      two_relus(tape, w1, w2, xm,
                remat::checkpoint(mlp, policies::save_compressed(Compression::sign(), policies::ops_named({"relu"}))));
  EXPECT_EQ(tape.memory().saved_bytes, 3 * bytes<float>(N, D)) << remat_test::describe(tape.memory());
  tape.backward(loss);
  EXPECT_TRUE(w1.grad() == g1);
  EXPECT_TRUE(w2.grad() == g2);
}

/// ‖a − b‖ / ‖b‖.
double relative_error(const Matrix<double>& a, const Matrix<double>& b) {
  return (a - b).norm() / b.norm();
}

/// f(x) = tanh(tanh(x·W1)·W2), loss = sum(f²), in double. The one value inside f that a backward reads and f does
/// not return is t = tanh(x·W1) (its own backward and dW2 read it): stored in `c`, it takes c's bytes.
struct TwoLayers {
  Parameter<double> w1{remat_test::random_matrix<double>(D, D, 7) * 0.2};
  Parameter<double> w2{remat_test::random_matrix<double>(D, D, 8) * 0.2};
  Matrix<double> xm = remat_test::random_matrix<double>(N, D, 9);
  static Var<double> f(const Var<double>& x, const Var<double>& a, const Var<double>& b) {
    return remat::tanh(remat::matmul(remat::tanh(remat::matmul(x, a)), b));
  }
  template <class Region>
  Var<double> loss(Tape<double>& tape, const Region& region) {
    const Var<double> y = region(tape.constant(xm), tape.variable(w1), tape.variable(w2));
    return remat::sum(remat::square(y));
  }
  std::vector<Matrix<double>> grads() {
    std::vector<Matrix<double>> g{w1.grad(), w2.grad()};
    w1.zero_grad();
    w2.zero_grad();
    return g;
  }
  std::vector<Matrix<double>> plain() {
    Tape<double> tape;
    tape.backward(loss(tape, f));
    return grads();
  }
};

/// bf16 and int8: t [32, 64] is stored in 2 bytes an element (4096 B), in int8 with a scale per row (2048 + 32·4 B)
/// or per group of 32 consecutive elements (2048 + ⌈2048/32⌉·4 B); saved besides: x and f's output in full (double).
/// The gradients differ from plain's by about the format's step (bf16: 2⁻⁹ relative; int8: absmax/254), and the
/// estimate's figures are the run's.
TEST(Compression, LossyFormatsStoreTheirBytesAndBoundTheGradientError) {
  struct Case {
    Compression c;
    std::size_t stored;
    double max_error;
  };
  const Case cases[] = {{Compression::bf16(), 2 * 2048, 1e-2},
                        {Compression::int8_per_row(), 2048 + 32 * 4, 2e-2},
                        {Compression::int8_per_group(32), 2048 + (2048 + 31) / 32 * 4, 2e-2}};
  TwoLayers m;
  const std::vector<Matrix<double>> want = m.plain();
  for (const Case& k : cases) {
    SCOPED_TRACE(k.c.name());
    const auto policy = policies::save_compressed(k.c, policies::everything_saveable);
    Tape<double> tape;
    const Var<double> loss = m.loss(tape, remat::checkpoint(&TwoLayers::f, policy));
    const std::size_t saved = 2 * bytes<double>(N, D) + k.stored;
    EXPECT_EQ(tape.memory().saved_bytes, saved) << remat_test::describe(tape.memory());
    const std::size_t forward_peak = tape.memory().peak_bytes;
    tape.backward(loss);
    const std::vector<Matrix<double>> got = m.grads();
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double e = relative_error(got[i], want[i]);
      EXPECT_GT(e, 0) << "a lossy format changed nothing: was it applied?";
      EXPECT_LT(e, k.max_error) << i;
    }
    const remat::MemoryEstimate estimate = remat::estimate_memory<double>(
        [&](Tape<double>& t) { return m.loss(t, remat::checkpoint(&TwoLayers::f, policy)); });
    EXPECT_EQ(estimate.saved_bytes, saved);
    EXPECT_EQ(estimate.forward_peak_bytes, forward_peak);
    EXPECT_EQ(estimate.peak_bytes, tape.memory().peak_bytes);
  }
}

/// The nesting rule (policies::Decision): only regions that keep a value decide how. Outer region compresses
/// everything, inner one drops everything: the inner drop wins, nothing is compressed, the gradients are plain's
/// bitwise. The other way round (outer drops, inner compresses): the inner region's replay regenerates t, which is
/// then kept in bf16 for its readers, and the gradients move by bf16's error.
TEST(Compression, OnlyRegionsThatKeepAValueDecideHowItIsStored) {
  TwoLayers m;
  const std::vector<Matrix<double>> want = m.plain();
  const auto bf16_all = policies::save_compressed(Compression::bf16(), policies::everything_saveable);
  {
    const auto inner = remat::checkpoint(&TwoLayers::f, policies::nothing_saveable);
    Tape<double> tape;
    const Var<double> loss = m.loss(tape, remat::checkpoint(inner, bf16_all));
    tape.backward(loss);
    EXPECT_GT(tape.memory().replayed_ops, 0u);
    const std::vector<Matrix<double>> got = m.grads();
    EXPECT_TRUE(got[0] == want[0] && got[1] == want[1]);
  }
  {
    const auto inner = remat::checkpoint(&TwoLayers::f, bf16_all);
    Tape<double> tape;
    const Var<double> loss = m.loss(tape, remat::checkpoint(inner, policies::nothing_saveable));
    // After the forward pass: x and the output (f returns it through both regions) only; t is dropped by the outer.
    EXPECT_EQ(tape.memory().saved_bytes, 2 * bytes<double>(N, D));
    tape.backward(loss);
    EXPECT_GT(tape.memory().replayed_ops, 0u);
    const std::vector<Matrix<double>> got = m.grads();
    EXPECT_GT(relative_error(got[1], want[1]), 0);
    EXPECT_LT(relative_error(got[1], want[1]), 1e-2);
  }
}

/// By name: save_compressed over save_only_these_names stores only the named value compressed; with
/// save_from_both_policies, what dots_saveable keeps stays as it is.
TEST(Compression, ComposesWithNameAndDotPolicies) {
  TwoLayers m;
  auto named = [](const Var<double>& x, const Var<double>& a, const Var<double>& b) {
    const Var<double> t = remat::checkpoint_name(remat::tanh(remat::matmul(x, a)), "t");
    return remat::tanh(remat::matmul(t, b));
  };
  const auto policy = policies::save_from_both_policies(
      policies::dots_saveable,
      policies::save_compressed(Compression::int8_per_row(), policies::save_only_these_names({"t"})));
  Tape<double> tape;
  const Var<double> loss = m.loss(tape, remat::checkpoint(named, policy));
  // x; t in int8; the second product's output in full, which the replay of f's output reads (f's policy drops
  // that tanh: its own backward reads it inside f); f's output. The first product's output is read by nothing.
  EXPECT_EQ(tape.memory().saved_bytes, 3 * bytes<double>(N, D) + 2048 + 32 * 4);
  std::ostringstream report;
  tape.print_saved_residuals(report);
  EXPECT_NE(report.str().find("named 't', stored as int8/row"), std::string::npos) << report.str();
  tape.backward(loss);
}

/// A name given in place (checkpoint_name on relu's fresh output) makes the value sign-stored after it was recorded:
/// it is packed when the region closes all the same. Saved: x, the mask, the output; gradients bitwise.
TEST(Compression, ANamedValueStoredAsSignIsPacked) {
  Parameter<float> w1(remat_test::random_matrix<float>(D, D, 17)), w2(remat_test::random_matrix<float>(D, D, 18));
  const Matrix<float> xm = remat_test::random_matrix<float>(N, D, 19);
  auto f = [](const Var<float>& x, const Var<float>& a, const Var<float>& b) {
    return remat::checkpoint_name(remat::relu(remat::matmul(x, a)), "r") + remat::matmul(x, b);
  };
  const auto [g1, g2] = plain_grads(w1, w2, xm, f);
  Tape<float> tape;
  // Everything else saved: the sum reading r is not replayed, so nothing holds r until the region closes.
  const auto policy = policies::save_compressed(Compression::sign(), policies::save_only_these_names({"r"}),
                                                policies::everything_saveable);
  const Var<float> loss = two_relus(tape, w1, w2, xm, remat::checkpoint(f, policy));
  EXPECT_EQ(tape.memory().saved_bytes, 2 * bytes<float>(N, D) + sign_bytes) << remat_test::describe(tape.memory());
  tape.backward(loss);
  EXPECT_TRUE(w1.grad() == g1);
  EXPECT_TRUE(w2.grad() == g2);
}

/// y = [a > 0] ⊙ b²: a user op whose backward reads a only through its sign (sign_reads) and b as it is
/// (db = 2·b·[a > 0] dy; a gets no gradient: its step has derivative 0).
struct MaskedSquareOp : remat::OpBase {
  static constexpr const char* name = "masked_square";
  static constexpr remat::OpKind kind = remat::OpKind::elementwise;
  static constexpr unsigned sign_reads = remat::reads_input0;
  static unsigned reads(remat::GradInputs g) {
    return remat::wants(g, 1) ? remat::reads_input0 | remat::reads_input1 : remat::reads_nothing;
  }
  static remat::Shape output_shape(const remat::Shape* in, const Params&) { return in[1]; }
  template <class T>
  static void forward(const remat::ForwardContext<T>& c) {
    c.out().array() = (c.in(0).array() > T(0)).template cast<T>() * c.in(1).array().square();
  }
  template <class T>
  static void backward(const remat::BackwardContext<T>& c) {
    if (c.wants_grad(1))
      c.add_grad(1, c.grad_out().array() * T(2) * c.in(1).array() * (c.in(0).array() > T(0)).template cast<T>());
  }
  static double flops(const remat::Shape*, int, const remat::Shape& out) {
    return 3.0 * static_cast<double>(out.numel());
  }
};

/// One op reading one value as two inputs, one through its sign alone and one as it is: the value is decoded as it
/// is for both (a 0/1 mask would give b = [t > 0] to the full read). t = x·W in int8, y = masked_square(t, t): dW
/// within int8's error of plain's (reading the mask as b would move it by the values themselves, ~100 %).
TEST(Compression, AValueReadBothAsItsSignAndAsItIsDecodesAsItIs) {
  Parameter<float> w(remat_test::random_matrix<float>(D, D, 20));
  const Matrix<float> xm = remat_test::random_matrix<float>(N, D, 21);
  auto f = [](const Var<float>& x, const Var<float>& a) {
    const Var<float> t = remat::matmul(x, a);
    return remat::apply_op<MaskedSquareOp>(t, t);
  };
  auto run = [&](const auto& region) {
    Tape<float> tape;
    tape.backward(remat::sum(region(tape.constant(xm), tape.variable(w))));
    Matrix<float> g = w.grad();
    w.zero_grad();
    return g;
  };
  const Matrix<float> want = run(f);
  const Matrix<float> got =
      run(remat::checkpoint(f, policies::save_compressed(Compression::int8_per_row(), policies::everything_saveable)));
  EXPECT_GT((got - want).norm(), 0);
  EXPECT_LT((got - want).norm() / want.norm(), 2e-2);
}

/// Under a memory budget, set before the step or on a tape that already holds packed values (the budget's side table
/// starts then): the gradients are those of the run without a budget, bitwise (bf16's error included), and a budget
/// the step cannot meet throws memory_budget_error (tests/budget/compression_budget_test.cpp evicts).
TEST(Compression, UnderAMemoryBudgetTheGradientsAreTheUnbudgetedRuns) {
  TwoLayers m;
  const auto policy = policies::save_compressed(Compression::bf16(), policies::everything_saveable);
  std::vector<Matrix<double>> want;
  std::size_t peak = 0;
  {
    Tape<double> tape;
    tape.backward(m.loss(tape, remat::checkpoint(&TwoLayers::f, policy)));
    want = m.grads();
    peak = tape.memory().peak_bytes;
  }
  {
    Tape<double> tape;
    tape.set_memory_budget(1 << 30);
    tape.backward(m.loss(tape, remat::checkpoint(&TwoLayers::f, policy)));
    const std::vector<Matrix<double>> got = m.grads();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << i;
  }
  {
    Tape<double> tape;
    const Var<double> loss = m.loss(tape, remat::checkpoint(&TwoLayers::f, policy));
    tape.set_memory_budget(peak);
    tape.backward(loss);
    const std::vector<Matrix<double>> got = m.grads();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == want[i]) << i;
    EXPECT_LE(tape.memory().peak_bytes, peak);
  }
  {
    Tape<double> tape;
    tape.set_memory_budget(1024);
    EXPECT_THROW(m.loss(tape, remat::checkpoint(&TwoLayers::f, policy)), remat::memory_budget_error);
    m.grads();
  }
}

/// A CapturedStep logs each encode and decode with the buffers it used and runs them again: over four steps with new
/// inputs and updated weights, every replay's gradients and loss equal, bitwise, those of recording the same step on a
/// Tape — for every format, the relu mask decoded alone included (sign, and the exact mask of int8), and under a
/// memory budget. A replay that skipped an encode would decode the first step's values; one that skipped a decode
/// would read a freed or stale buffer.
TEST(Compression, ACapturedStepReplaysItsEncodesAndDecodes) {
  struct Case {
    const char* name;
    std::function<policies::Decision(const remat::OpInfo&)> policy;
    std::size_t budget;
  };
  const std::vector<Case> cases = {
      {"bf16, everything", policies::save_compressed(Compression::bf16(), policies::everything_saveable), 0},
      {"int8 per row, relus", policies::save_compressed(Compression::int8_per_row(), policies::ops_named({"relu"})), 0},
      {"sign, relus", policies::save_compressed(Compression::sign(), policies::ops_named({"relu"})), 0},
      {"int8 groups, relus, budget",
       policies::save_compressed(Compression::int8_per_group(32), policies::ops_named({"relu"})), 60000},
  };
  auto f = [](const Var<float>& x, const Var<float>& a, const Var<float>& b) {
    const Var<float> r = remat::relu(remat::matmul(x, a));
    return remat::relu(remat::matmul(r, b)) + r;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Parameter<float> w1(remat_test::random_matrix<float>(D, D, 61) * 0.2f),
        w2(remat_test::random_matrix<float>(D, D, 62) * 0.2f);
    Parameter<float> v1(w1.value()), v2(w2.value());  // the Tape's copies, updated alike
    auto loss = [&](Tape<float>& tape, const Var<float>& x, Parameter<float>& a, Parameter<float>& b) {
      Var<float> y = remat::checkpoint(f, c.policy)(x, tape.variable(a), tape.variable(b));
      for (int i = 0; i < 4; ++i) y = remat::tanh(y);  // exact values a budget may evict
      return remat::sum(remat::square(y));
    };
    Var<float> x;
    remat::CapturedStep<float> step([&](Tape<float>& tape) {
      if (c.budget != 0) tape.set_memory_budget(c.budget);
      x = tape.constant(remat_test::random_matrix<float>(N, D, 70));
      return loss(tape, x, w1, w2);
    });
    if (c.budget != 0) {
      EXPECT_GT(step.memory().evictions, 0u) << "the budget evicted nothing: it tests nothing";
    }
    for (int s = 0; s < 4; ++s) {
      const Matrix<float> batch = remat_test::random_matrix<float>(N, D, 70 + s);
      float replayed = step.last_loss();
      if (s > 0) {
        step.set_input(x, batch);
        replayed = step.replay();
      }
      Tape<float> tape;
      if (c.budget != 0) tape.set_memory_budget(c.budget);
      const Var<float> l = loss(tape, tape.constant(batch), v1, v2);
      tape.backward(l);
      EXPECT_EQ(replayed, l.item()) << "step " << s;
      EXPECT_TRUE(w1.grad() == v1.grad()) << "step " << s;
      EXPECT_TRUE(w2.grad() == v2.grad()) << "step " << s;
      for (Parameter<float>* p : {&w1, &w2, &v1, &v2}) {  // the same update on both copies
        p->mutable_value() -= 0.01f * p->grad();
        p->zero_grad();
      }
    }
  }
}

/// Sign where it would change the answer: relu's output y is read by exp's replay (the policy drops exp's output,
/// which exp's backward reads, so the replay computes it from y): a replay needs y's value, so y stays as it is, and
/// the gradients are plain's bitwise. leaky_relu reads its input's sign: the product before it, stored as sign, takes
/// 256 B, bitwise again. And two backwards with retain_graph read the packed values twice.
TEST(Compression, SignOnlyWhereEveryReaderReadsTheSign) {
  Parameter<float> w1(remat_test::random_matrix<float>(D, D, 10) * 0.1f),
      w2(remat_test::random_matrix<float>(D, D, 11));
  const Matrix<float> xm = remat_test::random_matrix<float>(N, D, 12);
  auto exp_of_relu = [](const Var<float>& x, const Var<float>& a, const Var<float>& b) {
    return remat::exp(remat::relu(remat::matmul(x, a))) + remat::matmul(x, b);
  };
  auto leaky = [](const Var<float>& x, const Var<float>& a, const Var<float>& b) {
    return remat::leaky_relu(remat::matmul(x, a), 0.1) + remat::leaky_relu(remat::matmul(x, b), 0.2);
  };
  struct Case {
    const char* name;
    std::function<Var<float>(const Var<float>&, const Var<float>&, const Var<float>&)> f;
    const char* op;
    std::size_t saved;
  };
  const Case cases[] = {
      // x, y in full (exp's replay source), the output.
      {"exp of relu", exp_of_relu, "relu", 3 * bytes<float>(N, D)},
      // x, the two products as sign, the output.
      {"leaky_relu", leaky, "matmul", 2 * bytes<float>(N, D) + 2 * sign_bytes},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    Tape<float> plain_tape;
    const Var<float> plain_loss = two_relus(plain_tape, w1, w2, xm, k.f);
    plain_tape.backward(plain_loss, true);
    plain_tape.backward(plain_loss);
    const auto [g1, g2] = take(w1, w2);
    Tape<float> tape;
    const auto policy = policies::save_compressed(Compression::sign(), policies::ops_named({k.op}));
    const Var<float> loss = two_relus(tape, w1, w2, xm, remat::checkpoint(k.f, policy));
    EXPECT_EQ(tape.memory().saved_bytes, k.saved) << remat_test::describe(tape.memory());
    tape.backward(loss, true);
    EXPECT_EQ(tape.memory().saved_bytes, k.saved) << "retain_graph keeps them packed";
    tape.backward(loss);
    const auto [h1, h2] = take(w1, w2);
    EXPECT_TRUE(h1 == g1);
    EXPECT_TRUE(h2 == g2);
  }
}

/// A lossy format keeps relu's derivative exact: relu's backward reads the exact one-bit mask stored beside the int8
/// codes (with_sign_mask), so small positive values, which int8 rounds to 0, keep their derivative 1. out =
/// relu(x·W1)·W2, loss = sum(out ⊙ C) with C constant: dL/dh = C·W2ᵀ is exact, so dW1 = xᵀ·(dL/dh ⊙ [x·W1 > 0]) equals
/// plain's bitwise, while dW2 = hᵀ·C reads h in int8. W1's first column is scaled by 10⁻⁴: its products are far below
/// their row's absmax/254 and all round to 0 in int8. Bytes: h takes 2048 + 32·4 B of codes and scales, and 256 B of
/// mask.
TEST(Compression, LossyValuesKeepAnExactMaskForRelu) {
  Matrix<float> w1m = remat_test::random_matrix<float>(D, D, 13);
  w1m.col(0) *= 1e-4f;
  Parameter<float> w1(w1m), w2(remat_test::random_matrix<float>(D, D, 14));
  const Matrix<float> xm = remat_test::random_matrix<float>(N, D, 15), cm = remat_test::random_matrix<float>(N, D, 16);
  auto f = [](const Var<float>& x, const Var<float>& a, const Var<float>& b) {
    return remat::matmul(remat::relu(remat::matmul(x, a)), b);
  };
  auto run = [&](const auto& region, std::size_t* saved) {
    Tape<float> tape;
    const Var<float> out = region(tape.constant(xm), tape.variable(w1), tape.variable(w2));
    const Var<float> loss = remat::sum(remat::multiply(out, tape.constant(cm)));
    if (saved) *saved = tape.memory().saved_bytes;
    tape.backward(loss);
    std::vector<Matrix<float>> g{w1.grad(), w2.grad()};
    w1.zero_grad();
    w2.zero_grad();
    return g;
  };
  const std::vector<Matrix<float>> want = run(f, nullptr);
  std::size_t saved = 0;
  const std::vector<Matrix<float>> got =
      run(remat::checkpoint(f, policies::save_compressed(Compression::int8_per_row(), policies::everything_saveable)),
          &saved);
  EXPECT_TRUE(got[0] == want[0]) << "dW1 reads relu's mask and x, both exact";
  EXPECT_FALSE(got[1] == want[1]) << "dW2 reads h in int8";
  // x, h (codes, scales, mask); out is returned, and multiply reads C, not out; C.
  EXPECT_EQ(saved, 2 * bytes<float>(N, D) + 2048 + 32 * 4 + sign_bytes);
}

/// A relu before max_pool2d: max pooling reads its argmax (kept in one byte an output), not its input, so the relu's
/// output has one reader, relu's own backward, which reads its sign (with max_pool2d saved, so that no replay reads
/// it). Stored as sign it takes 1 bit an element, and stored as int8 (with the exact mask relu reads) it changes no
/// gradient bit either: nothing reads the lossy values. [4,8,8,8] floats: 8192 B as it is; sign 2048/64 · 8 = 256 B;
/// int8 per row (rows of 8) 2048 + 256·4 B + the mask.
TEST(Compression, AReluBeforeMaxPoolingIsReadOnlyThroughItsSign) {
  const remat::Shape xs{4, 8, 8, 8};
  const Matrix<float> xm = remat_test::random_matrix<float>(4 * 8 * 8, 8, 81);
  Parameter<float> w(remat_test::random_matrix<float>(8, 8, 82));
  auto block = [](const Var<float>& x, const Var<float>& w) {
    return remat::max_pool2d(remat::relu(remat::reshape(remat::matmul(x, w), {4, 8, 8, 8})),
                             remat::MaxPool2dOptions(2));
  };
  auto step = [&](Tape<float>& tape, const std::function<policies::Decision(const remat::OpInfo&)>* policy) {
    const Var<float> x = tape.constant(xm), wv = tape.variable(w);
    const Var<float> y = policy ? remat::checkpoint(block, *policy)(x, wv) : block(x, wv);
    return remat::sum(remat::square(y));
  };
  Matrix<float> want;
  {
    Tape<float> tape;
    tape.backward(step(tape, nullptr));
    want = w.grad();
    w.zero_grad();
  }
  const std::size_t pool_output = 4 * 8 * 4 * 4 * sizeof(float), argmax = 4 * 8 * 4 * 4, x_bytes = xm.size() * 4;
  struct Case {
    Compression c;
    std::size_t relu;  // the relu output's stored bytes
  };
  for (const Case& k : {Case{Compression::sign(), 256}, Case{Compression::int8_per_row(), 2048 + 256 * 4 + 256}}) {
    SCOPED_TRACE(k.c.name());
    // The relu's output stored compressed; max_pool2d's output, and with it its argmax, saved: a replay of
    // max_pool2d would read the relu's output decoded (as every replay reads a compressed source).
    const std::function<policies::Decision(const remat::OpInfo&)> policy = [&](const remat::OpInfo& op) {
      if (op.name == std::string_view("relu")) return policies::Decision::save_as(k.c);
      return policies::Decision(op.name == std::string_view("max_pool2d"));
    };
    Tape<float> tape;
    const Var<float> loss = step(tape, &policy);
    // x (matmul's backward reads it), the relu output packed, the argmax, the pooled output (square reads it).
    EXPECT_EQ(tape.memory().saved_bytes, x_bytes + k.relu + argmax + pool_output)
        << remat_test::describe(tape.memory());
    tape.backward(loss);
    EXPECT_TRUE(w.grad() == want);
    w.zero_grad();
  }
}

/// int8 groups on a convolution's [N, C, H, W] activations, through a checkpoint: t = x + a stored in int8, read by
/// square's backward, so a's gradient is 2·t read back, exactly. On [2,3,7,7] (below the parallel grain) and
/// [8,16,14,14] (packed and unpacked in blocks on the thread team), with slices of alternating magnitudes (50 and
/// 0.02) so that groups of 64 or 8 crossing them read back otherwise than one scale per slice: the gradient equals
/// 2 × remat_test::ReferenceInt8's values read back (groups of 64 or 8 consecutive elements, or of W for per row)
/// bit for bit, and the saved bytes grow from the exact run's by the stored bytes by hand less t's 4·n.
TEST(Compression, Int8GroupsOfConsecutiveElementsThroughACheckpoint) {
  using remat::Shape;
  auto f = [](const Var<float>& x, const Var<float>& a) { return remat::square(remat::add(x, a)); };
  for (const Shape& shape : {Shape{2, 3, 7, 7}, Shape{8, 16, 14, 14}}) {
    const auto n = static_cast<std::size_t>(shape.numel()), w = static_cast<std::size_t>(shape.cols());
    std::vector<float> xs(n), as(n), t(n);
    remat_test::Random rng(91);
    for (std::size_t i = 0; i < n; ++i) {
      xs[i] = static_cast<float>(rng.uniform(-1, 1)) * ((i / w) % 2 == 0 ? 50.0f : 0.02f);
      as[i] = static_cast<float>(rng.uniform(-0.01, 0.01));
      t[i] = xs[i] + as[i];
    }
    auto run = [&](const Compression* c, std::size_t* saved, Matrix<float>* grad) {
      Tape<float> tape;
      const Var<float> x = tape.constant(shape, xs.data()), a = tape.variable(shape, as.data());
      const Var<float> y =
          c ? remat::checkpoint(f, policies::save_compressed(*c, policies::everything_saveable))(x, a) : f(x, a);
      const Var<float> loss = remat::sum(y);
      *saved = tape.memory().saved_bytes;
      tape.backward(loss);
      *grad = a.grad();
    };
    std::size_t exact_saved = 0;
    Matrix<float> exact_grad;
    run(nullptr, &exact_saved, &exact_grad);
    struct Case {
      Compression c;
      std::size_t length;  // elements a scale
    };
    for (const Case& k : {Case{Compression::int8_per_group(64), 64}, Case{Compression::int8_per_group(8), 8},
                          Case{Compression::int8_per_row(), w}}) {
      SCOPED_TRACE(k.c.name() + " on " + std::to_string(n) + " elements");
      std::size_t saved = 0;
      Matrix<float> grad;
      run(&k.c, &saved, &grad);
      const std::size_t stored = (n + 3) / 4 * 4 + 4 * ((n + k.length - 1) / k.length);
      EXPECT_EQ(saved, exact_saved - 4 * n + stored);
      const remat_test::ReferenceInt8 want(t, k.length);
      ASSERT_EQ(static_cast<std::size_t>(grad.size()), n);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) wrong += grad.data()[i] != 2 * want.decoded[i];
      EXPECT_EQ(wrong, 0u);
      const remat::MemoryEstimate e = remat::estimate_memory<float>([&](Tape<float>& tape) {
        const Var<float> x = tape.constant(shape, xs.data()), a = tape.variable(shape, as.data());
        return remat::sum(remat::checkpoint(f, policies::save_compressed(k.c, policies::everything_saveable))(x, a));
      });
      EXPECT_EQ(e.saved_bytes, saved);
    }
  }
}

/// A bad group is refused with the value and the fix.
TEST(Compression, Int8GroupsArePowersOfTwo) {
  remat_test::expect_error_naming<std::invalid_argument>([] { Compression::int8_per_group(48); },
                                                         {"int8_per_group", "48", "power of two"});
  EXPECT_EQ(Compression::int8_per_group(128).name(), "int8/128");
  // 1200 codes and ⌈1200/128⌉ = 10 scales: the groups run across the slices of 200 (one scale per slice and per
  // 128 within it would be 12).
  EXPECT_EQ(Compression::int8_per_group(128).stored_bytes(remat::Shape{2, 3, 200}, 4), 1200u + 4 * 10);
  EXPECT_EQ(Compression::int8_per_group(128).groups(remat::Shape{2, 3, 200}), 10u);
  EXPECT_EQ(Compression::int8_per_row().groups(remat::Shape{2, 3, 200}), 6u);
}

}  // namespace compression_test
