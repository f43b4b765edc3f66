// Data-parallel training on MPI (remat/distributed): run under mpiexec with 2 and 3 ranks
// (tests/distributed/distributed.cmake). Every rank runs the same tests in the same order; the gradients
// after a step must equal the single-process gradients of the same global batch (computed on every rank)
// to 1e-6 relative, and the parameters must stay bitwise identical across ranks.
//
// With --fail-on-rank R or --mismatch-on-rank R the program is instead a small training run in which rank R
// throws in its second step, or builds a model with one parameter more: every rank must then exit non-zero
// with R's message instead of hanging (tests/distributed/expect_failure.py checks it).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "random.hpp"
#include "remat/distributed/distributed.hpp"
#include "remat/nn/adam.hpp"
#include "remat/remat.hpp"

namespace {

using remat::Matrix;
using remat::Parameter;
using remat::Tape;
using remat::Var;
namespace dist = remat::distributed;
using Policy = std::function<bool(const remat::OpInfo&)>;

constexpr remat::Index global_batch = 10;  // 5+5 rows on 2 ranks, 3+3+4 on 3: unequal shards

/// Weights of an initialisation's scale, U(−0.5, 0.5).
Matrix<float> weights(remat::Index rows, remat::Index cols, std::uint64_t seed) {
  return remat_test::random_matrix<float>(rows, cols, seed, remat_test::Domain{-0.5, 0.5, 0});
}

/// x [B,6] → tanh(linear(·, W1, b1)) → outer region{ inner region{ gelu(linear(·, W2, b2)) } → tanh(·W2) } →
/// linear(·, W3, b3) → cross_entropy. W2 is shared (two ops read it, through two leaves).
struct Model {
  Parameter<float> W1{weights(6, 8, 11)}, b1{weights(1, 8, 12)}, W2{weights(8, 8, 13)}, b2{weights(1, 8, 14)},
      W3{weights(8, 4, 15)}, b3{weights(1, 4, 16)};
  std::vector<Parameter<float>*> parameters() { return {&W1, &b1, &W2, &b2, &W3, &b3}; }

  /// Mean cross-entropy over rows [first, first + rows) of the data, times `scale`; `policy` null: no regions.
  Var<float> loss(Tape<float>& tape, const Matrix<float>& x, const std::vector<int>& labels, remat::Index first,
                  remat::Index rows, const Policy* policy, float scale = 1) {
    Var<float> w1 = tape.variable(W1), c1 = tape.variable(b1), w2 = tape.variable(W2), c2 = tape.variable(b2);
    Var<float> w3 = tape.variable(W3), c3 = tape.variable(b3);
    Var<float> h = remat::tanh(remat::linear(tape.constant(x.middleRows(first, rows)), w1, c1));
    auto inner = [&](Var<float> v) { return remat::gelu(remat::linear(v, w2, c2)); };
    auto outer = [&](Var<float> v) {
      Var<float> g = policy ? remat::checkpoint(inner, *policy)(v) : inner(v);
      return remat::tanh(remat::matmul(g, tape.variable(W2)));
    };
    Var<float> top = policy ? remat::checkpoint(outer, *policy)(h) : outer(h);
    const std::vector<int> shard(labels.begin() + first, labels.begin() + first + rows);
    return remat::cross_entropy(remat::linear(top, w3, c3), shard) * scale;
  }
};

Matrix<float> data_x() {
  return remat_test::random_matrix<float>(global_batch, 6, 21);
}
std::vector<int> data_labels() {
  std::vector<int> l;
  for (remat::Index i = 0; i < global_batch; ++i) l.push_back(static_cast<int>((3 * i + 1) % 4));
  return l;
}

/// This rank's contiguous shard of the global batch: [first, first + rows).
struct Shard {
  remat::Index first, rows;
};
Shard shard(int rank, int ranks, remat::Index batch) {
  const remat::Index first = batch * rank / ranks, end = batch * (rank + 1) / ranks;
  return {first, end - first};
}

/// The single-process gradients of the global batch.
std::vector<Matrix<float>> single_process_gradients(const Policy* policy) {
  Model m;
  Tape<float> tape;
  tape.backward(m.loss(tape, data_x(), data_labels(), 0, global_batch, policy));
  std::vector<Matrix<float>> g;
  for (Parameter<float>* p : m.parameters()) g.push_back(p->grad());
  return g;
}

/// Relative error ‖a − b‖ / ‖b‖ ≤ 1e-6 (Frobenius norms) for every gradient: the float sums run in another
/// order (per shard, then across ranks), so bitwise equality is not expected.
void expect_close(const std::vector<Matrix<float>>& got, const std::vector<Matrix<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    SCOPED_TRACE("parameter " + std::to_string(k));
    const double norm = want[k].cast<double>().norm();
    ASSERT_GT(norm, 0.0);
    EXPECT_LE((got[k].cast<double>() - want[k].cast<double>()).norm() / norm, 1e-6);
  }
}

