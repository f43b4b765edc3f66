// A small U-Net (Ronneberger, Fischer & Brox 2015, two levels at toy size): conv2d + relu, max_pool2d, conv2d +
// relu, upsample_nearest2d, concatenation with the skip connection along the channels, conv2d + relu, a 1x1 conv2d,
// a squared loss. Each level is a checkpoint region; under every policy the loss and the gradients are bitwise the
// plain run's, and the bytes kept after the forward pass under nothing_saveable (and a name policy) equal a count
// by hand. The comparison is shown to fail for an input 1e-3 away in one element, so it is not vacuous.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "api_checks.hpp"
#include "nd_gradcheck.hpp"
#include "remat/remat.hpp"

namespace unet_test {

using remat::Shape;
using remat::Tape;
using remat::Var;
using remat_test::AnyPolicy;

// x [2,2,8,8] → e [2,4,8,8] → pooled [2,4,4,4] → bottleneck [2,8,4,4] → up [2,8,8,8] → concat [2,12,8,8]
// → [2,4,8,8] → o [2,1,8,8] → loss sum(o²).
const Shape input_shape{2, 2, 8, 8};

remat::Parameter<float> parameter(const Shape& s, std::uint64_t seed) {
  const remat::Matrix<double> v = remat_test::nd_values(s, seed, -0.5, 0.5);
  if (s.rank() == 1) {
    remat::Tensor<float, 1> t(s[0]);
    std::transform(v.data(), v.data() + v.size(), t.data(), [](double d) { return static_cast<float>(d); });
    return remat::Parameter<float>(t);
  }
  remat::Tensor<float, 4> t(s[0], s[1], s[2], s[3]);
  std::transform(v.data(), v.data() + v.size(), t.data(), [](double d) { return static_cast<float>(d); });
  return remat::Parameter<float>(t);
}

struct UNet {
  remat::Parameter<float> w1 = parameter({4, 2, 3, 3}, 1), b1 = parameter({4}, 2);
  remat::Parameter<float> w2 = parameter({8, 4, 3, 3}, 3), b2 = parameter({8}, 4);
  remat::Parameter<float> w3 = parameter({4, 12, 3, 3}, 5), b3 = parameter({4}, 6);
  remat::Parameter<float> w4 = parameter({1, 4, 1, 1}, 7), b4 = parameter({1}, 8);
  std::vector<remat::Parameter<float>*> all() { return {&w1, &b1, &w2, &b2, &w3, &b3, &w4, &b4}; }
};

struct Result {
  float loss = 0;
  std::vector<std::vector<float>> grads;  // of w1, b1, ..., b4
  std::size_t saved_bytes = 0;            // tape.memory().saved_bytes after the forward pass
  std::string residuals;                  // print_saved_residuals, for the failure messages
};

/// One step: the three levels plain (policy null) or each one a checkpoint region under `policy`.
Result step(UNet& net, const std::vector<float>& input, const AnyPolicy* policy) {
  for (auto* p : net.all()) p->zero_grad();
  Tape<float> tape;
  const Var<float> x = tape.constant(input_shape, input.data());
  const Var<float> w1 = tape.variable(net.w1), b1 = tape.variable(net.b1), w2 = tape.variable(net.w2),
                   b2 = tape.variable(net.b2), w3 = tape.variable(net.w3), b3 = tape.variable(net.b3),
                   w4 = tape.variable(net.w4), b4 = tape.variable(net.b4);
  const auto same = remat::Conv2dOptions().padding(1);
  auto encoder = [&](const Var<float>& in) { return remat::relu(remat::conv2d(in, w1, b1, same)); };
  auto bottleneck = [&](const Var<float>& e) {
    const Var<float> pooled = remat::max_pool2d(e, remat::MaxPool2dOptions(2));
    const Var<float> m = remat::checkpoint_name(remat::relu(remat::conv2d(pooled, w2, b2, same)), "bottleneck");
    return remat::upsample_nearest2d(m, remat::UpsampleNearest2dOptions().scale_factor(2));
  };
  auto decoder = [&](const Var<float>& up, const Var<float>& skip) {
    const Var<float> joined = remat::concat({up, skip}, 1);
    return remat::conv2d(remat::relu(remat::conv2d(joined, w3, b3, same)), w4, b4);
  };
  Var<float> e, up, o;
  if (policy) {
    e = remat::checkpoint(encoder, *policy)(x);
    up = remat::checkpoint(bottleneck, *policy)(e);
    o = remat::checkpoint(decoder, *policy)(up, e);
  } else {
    e = encoder(x);
    up = bottleneck(e);
    o = decoder(up, e);
  }
  EXPECT_EQ(up.shape(), (Shape{2, 8, 8, 8}));
  EXPECT_EQ(o.shape(), (Shape{2, 1, 8, 8}));
  const Var<float> loss = remat::sum(remat::square(o));
  Result r;
  r.saved_bytes = tape.memory().saved_bytes;
  std::ostringstream residuals;
  tape.print_saved_residuals(residuals);
  r.residuals = residuals.str();
  tape.backward(loss);
  r.loss = loss.item();
  for (auto* p : net.all()) r.grads.emplace_back(p->grad().data(), p->grad().data() + p->grad().size());
  return r;
}

::testing::AssertionResult bitwise_equal(const Result& a, const Result& b) {
  if (std::memcmp(&a.loss, &b.loss, sizeof(float)) != 0)
    return ::testing::AssertionFailure() << "loss " << a.loss << " vs " << b.loss;
  for (std::size_t k = 0; k < a.grads.size(); ++k)
    if (a.grads[k].size() != b.grads[k].size() ||
        std::memcmp(a.grads[k].data(), b.grads[k].data(), a.grads[k].size() * sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "the gradient of parameter " << k << " differs";
  return ::testing::AssertionSuccess();
}

std::vector<float> input() {
  const remat::Matrix<double> v = remat_test::nd_values(input_shape, 11);
  std::vector<float> x(static_cast<std::size_t>(v.size()));
  std::transform(v.data(), v.data() + v.size(), x.begin(), [](double d) { return static_cast<float>(d); });
  return x;
}

TEST(UNet, EveryPolicyPerLevelGivesThePlainLossAndGradientsBitwise) {
  UNet net;
  const std::vector<float> x = input();
  const Result plain = step(net, x, nullptr);
  ASSERT_TRUE(std::isfinite(plain.loss) && plain.loss > 0);
  namespace p = remat::policies;
  const std::vector<std::pair<std::string, AnyPolicy>> policies = {
      {"nothing_saveable", p::nothing_saveable},
      {"dots_saveable", p::dots_saveable},
      {"everything_saveable", p::everything_saveable},
      {"save_only_these_names(bottleneck)", p::save_only_these_names({"bottleneck"})},
      {"save_anything_except_these_names(bottleneck)", p::save_anything_except_these_names({"bottleneck"})}};
  for (const auto& [name, policy] : policies) EXPECT_TRUE(bitwise_equal(step(net, x, &policy), plain)) << name;

  // The comparison can fail: one input element 1e-3 away (under nothing_saveable, as a wrong replay source would
  // be) changes the loss and the gradients. (One ulp of that element, -0.0129, changes no bit of them: too little
  // to reach a float sum of terms near 1.)
  std::vector<float> moved = x;
  moved[37] += 1e-3f;
  const AnyPolicy nothing = p::nothing_saveable;
  EXPECT_FALSE(bitwise_equal(step(net, moved, &nothing), plain));
}

TEST(UNet, KeepsTheBytesCountedByHandUnderNothingSaveable) {
  UNet net;
  const std::vector<float> x = input();
  const AnyPolicy nothing = remat::policies::nothing_saveable;
  const Result r = step(net, x, &nothing);
  // Kept for the backward, in floats (the weights are Parameters: referenced, not counted):
  //   x [2,2,8,8]  256   the encoder's input (its conv2d's dW reads it)
  //   e [2,4,8,8]  512   the encoder's output: the bottleneck's and the decoder's input
  //   up [2,8,8,8] 1024  the bottleneck's output (upsample_nearest2d's), the decoder's input
  //   o [2,1,8,8]  128   the decoder's output, which square's backward reads
  // Nothing inside a region (the pooled map, the bottleneck, the concatenation, the decoder's hidden map): the
  // backward replays them; upsample_nearest2d itself reads nothing.
  const std::size_t by_hand = (256 + 512 + 1024 + 128) * sizeof(float);
  EXPECT_EQ(r.saved_bytes, by_hand) << r.residuals;
  // A name policy adds the one named value, the bottleneck [2,8,4,4] (relu's backward reads it).
  const AnyPolicy named = remat::policies::save_only_these_names({"bottleneck"});
  const Result n = step(net, x, &named);
  EXPECT_EQ(n.saved_bytes, by_hand + 256 * sizeof(float)) << n.residuals;
  // everything_saveable keeps what the plain tape keeps.
  const AnyPolicy everything = remat::policies::everything_saveable;
  EXPECT_EQ(step(net, x, &everything).saved_bytes, step(net, x, nullptr).saved_bytes);
}

}  // namespace unet_test
