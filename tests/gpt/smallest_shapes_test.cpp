// The GPT example (examples/gpt/gpt.hpp) at its smallest shapes: one position, one width per head, in every
// recompute mode, fused and unfused attention.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "gpt/gpt.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace smallest_shapes_test {

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
double max_abs_diff(const MF& a, const MF& b) {
  return (a - b).cwiseAbs().maxCoeff();
}

// ================================================================ the GPT example at its edges

TEST(GptSmallestShapes, OnePositionOneWidthPerHeadEveryRecomputeModeAndAttention) {
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

}  // namespace smallest_shapes_test
