// W4 in LibTorch (C++): examples/resnet's ResNet in torch::nn modules, built only with LibTorch
// (REMAT_BENCH_LIBTORCH). The interface has no Torch types so that only torch_resnet.cpp pays for Torch's headers.
#pragma once

#include <memory>
#include <vector>

namespace bench {

/// One training step (forward, mean cross-entropy, backward into every parameter's .grad) of ResNet-(6·blocks+2)
/// with `width` channels in its first stage, on a fixed batch of `batch` random 28×28 images. LibTorch's C++ API
/// has no activation checkpointing, so it runs plain.
class TorchResNet {
 public:
  TorchResNet(int width, int blocks, int batch);
  ~TorchResNet();
  TorchResNet(const TorchResNet&) = delete;
  TorchResNet& operator=(const TorchResNet&) = delete;

  float step();
  /// torch::set_num_threads (intra-op threads).
  static void set_threads(int threads);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bench
