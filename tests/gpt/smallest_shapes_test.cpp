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

#include "api_checks.hpp"
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

using remat_test::describe;
using remat_test::expect_error_naming;
using remat_test::passes;
using remat_test::rnd;
using remat_test::rndd;
using remat_test::same_bits;
using remat_test::same_memory;

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
