// memory() against residual bytes computed by hand as JAX's checkpoint would save them: MLPs of two or three
// checkpointed layers with tanh, relu or gelu under dots_saveable, nothing_saveable and everything_saveable:
// saved bytes, replayed ops and replayed bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace residual_bytes_test {

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

// ---------------------------------------------------------------------------------------------------------------
// memory() against hand-computed JAX residuals. Every [8,16] float value = 512 B; Parameters count 0.
struct MemCase {
  const char* name;
  int layers;
  int act;  // 0 tanh, 1 relu, 2 gelu
  bool x_variable;
  Policy policy;
  std::size_t saved, ops, replayed;
};

inline Var<float> act(int a, const Var<float>& v) {
  return a == 0 ? remat::tanh(v) : a == 1 ? remat::relu(v) : remat::gelu(v);
}

TEST(ResidualBytes, HandComputedResiduals) {
  namespace p = remat::policies;
  const std::vector<MemCase> cases = {
      // The returned activation is read only by its own backward, so a policy that drops it drops it (JAX's
      // rule: a checkpointed function's outputs are its values like any other).
      // Doc example: x, l1, l2 (sources of tanh1's and tanh2's replays). Replay tanh1, tanh2.
      {"2 tanh dots", 2, 0, false, p::dots_saveable, 1536, 2, 1024},
      {"2 tanh nothing", 2, 0, false, p::nothing_saveable, 512, 4, 2048},
      {"2 tanh everything", 2, 0, false, p::everything_saveable, 1536, 0, 0},
      // relu reads its output like tanh: same numbers.
      {"2 relu dots", 2, 1, false, p::dots_saveable, 1536, 2, 1024},
      // x requiring grad: linear1 additionally reads W1 (a Parameter, 0 B); gradients are not "saved".
      {"2 tanh dots xgrad", 2, 0, true, p::dots_saveable, 1536, 2, 1024},
      // 3 layers: x, l1, l2, l3 (sources) = 2048; replay tanh1, tanh2, tanh3 = 1536 B.
      {"3 tanh dots", 3, 0, false, p::dots_saveable, 2048, 3, 1536},
      // 3 layers nothing: x = 512; replay l1 t1 l2 t2 l3 t3 = 6 ops, 3072 B.
      {"3 tanh nothing", 3, 0, false, p::nothing_saveable, 512, 6, 3072},
      // 3 layers everything: x, t1, t2, t3 = 2048.
      {"3 relu everything", 3, 1, false, p::everything_saveable, 2048, 0, 0},
      // gelu reads its input: dots keeps x, l1, l2 (read by gelu1, gelu2's backwards; l1 also a source);
      // t2 (output) is read by nothing (sum reads nothing). Replay gelu1 -> t1 (read by linear2): 1 op.
      {"2 gelu dots", 2, 2, false, p::dots_saveable, 1536, 1, 512},
      // gelu nothing: x only; replay l1, t1, l2 = 3 ops, 1536 B.
      {"2 gelu nothing", 2, 2, false, p::nothing_saveable, 512, 3, 1536},
  };
  for (const MemCase& mc : cases) {
    Parameter<float> W[3] = {Parameter<float>(rnd<float>(16, 16, 1, 0.3)), Parameter<float>(rnd<float>(16, 16, 2, 0.3)),
                             Parameter<float>(rnd<float>(16, 16, 3, 0.3))};
    Parameter<float> Bs[3] = {Parameter<float>(rnd<float>(1, 16, 4)), Parameter<float>(rnd<float>(1, 16, 5)),
                              Parameter<float>(rnd<float>(1, 16, 6))};
    Tape<float> tape;
    std::vector<Var<float>> w, b;
    for (int i = 0; i < mc.layers; ++i) {
      w.push_back(tape.variable(W[i]));
      b.push_back(tape.variable(Bs[i]));
    }
    const Matrix<float> X = rnd<float>(8, 16, 7);
    Var<float> x = mc.x_variable ? tape.variable(X) : tape.constant(X);
    auto f = [&](Var<float> h) {
      for (int i = 0; i < mc.layers; ++i) h = act(mc.act, remat::linear(h, w[i], b[i]));
      return h;
    };
    Var<float> loss = remat::sum(remat::checkpoint(f, mc.policy)(x));
    EXPECT_EQ(tape.memory().saved_bytes, mc.saved) << mc.name;
    tape.backward(loss);
    EXPECT_EQ(tape.memory().replayed_ops, mc.ops) << mc.name;
    EXPECT_EQ(tape.memory().replayed_bytes, mc.replayed) << mc.name;
  }
}

}  // namespace residual_bytes_test
