// examples/resnet's ResNet in LibTorch: the same layers as bench/peers/resnet_fashion_mnist.py's build_model.
#include "torch_resnet.hpp"

#include <torch/torch.h>

namespace bench {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int in, int out, int kernel, int stride) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

struct BlockImpl : nn::Module {
  nn::Conv2d conv1{nullptr}, conv2{nullptr}, shortcut_conv{nullptr};
  nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, shortcut_bn{nullptr};

  BlockImpl(int in, int out, int stride) {
    conv1 = register_module("conv1", conv(in, out, 3, stride));
    bn1 = register_module("bn1", nn::BatchNorm2d(out));
    conv2 = register_module("conv2", conv(out, out, 3, 1));
    bn2 = register_module("bn2", nn::BatchNorm2d(out));
    if (stride != 1 || in != out) {
      shortcut_conv = register_module("shortcut_conv", conv(in, out, 1, stride));
      shortcut_bn = register_module("shortcut_bn", nn::BatchNorm2d(out));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(bn1(conv1(x)));
    h = bn2(conv2(h));
    return torch::relu(h + (shortcut_conv ? shortcut_bn(shortcut_conv(x)) : x));
  }
};
TORCH_MODULE(Block);

struct NetImpl : nn::Module {
  nn::Conv2d stem{nullptr};
  nn::BatchNorm2d stem_bn{nullptr};
  std::vector<Block> blocks;
  nn::Linear fc{nullptr};

  NetImpl(int width, int blocks_per_stage) {
    stem = register_module("stem", conv(1, width, 3, 1));
    stem_bn = register_module("stem_bn", nn::BatchNorm2d(width));
    int in = width;
    for (int stage = 0; stage < 3; ++stage)
      for (int b = 0; b < blocks_per_stage; ++b) {
        const int out = width << stage;
        blocks.push_back(
            register_module("block" + std::to_string(blocks.size()), Block(in, out, stage > 0 && b == 0 ? 2 : 1)));
        in = out;
      }
    fc = register_module("fc", nn::Linear(in, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = torch::relu(stem_bn(stem(x)));
    for (Block& b : blocks) h = b->forward(h);
    return fc(torch::adaptive_avg_pool2d(h, {1, 1}).flatten(1));
  }
};
TORCH_MODULE(Net);

}  // namespace

struct TorchResNet::Impl {
  Net net;
  torch::Tensor x, y;
  Impl(int width, int blocks, int batch)
      : net(width, blocks), x(torch::randn({batch, 1, 28, 28})), y(torch::randint(0, 10, {batch})) {
    net->train();
  }
};

TorchResNet::TorchResNet(int width, int blocks, int batch) {
  torch::manual_seed(1);
  impl_ = std::make_unique<Impl>(width, blocks, batch);
}
TorchResNet::~TorchResNet() = default;

float TorchResNet::step() {
  impl_->net->zero_grad();
  torch::Tensor loss = torch::nn::functional::cross_entropy(impl_->net->forward(impl_->x), impl_->y);
  loss.backward();
  return loss.item<float>();
}

void TorchResNet::set_threads(int threads) {
  torch::set_num_threads(threads);
}

}  // namespace bench