/// True on every rank iff every rank's `bytes` equal rank 0's, bit for bit.
bool same_on_every_rank(const void* bytes, std::size_t n) {
  std::vector<char> root(static_cast<const char*>(bytes), static_cast<const char*>(bytes) + n);
  MPI_Bcast(root.data(), static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), bytes, n) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return all != 0;
}
bool same_on_every_rank(const Matrix<float>& m) {
  return same_on_every_rank(m.data(), static_cast<std::size_t>(m.size()) * sizeof(float));
}

std::vector<std::pair<std::string, Policy>> modes() {
  using namespace remat::policies;
  return {{"no checkpoint", nullptr},
          {"nothing_saveable", nothing_saveable},
          {"dots_saveable", dots_saveable},
          {"everything_saveable", everything_saveable}};
}

/// One data-parallel step on this rank's shard, in `micro` micro-batches (all but the last under no_sync),
/// checked for exactly-once reporting and overlap, then finish(); returns the reduced gradients.
std::vector<Matrix<float>> distributed_gradients(Model& m, const Policy* policy, std::size_t bucket_bytes, int micro) {
  const int r = dist::rank(), n = dist::size();
  const Matrix<float> x = data_x();
  const std::vector<int> labels = data_labels();
  dist::GradientReducer<float> reducer(m.parameters(), MPI_COMM_WORLD, bucket_bytes);
  const Shard s = shard(r, n, global_batch);
  reducer.set_local_weight(static_cast<double>(s.rows) / global_batch);  // unequal shards: exact global mean
  Tape<float> tape;
  reducer.attach(tape);
  for (int i = 0; i < micro; ++i) {
    const Shard part = shard(i, micro, s.rows);
    const float scale = static_cast<float>(part.rows) / static_cast<float>(s.rows);  // the shard's mean
    tape.clear();
    Var<float> loss = m.loss(tape, x, labels, s.first + part.first, part.rows, policy, scale);
    if (i + 1 < micro) {
      auto no_sync = reducer.no_sync();
      tape.backward(loss);
      EXPECT_EQ(reducer.reported_parameters(), 0u);
      EXPECT_EQ(reducer.started_buckets(), 0u);
    } else {
      tape.backward(loss);
    }
  }
  // Every parameter reported exactly once, and every bucket's all-reduce started during backward.
  EXPECT_EQ(reducer.reported_parameters(), m.parameters().size());
  EXPECT_EQ(reducer.started_buckets(), reducer.bucket_count());
  reducer.finish();
  std::vector<Matrix<float>> g;
  for (Parameter<float>* p : m.parameters()) g.push_back(p->grad());
  return g;
}

TEST(Distributed, GradientsEqualSingleProcessOnesForEveryCheckpointModeBucketSizeAndMicroBatching) {
  for (const auto& [label, policy] : modes()) {
    const Policy* p = policy ? &policy : nullptr;
    const std::vector<Matrix<float>> want = single_process_gradients(p);
    for (std::size_t bucket_bytes : {dist::GradientReducer<float>::default_bucket_bytes, std::size_t{200}}) {
      for (int micro : {1, 2}) {
        SCOPED_TRACE(label + ", buckets of " + std::to_string(bucket_bytes) + " B, " + std::to_string(micro) +
                     " micro-batches");
        Model m;
        const std::vector<Matrix<float>> got = distributed_gradients(m, p, bucket_bytes, micro);
        expect_close(got, want);
        for (const Matrix<float>& g : got) EXPECT_TRUE(same_on_every_rank(g));
      }
    }
  }
}

