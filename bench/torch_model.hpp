// The workloads in LibTorch (C++), built only when CMake finds Torch (REMAT_BENCH_LIBTORCH). The
// interface has no Torch types so that only torch_model.cpp pays for Torch's headers.
#pragma once

#include <memory>
#include <vector>

#include "hand_written.hpp"
#include "workloads.hpp"

namespace bench {

/// One training step (forward, loss, backward into .grad of every weight) of an MLP, W2 or W3 in LibTorch,
/// the weights [in, out] as in Data, x·W + b through torch::addmm. W3 is docs/gpt.md's GPT in plain
/// LibTorch ops (LibTorch's C++ API has no activation checkpointing), with the contract's deterministic
/// parameters.
class TorchModel {
 public:
  TorchModel(const Data& data, const MlpShape& shape);
  TorchModel(const Data& data, const BlockShape& shape);
  TorchModel(const GptData& data, const GptShape& shape);
  ~TorchModel();
  TorchModel(const TorchModel&) = delete;
  TorchModel& operator=(const TorchModel&) = delete;

  float step();
  Gradients gradients() const;
  /// W3: every parameter's gradient in docs/gpt.md's order and shapes (biases and gains [1, n]).
  std::vector<Matrix<float>> parameter_gradients() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// torch::set_num_threads (intra-op threads; OpenBLAS threads are set separately).
void torch_set_threads(int threads);

}  // namespace bench
