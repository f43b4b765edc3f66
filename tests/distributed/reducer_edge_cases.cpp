// Edge cases and misuse of remat's data-parallel layer (include/remat/distributed/): part of tests_distributed
// (tests/distributed/distributed.cmake: run under mpiexec with 2 and 3 ranks; its main() is distributed_main.cpp's).
// ReducerMisuse: calls the reducer must refuse or honour on every rank, each a regression test: set_local_weight
// between backward and finish() (was silently ignored), a parameter resized before finish() (overflowed the
// heap), a parameter repeated, a bucket_bytes unlike another rank's, 0, or a null parameter on one rank only (left
// the other ranks waiting), a broadcast from a gradient-ready callback of a Parameter the sweep still reads (hung),
// non-finite weights (unnamed in the message), float weights outside float's range (turned gradients into inf or 0).
// ReducerEdgeCases: uneven and zero weights, parameters the backward never writes, finish() without a backward,
// no_sync on two tapes, parameters destroyed before finish(), mismatched lists and a bad root.
//
// Oracle: loss_r = sum(W ⊙ C_r) with a per-rank constant C_r, so d loss_r / dW = C_r exactly, and the reduced
// gradient must be Σ_r w_r C_r, computed here in double from the closed form (every rank knows every C_r).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "remat/distributed/distributed.hpp"
#include "remat/remat.hpp"

namespace reducer_edge_cases {

using remat::Index;
using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
namespace dist = remat::distributed;

/// C_r for parameter `k`: small integers, distinct per rank, element and parameter.
template <class T>
Matrix<T> coefficient(int r, int k, Index rows, Index cols) {
  Matrix<T> c(rows, cols);
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) c(i, j) = static_cast<T>(1 + r * 7 + k * 3 + i * 2 + j);
  return c;
}

/// Σ_r w[r] C_r(k) in double.
Matrix<double> oracle(const std::vector<double>& w, int k, Index rows, Index cols) {
  Matrix<double> s = Matrix<double>::Zero(rows, cols);
  for (int r = 0; r < static_cast<int>(w.size()); ++r)
    s += w[static_cast<std::size_t>(r)] * coefficient<double>(r, k, rows, cols);
  return s;
}

template <class T>
Var<T> loss_of(Tape<T>& tape, std::vector<Parameter<T>*>& ps, int r) {
  Var<T> loss;
  for (std::size_t k = 0; k < ps.size(); ++k) {
    Var<T> term = remat::sum(tape.variable(*ps[k]) *
                             tape.constant(coefficient<T>(r, static_cast<int>(k), ps[k]->rows(), ps[k]->cols())));
    loss = k == 0 ? term : loss + term;
  }
  return loss;
}

template <class T>
double max_rel_error(const Matrix<T>& got, const Matrix<double>& want) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) return std::numeric_limits<double>::infinity();
  return (got.template cast<double>() - want).cwiseAbs().maxCoeff() / std::max(1e-300, want.cwiseAbs().maxCoeff());
}