/// A model with N-D Parameters: x [B,12] (2×2 patches of 3 channels) → h = tanh(x · reshape(Wc, [4,12])ᵀ) with
/// Wc [4,3,2,2] a convolution's weight; → linear(h, W [4,6]) read as [B,2,3], permuted to [2,B,3], times P [2,3,5]
/// (a batched matmul over 2) → summed over dim 0 → [B,5] + b [5] → cross_entropy. Parameters of rank 4, 2, 3 and 1.
/// `policy` non-null: the part after h is a checkpoint region.
struct NdModel {
  Parameter<float> Wc{nd_weights<4>({4, 3, 2, 2}, 31)}, W{weights(4, 6, 32)}, P{nd_weights<3>({2, 3, 5}, 33)},
      b{nd_weights<1>({5}, 34)};
  std::vector<Parameter<float>*> parameters() { return {&Wc, &W, &P, &b}; }

  template <int Rank>
  static remat::Tensor<float, Rank> nd_weights(const std::array<Eigen::Index, Rank>& dims, std::uint64_t seed) {
    remat::Tensor<float, Rank> t(dims);
    const Matrix<float> values = weights(1, t.size(), seed);
    std::copy(values.data(), values.data() + values.size(), t.data());
    return t;
  }

  Var<float> loss(Tape<float>& tape, const Matrix<float>& x, const std::vector<int>& labels, remat::Index first,
                  remat::Index rows, const Policy* policy, float scale = 1) {
    const Var<float> wc = tape.variable(Wc), w = tape.variable(W), p = tape.variable(P), c = tape.variable(b);
    const Var<float> h = remat::tanh(
        remat::matmul(tape.constant(x.middleRows(first, rows)), remat::transpose(remat::reshape(wc, {4, 12}))));
    auto head = [&](Var<float> v) {
      const Var<float> g = remat::permute(remat::reshape(remat::matmul(v, w), {rows, 2, 3}), {1, 0, 2});
      return remat::sum(remat::matmul(g, p), {0}) + c;
    };
    const Var<float> logits = policy ? remat::checkpoint(head, *policy)(h) : head(h);
    const std::vector<int> shard(labels.begin() + first, labels.begin() + first + rows);
    return remat::cross_entropy(logits, shard) * scale;
  }
};

/// The N-D model's gradients on this rank's shard, reduced (buckets of `bucket_bytes`), and on the whole batch in
/// one process.
std::vector<Matrix<float>> nd_gradients(const Policy* policy, std::size_t bucket_bytes, bool distributed) {
  const int r = dist::rank(), n = dist::size();
  const Matrix<float> x = remat_test::random_matrix<float>(global_batch, 12, 41);
  std::vector<int> labels;
  for (remat::Index i = 0; i < global_batch; ++i) labels.push_back(static_cast<int>((2 * i + 1) % 5));
  NdModel m;
  Tape<float> tape;
  if (!distributed) {
    tape.backward(m.loss(tape, x, labels, 0, global_batch, policy));
  } else {
    dist::GradientReducer<float> reducer(m.parameters(), MPI_COMM_WORLD, bucket_bytes);
    const Shard s = shard(r, n, global_batch);
    reducer.set_local_weight(static_cast<double>(s.rows) / global_batch);
    reducer.attach(tape);
    tape.backward(m.loss(tape, x, labels, s.first, s.rows, policy));
    EXPECT_EQ(reducer.reported_parameters(), 4u);
    reducer.finish();
  }
  std::vector<Matrix<float>> g;
  for (Parameter<float>* p : m.parameters()) g.push_back(p->grad());
  return g;
}

TEST(Distributed, NdParametersGradientsEqualSingleProcessOnes) {
  for (const auto& [label, policy] : modes()) {
    const Policy* p = policy ? &policy : nullptr;
    const std::vector<Matrix<float>> want = nd_gradients(p, 0, false);
    // One bucket; buckets of 100 B: b (20 B) and P (120 B) apart, W (96 B) alone, Wc (192 B) alone.
    for (std::size_t bucket_bytes : {dist::GradientReducer<float>::default_bucket_bytes, std::size_t{100}}) {
      SCOPED_TRACE(label + ", buckets of " + std::to_string(bucket_bytes) + " B");
      const std::vector<Matrix<float>> got = nd_gradients(p, bucket_bytes, true);
      expect_close(got, want);
      for (const Matrix<float>& g : got) EXPECT_TRUE(same_on_every_rank(g));
    }
  }
  // The parameters keep their N-D shapes through the reducer.
  NdModel m;
  dist::GradientReducer<float> reducer(m.parameters(), MPI_COMM_WORLD, 100);
  EXPECT_EQ(reducer.bucket_count(), 4u);
  EXPECT_EQ(remat::to_string(m.Wc.shape()), "[4,3,2,2]");
  EXPECT_EQ(remat::to_string(m.P.shape()), "[2,3,5]");
}

