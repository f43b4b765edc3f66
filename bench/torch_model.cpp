// LibTorch version of the reference workloads; see torch_model.hpp.
#include "torch_model.hpp"

#include <torch/torch.h>

namespace bench {

namespace {

torch::Tensor to_tensor(const Matrix<float>& m, bool requires_grad) {
  auto t = torch::from_blob(const_cast<float*>(m.data()), {m.rows(), m.cols()}, torch::kFloat32).clone();
  return t.set_requires_grad(requires_grad);
}

Matrix<float> to_matrix(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  const auto rows = t.dim() == 1 ? 1 : t.size(0);
  const auto cols = t.dim() == 1 ? t.size(0) : t.size(1);
  return Eigen::Map<const Matrix<float>>(c.data_ptr<float>(), rows, cols);
}

}  // namespace

struct TorchModel::Impl {
  bool mlp = true;
  torch::Tensor x, labels;
  std::vector<torch::Tensor> weight, bias, gain, shift;  // gain, shift: W2's layer norms, 1-D

  torch::Tensor forward_mlp() const {
    torch::Tensor h = x;
    const std::size_t n = weight.size();
    for (std::size_t l = 0; l + 1 < n; ++l) h = torch::tanh(torch::addmm(bias[l], h, weight[l]));
    return torch::addmm(bias[n - 1], h, weight[n - 1]);
  }
  torch::Tensor forward_blocks() const {
    torch::Tensor h = x;
    const std::size_t blocks = gain.size() - 1;
    const int64_t width = x.size(1);
    for (std::size_t i = 0; i < blocks; ++i) {
      torch::Tensor n = torch::layer_norm(h, {width}, gain[i], shift[i], 1e-5);
      torch::Tensor u = torch::gelu(torch::addmm(bias[2 * i], n, weight[2 * i]), "tanh");
      h = h + torch::addmm(bias[2 * i + 1], u, weight[2 * i + 1]);
    }
    torch::Tensor n = torch::layer_norm(h, {width}, gain.back(), shift.back(), 1e-5);
    return torch::addmm(bias.back(), n, weight.back());
  }
};

TorchModel::TorchModel(const Data& data, const MlpShape&) : impl_(new Impl) {
  impl_->x = to_tensor(data.x, false);
  impl_->labels = torch::tensor(std::vector<int64_t>(data.labels.begin(), data.labels.end()), torch::kInt64);
  for (const Affine& a : data.affine) {
    impl_->weight.push_back(to_tensor(a.weight, true));
    impl_->bias.push_back(to_tensor(a.bias, false).reshape({-1}).set_requires_grad(true));
  }
}

TorchModel::TorchModel(const Data& data, const BlockShape& shape) : TorchModel(data, MlpShape{}) {
  (void)shape;
  impl_->mlp = false;
  for (const Affine& a : data.norm) {
    impl_->gain.push_back(to_tensor(a.weight, false).reshape({-1}).set_requires_grad(true));
    impl_->shift.push_back(to_tensor(a.bias, false).reshape({-1}).set_requires_grad(true));
  }
}

TorchModel::~TorchModel() = default;

float TorchModel::step() {
  auto clear = [](std::vector<torch::Tensor>& ts) {
    for (auto& t : ts) t.mutable_grad() = torch::Tensor();
  };
  clear(impl_->weight);
  clear(impl_->bias);
  clear(impl_->gain);
  clear(impl_->shift);
  const torch::Tensor logits = impl_->mlp ? impl_->forward_mlp() : impl_->forward_blocks();
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits, impl_->labels);
  loss.backward();
  return loss.item<float>();
}

Gradients TorchModel::gradients() const {
  Gradients g;
  for (std::size_t i = 0; i < impl_->weight.size(); ++i)
    g.affine.push_back({to_matrix(impl_->weight[i].grad()), to_matrix(impl_->bias[i].grad())});
  for (std::size_t i = 0; i < impl_->gain.size(); ++i)
    g.norm.push_back({to_matrix(impl_->gain[i].grad()), to_matrix(impl_->shift[i].grad())});
  return g;
}

void torch_set_threads(int threads) {
  torch::set_num_threads(threads);
}

}  // namespace bench
