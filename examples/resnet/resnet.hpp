// The residual network of the Fashion-MNIST example (He et al., "Deep Residual Learning for Image Recognition",
// CVPR 2016): basic blocks of conv2d, batch_norm and relu, global average pooling, a linear layer; its blocks
// optionally checkpointed. examples/resnet/main.cpp trains it; bench/resnet_step.cpp times its step.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <remat/remat.hpp>

namespace resnet {

using remat::Tape;
using V = remat::Var<float>;

constexpr int classes = 10;
constexpr remat::Index side = 28;  // Fashion-MNIST's images are 28×28, one channel

/// One basic block: conv3×3 → BN → relu → conv3×3 → BN, plus the input or its 1×1 projection, then relu.
struct BasicBlock {
  remat::nn::Conv2d<float> conv1, conv2;
  remat::nn::BatchNorm2d<float> bn1, bn2;
  std::vector<remat::nn::Conv2d<float>> shortcut_conv;  // one, when the block changes the shape
  std::vector<remat::nn::BatchNorm2d<float>> shortcut_bn;

  BasicBlock(remat::Index in, remat::Index out, remat::Index stride, remat::nn::Generator& g)
      : conv1(in, out, 3, g, remat::Conv2dOptions().stride(stride).padding(1), false),
        conv2(out, out, 3, g, remat::Conv2dOptions().padding(1), false),
        bn1(out),
        bn2(out) {
    if (stride != 1 || in != out) {
      shortcut_conv.emplace_back(in, out, 1, g, remat::Conv2dOptions().stride(stride), false);
      shortcut_bn.emplace_back(out);
    }
  }
};

/// The network: stem conv3×3 → BN → relu, stages of widths w, 2w, 4w (strides 1, 2, 2), global average
/// pooling, a linear layer to the classes.
struct ResNet {
  remat::nn::Conv2d<float> stem;
  remat::nn::BatchNorm2d<float> stem_bn;
  std::vector<BasicBlock> blocks;
  remat::nn::Linear<float> fc;

  /// ResNet-(6·blocks + 2) whose first stage has `width` channels, initialised from `g`.
  ResNet(int width, int blocks_per_stage, remat::nn::Generator& g)
      : stem(1, width, 3, g, remat::Conv2dOptions().padding(1), false), stem_bn(width), fc(4 * width, classes, g) {
    // PyTorch's nn.Linear initialisation, U(−1/√in, 1/√in) for the weight and the bias, as the reference has.
    const double bound = 1 / std::sqrt(4.0 * width);
    for (remat::Parameter<float>* p : {&fc.weight, &fc.bias})
      for (remat::Index i = 0; i < p->value().size(); ++i)
        p->mutable_value().data()[i] = static_cast<float>((2 * g.uniform() - 1) * bound);
    remat::Index in = width;
    for (int stage = 0; stage < 3; ++stage)
      for (int b = 0; b < blocks_per_stage; ++b) {
        const remat::Index out = remat::Index(width) << stage;
        blocks.emplace_back(in, out, stage > 0 && b == 0 ? 2 : 1, g);
        in = out;
      }
  }

  /// Every Parameter the optimizer updates: conv and linear weights (decayed) and the rest (not decayed).
  void parameters(std::vector<remat::Parameter<float>*>& decayed, std::vector<remat::Parameter<float>*>& other) {
    auto bn = [&](remat::nn::BatchNorm2d<float>& n) {
      other.push_back(&n.weight);
      other.push_back(&n.bias);
    };
    decayed.push_back(&stem.weight);
    bn(stem_bn);
    for (BasicBlock& b : blocks) {
      decayed.push_back(&b.conv1.weight);
      decayed.push_back(&b.conv2.weight);
      bn(b.bn1);
      bn(b.bn2);
      for (auto& c : b.shortcut_conv) decayed.push_back(&c.weight);
      for (auto& n : b.shortcut_bn) bn(n);
    }
    decayed.push_back(&fc.weight);
    other.push_back(&fc.bias);
  }
};

/// A basic block's forward on `tape` (its Parameters recorded where the block is).
inline V block_forward(Tape<float>& tape, BasicBlock& b, const V& x) {
  V h = remat::relu(b.bn1.forward(tape, b.conv1.forward(tape, x)));
  h = b.bn2.forward(tape, b.conv2.forward(tape, h));
  const V shortcut = b.shortcut_conv.empty() ? x : b.shortcut_bn[0].forward(tape, b.shortcut_conv[0].forward(tape, x));
  return remat::relu(h + shortcut);
}

/// The format of a compressed mode: "bf16"; "int8" (a scale per 64 elements), "int8/row", "int8/<group>"; full
/// for any other mode.
inline remat::Compression compression_of_mode(const std::string& mode) {
  if (mode == "bf16") return remat::Compression::bf16();
  if (mode == "int8") return remat::Compression::int8_per_group(64);
  if (mode == "int8/row") return remat::Compression::int8_per_row();
  if (mode.rfind("int8/", 0) == 0) return remat::Compression::int8_per_group(std::stoi(mode.substr(5)));
  return {};
}

/// The logits [B, classes] of images x [B, 1, 28, 28], the blocks checkpointed as `checkpoint` says: "block"
/// (each block, nothing_saveable), "dots" (each block, dots_saveable), "sqrt" (segments of ⌈√blocks⌉ blocks,
/// nothing_saveable), "bf16", "int8" or another of compression_of_mode's (each block keeps every residual,
/// compressed: docs/compression.md) or anything else (none).
inline V forward(const std::string& checkpoint, Tape<float>& tape, ResNet& net, const V& x) {
  V h = remat::relu(net.stem_bn.forward(tape, net.stem.forward(tape, x)));
  const std::size_t n = net.blocks.size();
  // Blocks per checkpointed segment: 1 for block and dots, about √n for sqrt (Chen et al. 2016), all otherwise.
  const std::size_t segment = checkpoint == "sqrt" ? static_cast<std::size_t>(std::ceil(std::sqrt(double(n)))) : 1;
  const bool compressed = checkpoint.rfind("bf16", 0) == 0 || checkpoint.rfind("int8", 0) == 0;
  const bool checkpointed = checkpoint == "block" || checkpoint == "dots" || checkpoint == "sqrt" || compressed;
  const auto keep_compressed =
      remat::policies::save_compressed(compression_of_mode(checkpoint), remat::policies::everything_saveable);
  for (std::size_t first = 0; first < n; first += segment) {
    const std::size_t last = std::min(n, first + segment);
    auto run = [&](const V& in) {
      V y = in;
      for (std::size_t k = first; k < last; ++k) y = block_forward(tape, net.blocks[k], y);
      return y;
    };
    if (!checkpointed)
      h = run(h);
    else if (checkpoint == "dots")
      h = remat::checkpoint(run, remat::policies::dots_saveable)(h);
    else if (compressed)
      h = remat::checkpoint(run, keep_compressed)(h);
    else
      h = remat::checkpoint(run, remat::policies::nothing_saveable)(h);
  }
  h = remat::flatten(remat::adaptive_avg_pool2d(h, {1, 1}), 1);  // [B, 4w]
  return remat::linear(h, tape.variable(net.fc.weight), tape.variable(net.fc.bias));
}

}  // namespace resnet