// Parameters whose N-D shapes differ but whose matrix views agree ([2,3,4] and [3,2,4] both read as [6,4]) are
// different models: the check compares every dim, and names them.
TEST(Distributed, MismatchedNdParameterShapesAreDetectedOnEveryRank) {
  const int r = dist::rank();
  Parameter<float> p{
      NdModel::nd_weights<3>(r == 1 ? std::array<Eigen::Index, 3>{3, 2, 4} : std::array<Eigen::Index, 3>{2, 3, 4}, 51)};
  Parameter<float> q{NdModel::nd_weights<1>({5}, 52)};
  std::vector<Parameter<float>*> list{&q, &p};
  remat_test::expect_error_naming<remat::shape_error>(
      [&] { dist::broadcast_parameters(list); },
      {"broadcast_parameters", "parameter 1", "[2,3,4] on rank 0", "[3,2,4] on rank 1"});
  remat_test::expect_error_naming<remat::shape_error>([&] { dist::GradientReducer<float> g(list); },
                                                      {"GradientReducer", "parameter 1", "[2,3,4] on rank 0"});
}

TEST(Distributed, BucketsFollowReverseParameterOrderAndTheirSize) {
  Model m;
  dist::GradientReducer<float> one(m.parameters());
  EXPECT_EQ(one.bucket_count(), 1u);
  // 200 B: b3 (16 B) + W3 (128 B) fit; b2 (32 B) would make 176 B, then W2 (256 B) alone, ...
  dist::GradientReducer<float> small(m.parameters(), MPI_COMM_WORLD, 200);
  EXPECT_EQ(small.bucket_of(5), 0u);
  EXPECT_EQ(small.bucket_of(4), 0u);
  EXPECT_EQ(small.bucket_of(3), 0u);
  EXPECT_EQ(small.bucket_of(2), 1u);
  EXPECT_GT(small.bucket_of(0), small.bucket_of(2));
  EXPECT_THROW(dist::GradientReducer<float>(m.parameters(), MPI_COMM_WORLD, 0), remat::domain_error);
  std::vector<Parameter<float>*> twice{&m.W1, &m.W1};
  remat_test::expect_error_naming<remat::domain_error>([&] { dist::GradientReducer<float> r(twice); },
                                                       {"GradientReducer", "parameters 0 and 1"});
}

TEST(Distributed, ParametersStayBitwiseIdenticalAcrossRanksOverAdamSteps) {
  const int r = dist::rank(), n = dist::size();
  Model m;
  // Different initial values on each rank: broadcast_parameters makes them rank 0's.
  m.W1.mutable_value() += Matrix<float>::Constant(6, 8, 0.01f * static_cast<float>(r));
  dist::broadcast_parameters(m.parameters(), 0);
  for (Parameter<float>* p : m.parameters()) EXPECT_TRUE(same_on_every_rank(p->value()));
  remat::nn::Adam<float> adam(m.parameters());
  dist::GradientReducer<float> reducer(m.parameters(), MPI_COMM_WORLD, 100);
  Tape<float> tape;
  reducer.attach(tape);
  const Policy policy = remat::policies::dots_saveable;
  for (int step = 0; step < 4; ++step) {
    const Matrix<float> x = remat_test::random_matrix<float>(global_batch, 6, 100 + static_cast<std::uint64_t>(step));
    const Shard s = shard(r, n, global_batch);
    reducer.set_local_weight(static_cast<double>(s.rows) / global_batch);
    tape.clear();
    adam.zero_grad();
    tape.backward(m.loss(tape, x, data_labels(), s.first, s.rows, &policy));
    reducer.finish();
    adam.step();
    for (Parameter<float>* p : m.parameters()) EXPECT_TRUE(same_on_every_rank(p->value())) << "step " << step;
  }
  EXPECT_EQ(reducer.steps(), 4u);
}