bool all_ranks(bool mine) {
  int m = mine ? 1 : 0, all = 0;
  MPI_Allreduce(&m, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}

// ---------------------------------------------------------------------------------------------------------
// ReducerMisuse (regression tests)
// ---------------------------------------------------------------------------------------------------------

// set_local_weight between the backward (which already packed every reported gradient × the old weight) and
// finish(): the new weight is silently ignored for every parameter reported during backward.
TEST(ReducerMisuse, LocalWeightSetAfterBackwardBeforeFinishIsHonouredOrRefused) {
  const int r = dist::rank(), n = dist::size();
  Parameter<double> A(Matrix<double>::Zero(2, 3)), B(Matrix<double>::Zero(4, 1));
  std::vector<Parameter<double>*> ps{&A, &B};
  dist::GradientReducer<double> reducer(ps);
  Tape<double> tape;
  reducer.attach(tape);
  tape.backward(loss_of(tape, ps, r));
  std::vector<double> w;
  for (int q = 0; q < n; ++q) w.push_back(0.1 * (q + 1));
  bool refused = false;
  try {
    reducer.set_local_weight(w[static_cast<std::size_t>(r)]);
  } catch (const std::logic_error&) {
    refused = true;  // a typed refusal (tape_error is a logic_error) is an acceptable fix
  }
  reducer.finish();
  if (!all_ranks(refused)) {
    EXPECT_LE(max_rel_error<double>(A.grad(), oracle(w, 0, 2, 3)), 1e-14) << "got\n"
                                                                          << A.grad() << "\nwant\n"
                                                                          << oracle(w, 0, 2, 3);
    EXPECT_LE(max_rel_error<double>(B.grad(), oracle(w, 1, 4, 1)), 1e-14);
  }
}

// A parameter resized after the backward packed its gradient and before finish(): finish() writes the
// reduced gradient of the old size into a gradient buffer of the new size (reserve_grad()). Larger: a
// gradient of the new shape, part of it uninitialised, marked defined; smaller: heap-buffer-overflow (ASan;
// see ...ResizedSmaller...). Documented: finish() throws shape_error for a parameter resized since construction.
TEST(ReducerMisuse, ParameterResizedLargerBetweenBackwardAndFinishThrowsShapeError) {
  const int r = dist::rank();
  Parameter<float> A(Matrix<float>::Zero(2, 3));
  std::vector<Parameter<float>*> ps{&A};
  dist::GradientReducer<float> reducer(ps);
  Tape<float> tape;
  reducer.attach(tape);
  tape.backward(loss_of(tape, ps, r));
  A.mutable_value() = Matrix<float>::Zero(4, 4);  // every rank alike
  remat_test::expect_error_naming<remat::shape_error>([&] { reducer.finish(); }, {"GradientReducer", "[4,4]", "[2,3]"});
}

TEST(ReducerMisuse, ParameterResizedSmallerBetweenBackwardAndFinishThrowsShapeError) {
  const int r = dist::rank();
  Parameter<float> A(Matrix<float>::Zero(8, 8));
  std::vector<Parameter<float>*> ps{&A};
  dist::GradientReducer<float> reducer(ps);
  Tape<float> tape;
  reducer.attach(tape);
  tape.backward(loss_of(tape, ps, r));
  A.mutable_value() = Matrix<float>::Zero(1, 1);  // every rank alike
  remat_test::expect_error_naming<remat::shape_error>([&] { reducer.finish(); }, {"GradientReducer", "[1,1]", "[8,8]"});
}

// A repeated parameter on one rank only: only that rank throws (the check runs after the collective), the
// others get a reducer whose next finish() waits forever for the rank that has none.
TEST(ReducerMisuse, RepeatedParameterOnOneRankThrowsOnEveryRank) {
  const int r = dist::rank();
  Parameter<float> A(Matrix<float>::Ones(2, 2)), B(Matrix<float>::Ones(2, 2));
  std::vector<Parameter<float>*> ps{&A, r == 1 ? &A : &B};
  bool threw = false;
  try {
    dist::GradientReducer<float> reducer(ps);
  } catch (const remat::domain_error&) {
    threw = true;
  } catch (const remat::shape_error&) {
    threw = true;
  }
  EXPECT_TRUE(threw) << "rank " << r << " built a reducer although rank 1's list repeats a parameter";
  MPI_Barrier(MPI_COMM_WORLD);
}

// bucket_bytes decides which all-reduces a rank posts: ranks that bucketed differently exchanged mismatched
// messages (rank 0 finished with wrong gradients, rank 1 died of MPI_ERR_TRUNCATE), and a 0 on one rank threw
// there alone and left the others waiting in the constructor's MPI_Allgather.
TEST(ReducerMisuse, BucketBytesThatDifferBetweenRanksOrAreZeroThrowOnEveryRank) {
  const int r = dist::rank();
  Parameter<double> A(Matrix<double>::Zero(2, 3)), B(Matrix<double>::Zero(4, 1)), C(Matrix<double>::Zero(1, 5));
  std::vector<Parameter<double>*> ps{&A, &B, &C};
  for (const std::size_t odd : {std::size_t{8}, std::size_t{0}}) {
    std::string message;
    try {
      dist::GradientReducer<double> reducer(ps, MPI_COMM_WORLD,
                                            r == 1 ? odd : dist::GradientReducer<double>::default_bucket_bytes);
    } catch (const remat::domain_error& e) {
      message = e.what();
    }
    const bool named = message.find("bucket_bytes") != std::string::npos &&
                       message.find(odd == 0 ? "0 on rank 1" : "but 8 on rank 1") != std::string::npos;
    EXPECT_TRUE(all_ranks(named)) << "rank " << r << ", rank 1's bucket_bytes " << odd << ": \"" << message << "\"";
  }
  dist::GradientReducer<double> alike(ps, MPI_COMM_WORLD, 8);  // the same small buckets everywhere: built
}

// A null pointer in one rank's list threw on that rank only, before the collective checks: the others waited.
TEST(ReducerMisuse, NullParameterOnOneRankThrowsOnEveryRank) {
  const int r = dist::rank();
  Parameter<float> A(Matrix<float>::Ones(2, 2)), B(Matrix<float>::Ones(2, 2));
  std::vector<Parameter<float>*> ps{&A, r == 1 ? nullptr : &B};
  std::string reducer_message, broadcast_message;
  try {
    dist::GradientReducer<float> reducer(ps);
  } catch (const remat::domain_error& e) {
    reducer_message = e.what();
  }
  try {
    dist::broadcast_parameters(ps);
  } catch (const remat::domain_error& e) {
    broadcast_message = e.what();
  }
  EXPECT_TRUE(
      all_ranks(reducer_message.find("GradientReducer: parameter 1 is a null pointer on rank 1") != std::string::npos))
      << "rank " << r << ": \"" << reducer_message << "\"";
  EXPECT_TRUE(all_ranks(broadcast_message.find("broadcast_parameters: parameter 1 is a null pointer on rank 1") !=
                        std::string::npos))
      << "rank " << r << ": \"" << broadcast_message << "\"";
}

// broadcast_parameters called from a gradient-ready callback on a Parameter the sweep still reads (b, recorded
// before a, read by b ⊙ d's backward after a's callback): the non-root ranks' mutable_value() threw before their
// MPI_Bcast while the root, which only reads, entered it, and the job hung (first seen with 300×300
// parameters). Now every rank throws tape_error before any broadcast, b is unchanged everywhere, and
// the gradients are the recorded values' (d loss / d b = a ⊙ d, from the closed form).
TEST(ReducerMisuse, BroadcastOfAParameterTheSweepStillReadsThrowsOnEveryRank) {
  const int r = dist::rank();
  const Matrix<double> b0 = coefficient<double>(r, 0, 3, 3), d0 = coefficient<double>(r, 1, 3, 3),
                       a0 = coefficient<double>(r, 2, 3, 3);
  Parameter<double> b(b0), d(d0), a(a0);
  Tape<double> tape;
  Var<double> vb = tape.variable(b), vd = tape.variable(d);
  Var<double> loss = remat::sum((vb * vd) * tape.variable(a));
  tape.on_gradient_ready([&](Parameter<double>& p) {
    if (&p.value() == &a.value()) dist::broadcast_parameters(std::vector<Parameter<double>*>{&b}, 0);
  });
  std::string message;
  try {
    tape.backward(loss);
  } catch (const remat::tape_error& e) {
    message = e.what();
  }
  EXPECT_TRUE(all_ranks(message.find("broadcast_parameters: parameter 0 on rank 1") != std::string::npos))
      << "rank " << r << ": \"" << message << "\"";
  EXPECT_TRUE(all_ranks(b.value() == b0)) << "rank " << r;
  EXPECT_TRUE(all_ranks(Matrix<double>(b.grad()) == Matrix<double>(a0.cwiseProduct(d0)))) << "rank " << r;
  EXPECT_TRUE(all_ranks(Matrix<double>(a.grad()) == Matrix<double>(b0.cwiseProduct(d0)))) << "rank " << r;
  dist::broadcast_parameters(std::vector<Parameter<double>*>{&b}, 0);  // after backward: nothing holds b
  EXPECT_TRUE(all_ranks(b.value() == coefficient<double>(0, 0, 3, 3))) << "rank " << r;
}

// The error standard: the message names the op and the offending value.
TEST(ReducerMisuse, NonFiniteLocalWeightMessageNamesTheValue) {
  Parameter<float> A(Matrix<float>::Ones(2, 2));
  dist::GradientReducer<float> reducer({&A});
  const double weight = reducer.local_weight();
  remat_test::expect_error_naming<remat::domain_error>(
      [&] { reducer.set_local_weight(std::numeric_limits<double>::quiet_NaN()); }, {"set_local_weight", "nan"});
  remat_test::expect_error_naming<remat::domain_error>(
      [&] { reducer.set_local_weight(-std::numeric_limits<double>::infinity()); }, {"set_local_weight", "inf"});
  EXPECT_EQ(reducer.local_weight(), weight);
}

// pack() casts the double weight to T before multiplying: a weight finite as a double but not as a float
// (1e39) makes every gradient ±inf, and one below float's range (1e-46) makes it 0, although the weighted
// gradients (1e29, 1e-36) are ordinary floats.
TEST(ReducerMisuse, FloatReducerWeightOutsideFloatRangeGivesRepresentableWeightedGradient) {
  const int r = dist::rank(), n = dist::size();
  // The proper form: weight set before the backward.
  for (const auto& [weight, scale] : {std::pair<double, double>{1e39, 1e-10}, std::pair<double, double>{1e-46, 1e10}}) {
    SCOPED_TRACE("weight " + std::to_string(weight));
    Parameter<float> A(Matrix<float>::Zero(1, 3));
    dist::GradientReducer<float> reducer({&A});
    bool refused = false;
    try {
      reducer.set_local_weight(weight);
    } catch (const remat::domain_error&) {
      refused = true;  // refusing a weight T cannot represent would also be a fix
    }
    Tape<float> tape;
    reducer.attach(tape);
    const Matrix<float> c = Matrix<float>::Constant(1, 3, static_cast<float>(scale));
    tape.backward(remat::sum(tape.variable(A) * tape.constant(c)));
    reducer.finish();
    if (all_ranks(refused)) continue;
    const double want = n * weight * static_cast<double>(static_cast<float>(scale));
    ASSERT_TRUE(A.has_grad());
    for (Index j = 0; j < 3; ++j)
      EXPECT_NEAR(static_cast<double>(A.grad()(0, j)) / want, 1.0, 1e-5)
          << "rank " << r << " got " << A.grad()(0, j) << " want " << want;
  }
}

// ---------------------------------------------------------------------------------------------------------
// ReducerEdgeCases
// ---------------------------------------------------------------------------------------------------------

/// Uneven weights, double, a parameter larger than the bucket, default/1-byte/huge buckets: Σ w_r C_r.
TEST(ReducerEdgeCases, UnevenWeightsEveryBucketSizeDouble) {
  const int r = dist::rank(), n = dist::size();
  std::vector<double> w;
  for (int q = 0; q < n; ++q) w.push_back(q == 0 ? -0.5 : 0.3 * q + 0.01);
  for (std::size_t bucket : {std::size_t{1}, std::size_t{40}, dist::GradientReducer<double>::default_bucket_bytes,
                             std::numeric_limits<std::size_t>::max()}) {
    SCOPED_TRACE("bucket " + std::to_string(bucket));
    Parameter<double> A(Matrix<double>::Zero(3, 3)), B(Matrix<double>::Zero(1, 2)), C(Matrix<double>::Zero(5, 2));
    std::vector<Parameter<double>*> ps{&A, &B, &C};
    dist::GradientReducer<double> reducer(ps, MPI_COMM_WORLD, bucket);
    if (bucket == 1) {
      EXPECT_EQ(reducer.bucket_count(), 3u);
    }
    if (bucket > 1000) {
      EXPECT_EQ(reducer.bucket_count(), 1u);
    }
    reducer.set_local_weight(w[static_cast<std::size_t>(r)]);
    Tape<double> tape;
    reducer.attach(tape);
    tape.backward(loss_of(tape, ps, r));
    EXPECT_EQ(reducer.started_buckets(), reducer.bucket_count());
    reducer.finish();
    for (std::size_t k = 0; k < ps.size(); ++k)
      EXPECT_LE(max_rel_error<double>(ps[k]->grad(), oracle(w, static_cast<int>(k), ps[k]->rows(), ps[k]->cols())),
                1e-14);
  }
}

/// Weight 0 on every rank: gradients defined and zero (flags are not weighted).
TEST(ReducerEdgeCases, ZeroWeightGivesDefinedZeroGradient) {
  const int r = dist::rank();
  Parameter<float> A(Matrix<float>::Zero(2, 2));
  std::vector<Parameter<float>*> ps{&A};
  dist::GradientReducer<float> reducer(ps);
  reducer.set_local_weight(0.0);
  Tape<float> tape;
  reducer.attach(tape);
  tape.backward(loss_of(tape, ps, r));
  reducer.finish();
  EXPECT_TRUE(A.has_grad());
  EXPECT_TRUE(A.grad().isZero(0));
}

/// A parameter recorded but reached by no gradient, with a gradient from before (not zeroed) on rank 0
/// only, and one with none anywhere: the first is reduced from its current gradient, the second keeps none.
TEST(ReducerEdgeCases, ParametersTheBackwardNeverWritesUseTheirCurrentGradient) {
  const int r = dist::rank(), n = dist::size();
  Parameter<double> used(Matrix<double>::Zero(2, 2)), stale(Matrix<double>::Zero(1, 3)),
      none(Matrix<double>::Zero(3, 1));
  if (r == 0) stale.mutable_grad() = Matrix<double>::Constant(1, 3, 6.0);
  std::vector<Parameter<double>*> ps{&stale, &used, &none};
  dist::GradientReducer<double> reducer(ps, MPI_COMM_WORLD, 8);
  Tape<double> tape;
  reducer.attach(tape);
  std::vector<Parameter<double>*> only{&used};
  Var<double> loss = loss_of(tape, only, r);
  tape.variable(stale);  // recorded, unused
  tape.variable(none);
  tape.backward(loss);
  EXPECT_EQ(reducer.reported_parameters(), 1u);
  reducer.finish();
  ASSERT_TRUE(stale.has_grad());
  EXPECT_TRUE(stale.grad().isApprox(Matrix<double>::Constant(1, 3, 6.0 / n)));
  EXPECT_FALSE(none.has_grad());
  std::vector<double> w(static_cast<std::size_t>(n), 1.0 / n);
  EXPECT_LE(max_rel_error<double>(used.grad(), oracle(w, 0, 2, 2)), 1e-14);
}

/// finish() with no backward at all reduces the gradients set by hand.
TEST(ReducerEdgeCases, FinishWithoutBackwardReducesHandSetGradients) {
  const int r = dist::rank(), n = dist::size();
  Parameter<double> A(Matrix<double>::Zero(2, 3));
  A.mutable_grad() = coefficient<double>(r, 0, 2, 3);
  dist::GradientReducer<double> reducer({&A});
  reducer.finish();
  std::vector<double> w(static_cast<std::size_t>(n), 1.0 / n);
  EXPECT_LE(max_rel_error<double>(A.grad(), oracle(w, 0, 2, 3)), 1e-14);
}

/// One parameter on two tapes: the first backward under nested no_sync guards, the second synchronised:
/// the reduced gradient is the average of both contributions; after the guards the reducer syncs again.
TEST(ReducerEdgeCases, TwoTapesWithNestedNoSyncAccumulate) {
  const int r = dist::rank(), n = dist::size();
  Parameter<double> A(Matrix<double>::Zero(2, 2));
  std::vector<Parameter<double>*> ps{&A};
  dist::GradientReducer<double> reducer(ps);
  Tape<double> t1, t2;
  reducer.attach(t1);
  reducer.attach(t2);
  {
    auto outer = reducer.no_sync();
    { auto inner = reducer.no_sync(); }
    t1.backward(loss_of(t1, ps, r));
    EXPECT_EQ(reducer.reported_parameters(), 0u);
  }
  t2.backward(loss_of(t2, ps, r) * 2.0);
  EXPECT_EQ(reducer.reported_parameters(), 1u);
  reducer.finish();
  std::vector<double> w(static_cast<std::size_t>(n), 3.0 / n);
  EXPECT_LE(max_rel_error<double>(A.grad(), oracle(w, 0, 2, 2)), 1e-14);
}

/// The Parameter objects destroyed between backward and finish (the reducer shares their storage): no
/// use-after-free (ASan), and a second step works.
TEST(ReducerEdgeCases, ParametersDestroyedBeforeFinish) {
  const int r = dist::rank();
  auto A = std::make_unique<Parameter<float>>(Matrix<float>::Zero(3, 2));
  std::vector<Parameter<float>*> ps{A.get()};
  dist::GradientReducer<float> reducer(ps);
  Tape<float> tape;
  reducer.attach(tape);
  tape.backward(loss_of(tape, ps, r));
  A.reset();
  reducer.finish();
  reducer.finish();
  EXPECT_EQ(reducer.steps(), 2u);
}

/// Different lists (count, shapes) throw shape_error on every rank for a double reducer too; root out of range.
TEST(ReducerEdgeCases, MismatchedListsAndBadRootThrowOnEveryRank) {
  const int r = dist::rank(), n = dist::size();
  Parameter<double> A(Matrix<double>::Ones(2, 2)), B(Matrix<double>::Ones(2, r == 1 ? 3 : 2));
  std::vector<Parameter<double>*> ps{&A, &B};
  remat_test::expect_error_naming<remat::shape_error>([&] { dist::GradientReducer<double> g(ps); },
                                                      {"GradientReducer", "parameter 1", "[2,2] on rank 0"});
  remat_test::expect_error_naming<remat::domain_error>([&] { dist::broadcast_parameters(ps, n); },
                                                       {"broadcast_parameters", "root " + std::to_string(n)});
  remat_test::expect_error_naming<remat::domain_error>([&] { dist::broadcast_parameters(ps, -1); },
                                                       {"broadcast_parameters", "root -1"});
}

}  // namespace reducer_edge_cases