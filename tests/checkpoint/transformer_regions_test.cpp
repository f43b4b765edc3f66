// Nested checkpoint regions around every transformer-era op at once (fused and unfused attention, embedding,
// gather, an op with a temporary, fma, dropout, reshape, transpose, detach, slice/concat, max_rows, sum_cols,
// mean_cols): gradients bitwise equal to the plain tape's for every pair of outer and inner policies.
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
#include "fma_op.hpp"
#include "random.hpp"
#include "remat/remat.hpp"
#include "sample_ops.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace transformer_regions_test {

using remat_test::gather_cols;
using remat_test::GatherColsOp;
using remat_test::ScratchOp;

using remat_test::fma;
using remat_test::FmaOp;

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

// ================================================================ nested regions, every policy, every new op

struct NetInputs {
  MF x, w, table;
  std::vector<int> ids;
};

NetInputs net_inputs() {
  return {rnd(6, 4, 21), rnd(4, 12, 22), rnd(5, 4, 23), {4, 0, 4, 1, 3, 3}};
}

struct NetResult {
  MF loss, dx, dw, dtable;
};

/// Everything new in one graph of x [6,4] (B = 2 sequences of S = 3, H = 4, 2 heads): an outer region
/// around the attention block, an inner region around attention, a gather, the scratch op, fma, dropout,
/// reshape, transpose, detach, embedding, slice/concat, max_rows, sum_cols and mean_cols. A null policy
/// means no region.
NetResult run_net(const NetInputs& in, const AnyPolicy* outer, const AnyPolicy* inner, bool fused, bool causal,
                  bool eval_before_backward) {
  Tape<float> tape(42);
  const VF x = tape.variable(in.x), w = tape.variable(in.w), table = tape.variable(in.table);
  const std::vector<int> cols = {11, 0, 5, 5};
  auto attention = [&](const VF& h) {
    const VF q = remat::slice_cols(h, 0, 4), k = remat::slice_cols(h, 4, 4), v = remat::slice_cols(h, 8, 4);
    const VF a = fused ? remat::scaled_dot_product_attention(q, k, v, 2, 3, causal)
                       : remat::attention_values(remat::softmax(remat::attention_scores(q, k, 2, 3, causal)), v, 2, 3);
    const VF named = remat::checkpoint_name(a, "attn");
    const VF z = remat::dropout(fma(named, gather_cols(h, cols, "gathered"), remat::apply_op<ScratchOp>(q)), 0.25);
    const VF t = remat::reshape(remat::transpose(z), 6, 4);
    return t + remat::detach(q) * z;
  };
  auto block = [&](const VF& xin) {
    const VF h = remat::tanh(remat::matmul(xin, w));
    const VF e = inner ? remat::checkpoint(attention, *inner)(h) : attention(h);
    const VF both = remat::concat_cols({e, remat::embedding(table, in.ids)});
    return remat::matmul(remat::slice_cols(both, 0, 4), remat::transpose(remat::slice_cols(w, 0, 4))) +
           remat::slice_cols(both, 4, 4) * e;
  };
  const VF y = outer ? remat::checkpoint(block, *outer)(x) : block(x);
  const VF loss = remat::sum(remat::square(y)) + remat::sum(remat::max_rows(y)) +
                  remat::sum(remat::mean_cols(y) * remat::sum_cols(y));
  if (eval_before_backward) tape.set_training(false);  // the replay must still draw the recorded mask
  tape.backward(loss);
  return {MF(loss.value()), MF(x.grad()), MF(w.grad()), MF(table.grad())};
}

TEST(TransformerRegions, NestedRegionsGiveBitwiseEqualGradientsForEveryPolicyPairFusedAndUnfused) {
  const NetInputs in = net_inputs();
  const auto policies = every_policy();
  for (const bool fused : {false, true})
    for (const bool causal : {false, true}) {
      const NetResult plain = run_net(in, nullptr, nullptr, fused, causal, false);
      ASSERT_TRUE(plain.dx.allFinite() && plain.dw.allFinite() && plain.dtable.allFinite());
      auto check = [&](const NetResult& r, const std::string& what) {
        EXPECT_TRUE(same_bits(r.loss, plain.loss)) << what;
        EXPECT_TRUE(same_bits(r.dx, plain.dx)) << what;
        EXPECT_TRUE(same_bits(r.dw, plain.dw)) << what;
        EXPECT_TRUE(same_bits(r.dtable, plain.dtable)) << what;
      };
      const std::string mode = std::string(fused ? "fused" : "unfused") + (causal ? " causal" : "");
      for (const auto& [outer_name, outer] : policies) {
        check(run_net(in, &outer, nullptr, fused, causal, false), mode + ", outer " + outer_name);
        check(run_net(in, nullptr, &outer, fused, causal, false), mode + ", inner " + outer_name);
        for (const auto& [inner_name, inner] : policies)
          check(run_net(in, &outer, &inner, fused, causal, inner_name == outer_name),
                mode + ", outer " + outer_name + ", inner " + inner_name);
      }
    }
}

}  // namespace transformer_regions_test