TEST(Distributed, AParameterUnusedOnSomeRanksIsReducedWithoutHanging) {
  const int r = dist::rank();
  Model m;
  Parameter<float> extra(Matrix<float>::Ones(1, 4));
  std::vector<Parameter<float>*> list = m.parameters();
  list.push_back(&extra);
  Parameter<float> never(Matrix<float>::Ones(2, 2));
  list.insert(list.begin(), &never);  // no rank uses it: it keeps no gradient
  dist::GradientReducer<float> reducer(list, MPI_COMM_WORLD, 64);
  Tape<float> tape;
  reducer.attach(tape);
  Var<float> loss = m.loss(tape, data_x(), data_labels(), 0, 4, nullptr);
  if (r == 0) loss = loss + remat::sum(tape.variable(extra));  // d/d extra = 1 on rank 0 only
  tape.backward(loss);
  reducer.finish();
  ASSERT_TRUE(extra.has_grad());
  EXPECT_TRUE(extra.grad().isApproxToConstant(static_cast<float>(reducer.local_weight())));
  EXPECT_FALSE(never.has_grad());
  EXPECT_TRUE(same_on_every_rank(m.W2.grad()));
}

TEST(Distributed, ASecondSynchronisedBackwardInOneStepIsRefused) {
  Model m;
  dist::GradientReducer<float> reducer(m.parameters());
  Tape<float> tape;
  reducer.attach(tape);
  Var<float> loss = m.loss(tape, data_x(), data_labels(), 0, 4, nullptr);
  tape.backward(loss, true);
  remat_test::expect_error_naming<remat::tape_error>([&] { tape.backward(loss); },
                                                     {"GradientReducer", "twice", "no_sync"});
  reducer.finish();  // every rank still finishes the step
}

TEST(Distributed, MismatchedParameterListsAreDetectedOnEveryRank) {
  const int r = dist::rank();
  Model m;
  std::vector<Parameter<float>*> list = m.parameters();
  Parameter<float> wider(Matrix<float>::Ones(1, 5));
  if (r == 1) list[1] = &wider;  // b1 is [1,8] elsewhere
  remat_test::expect_error_naming<remat::shape_error>(
      [&] { dist::broadcast_parameters(list); },
      {"broadcast_parameters", "parameter 1", "[1,8] on rank 0", "[1,5] on rank 1"});
  if (r == 1) list.pop_back();
  remat_test::expect_error_naming<remat::shape_error>([&] { dist::GradientReducer<float> g(list); },
                                                      {"GradientReducer", "rank 0 has 6 parameters", "rank 1 has"});
}

/// Two batch norms (momentum 0.1, and None: the cumulative average) trained on `rank`'s shards of three steps.
struct BatchNorms {
  remat::nn::BatchNorm2d<float> a{2}, b{3, 1e-5, std::nullopt};
  std::vector<remat::nn::BatchNorm2d<float>*> layers() { return {&a, &b}; }
  std::vector<Matrix<float>> statistics() const {
    return {a.running_mean.value(), a.running_var.value(), b.running_mean.value(), b.running_var.value()};
  }
  /// One training forward of `rank`'s shard of step `step`: [4, 2, 3] into a, [4, 3, 2] into b.
  void forward(int rank, int step) {
    Tape<float> tape;
    const auto seed = static_cast<std::uint64_t>(300 + 10 * step + rank);
    const Matrix<float> x = remat_test::random_matrix<float>(4, 6, seed),
                        y = remat_test::random_matrix<float>(4, 6, seed + 5);
    a.forward(tape, tape.constant(remat::Shape{4, 2, 3}, x.data()));
    b.forward(tape, tape.constant(remat::Shape{4, 3, 2}, y.data()));
  }
};

// A batch norm's buffers have no gradient: the reducer leaves each rank's running statistics to its own shards.
// broadcast_buffers before each forward makes them rank 0's, as DDP's broadcast_buffers=True does: rank 0's are
// then exactly those of a single process fed rank 0's shards, and every rank's equal them after a broadcast.
TEST(Distributed, BroadcastBuffersGivesEveryRankRankZerosBatchNormStatistics) {
  const int r = dist::rank();
  BatchNorms alone, without, with;
  for (int step = 0; step < 3; ++step) {
    alone.forward(0, step);
    without.forward(r, step);
    dist::broadcast_buffers(with.layers());
    with.forward(r, step);
  }
  EXPECT_FALSE(same_on_every_rank(without.statistics()[0]));  // drifted apart, each rank's own batches
  if (r == 0) {
    for (std::size_t k = 0; k < 4; ++k) EXPECT_TRUE(with.statistics()[k] == alone.statistics()[k]) << k;
  }
  dist::broadcast_buffers(with.layers());
  for (std::size_t k = 0; k < 4; ++k) {
    EXPECT_TRUE(same_on_every_rank(with.statistics()[k])) << k;
    EXPECT_TRUE(with.statistics()[k] == alone.statistics()[k]) << k;  // rank 0's, on every rank
  }
  EXPECT_EQ(with.a.num_batches_tracked(), 3);
  EXPECT_EQ(with.b.num_batches_tracked(), 3);
  // The counters come from rank 0 too.
  with.b.num_batches_tracked() = r == 0 ? 7 : 1;
  dist::broadcast_buffers(with.layers());
  EXPECT_EQ(with.b.num_batches_tracked(), 7);
  // Layers of other channels on one rank are refused on every rank, naming the first that differs.
  remat::nn::BatchNorm2d<float> odd(r == 1 ? 4 : 3);
  std::vector<remat::nn::BatchNorm2d<float>*> list{&with.a, &odd};
  remat_test::expect_error_naming<remat::shape_error>(
      [&] { dist::broadcast_buffers(list); }, {"broadcast_buffers", "parameter 2", "[3] on rank 0", "[4] on rank 1"});
  EXPECT_EQ(with.b.num_batches_tracked(), 7);
}

TEST(StepTiming, HiddenFractionIsTheBusyTimeBeforeBackwardEndOverTheBusyTime) {
  using Clock = dist::StepTiming::Clock;
  const Clock::time_point t0{};
  auto at = [&](int ms) { return t0 + std::chrono::milliseconds(ms); };
  dist::StepTiming t;
  t.backward_start = at(0);
  t.backward_end = at(10);
  t.finish_end = at(16);
  t.backward_timed = true;
  // In flight: [2, 6] and [5, 12] overlap (busy [2, 12]), then [13, 15]: 12 ms busy, 8 of them before 10.
  auto bucket = [&](int start, int pending, int done, std::size_t bytes) {
    dist::StepTiming::Bucket b;
    b.start = at(start), b.last_pending = at(pending), b.done = at(done), b.bytes = bytes;
    return b;
  };
  t.buckets = {bucket(2, 5, 6, 100), bucket(5, 9, 12, 20), bucket(13, 13, 15, 3)};
  EXPECT_DOUBLE_EQ(t.busy_seconds(), 0.012);
  EXPECT_DOUBLE_EQ(t.hidden_seconds(), 0.008);
  EXPECT_DOUBLE_EQ(t.hidden_fraction(), 8.0 / 12.0);
  EXPECT_DOUBLE_EQ(t.backward_seconds(), 0.010);
  EXPECT_DOUBLE_EQ(t.exposed_wait_seconds(), 0.006);
  EXPECT_DOUBLE_EQ(t.resolution_seconds(), 0.003);  // bucket 1: seen pending at 9, done at 12
  EXPECT_EQ(t.bytes(), 123u);
  t.backward_timed = false;  // a backward not run through GradientReducer::backward(): no overlap figure
  EXPECT_TRUE(std::isnan(t.hidden_fraction()));
  EXPECT_TRUE(std::isnan(t.exposed_wait_seconds()));
  EXPECT_DOUBLE_EQ(t.busy_seconds(), 0.012);
}

TEST(Distributed, TimingRecordsEveryBucketInOrderWithinTheStep) {
  const int r = dist::rank(), n = dist::size();
  Model m;
  dist::GradientReducer<float> reducer(m.parameters(), MPI_COMM_WORLD, 64);  // one bucket per parameter or so
  EXPECT_FALSE(reducer.timing_enabled());
  remat_test::expect_error_naming<std::logic_error>([&] { reducer.last_step_timing(); },
                                                    {"last_step_timing", "enable_timing"});
  reducer.enable_timing();
  remat_test::expect_error_naming<std::logic_error>([&] { reducer.last_step_timing(); },
                                                    {"last_step_timing", "no step has finished"});
  Tape<float> tape;
  reducer.attach(tape);
  const Shard s = shard(r, n, global_batch);
  reducer.set_local_weight(static_cast<double>(s.rows) / global_batch);
  for (int step = 0; step < 2; ++step) {
    tape.clear();
    for (Parameter<float>* p : m.parameters()) p->zero_grad();
    reducer.backward(tape, m.loss(tape, data_x(), data_labels(), s.first, s.rows, nullptr));
    reducer.finish();
    const dist::StepTiming& t = reducer.last_step_timing();
    ASSERT_TRUE(t.backward_timed);
    ASSERT_EQ(t.buckets.size(), reducer.bucket_count());
    std::size_t bytes = 0;
    for (Parameter<float>* p : m.parameters())
      bytes += (static_cast<std::size_t>(p->value().size()) + 1) * sizeof(float);
    EXPECT_EQ(t.bytes(), bytes);  // every gradient once, and one flag per parameter
    EXPECT_LE(t.backward_start, t.backward_end);
    EXPECT_LE(t.backward_end, t.finish_end);
    for (std::size_t b = 0; b < t.buckets.size(); ++b) {
      SCOPED_TRACE("step " + std::to_string(step) + ", bucket " + std::to_string(b));
      const dist::StepTiming::Bucket& k = t.buckets[b];
      EXPECT_TRUE(k.started_in_backward);  // every parameter is reported during backward
      EXPECT_LE(t.backward_start, k.start);
      EXPECT_LE(k.start, t.backward_end);
      EXPECT_LE(k.start, k.last_pending);
      EXPECT_LE(k.last_pending, k.done);
      EXPECT_LE(k.done, t.finish_end);
      if (b > 0) {
        EXPECT_LE(t.buckets[b - 1].start, k.start);  // started in bucket order
      }
    }
    EXPECT_GE(t.hidden_fraction(), 0.0);
    EXPECT_LE(t.hidden_fraction(), 1.0);
    EXPECT_GT(t.busy_seconds(), 0.0);
    EXPECT_GE(t.exposed_wait_seconds(), 0.0);
  }
  // Inside no_sync() backward() does not time: the step's figures are its synchronised backward's.
  tape.clear();
  {
    auto guard = reducer.no_sync();
    reducer.backward(tape, m.loss(tape, data_x(), data_labels(), s.first, s.rows, nullptr));
  }
  tape.clear();
  tape.backward(m.loss(tape, data_x(), data_labels(), s.first, s.rows, nullptr));  // not through reducer
  reducer.finish();
  EXPECT_FALSE(reducer.last_step_timing().backward_timed);
  EXPECT_TRUE(std::isnan(reducer.last_step_timing().hidden_fraction()));
}

/// --fail-on-rank / --mismatch-on-rank: a short training run in which one rank fails.
int faulty_run(int failing, bool mismatch) {
  return dist::run_or_abort("tests_distributed", [&] {
    const int r = dist::rank();
    Model m;
    std::vector<Parameter<float>*> list = m.parameters();
    Parameter<float> extra(Matrix<float>::Ones(3, 3));
    if (mismatch && r == failing) list.push_back(&extra);  // "different model flags"
    dist::broadcast_parameters(list);
    dist::GradientReducer<float> reducer(list);
    Tape<float> tape;
    reducer.attach(tape);
    for (int step = 0; step < 3; ++step) {
      if (step == 1 && r == failing)
        throw std::runtime_error("data/train-" + std::to_string(r) + ".bin: truncated after 12 bytes");
      tape.clear();
      tape.backward(m.loss(tape, data_x(), data_labels(), 0, 4, nullptr));
      reducer.finish();  // the other ranks wait here for the failing one
    }
    return 0;
  });
}

}  // namespace

int main(int argc, char** argv) {
  dist::Environment environment(argc, argv);
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--fail-on-rank" || flag == "--mismatch-on-rank")
      return faulty_run(std::stoi(argv[i + 1]), flag == "--mismatch-on-rank");
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
