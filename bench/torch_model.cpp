// LibTorch version of the reference workloads; see torch_model.hpp.
#include "torch_model.hpp"

#include <cmath>
#include <iterator>
#include <limits>

#include <torch/torch.h>

#include "gpt/gpt.hpp"

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
  enum class Kind { mlp, blocks, gpt } kind = Kind::mlp;
  torch::Tensor x, labels;
  std::vector<torch::Tensor> weight, bias, gain, shift;  // gain, shift: W2's layer norms, 1-D
  // W3: every parameter in docs/gpt.md's order, with remat's shapes ([1, n] gains and biases, so that the
  // gradients compare shape for shape); ids and positions [B·S]; labels hold the targets.
  std::vector<torch::Tensor> params;
  torch::Tensor ids, positions, future;  // future: [S, S], true above the diagonal (the causal mask)
  GptShape gpt_shape{};

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
  /// docs/gpt.md's forward, written as bench/peers/gpt_pytorch.py's "plain" variant.
  torch::Tensor forward_gpt() const {
    const GptShape& s = gpt_shape;
    const int64_t B = s.batch, S = s.seq_len, H = s.width, heads = s.heads, d = H / heads;
    const auto norm = [H](const torch::Tensor& v, const torch::Tensor& g, const torch::Tensor& b) {
      return torch::layer_norm(v, {H}, g.reshape({H}), b.reshape({H}), 1e-5);
    };
    // [B·S, H] (a column slice of qkv) → [B, heads, S, d].
    const auto split = [&](const torch::Tensor& t) { return t.reshape({B, S, heads, d}).transpose(1, 2); };
    torch::Tensor h = torch::embedding(params[0], ids) + torch::embedding(params[1], positions);
    const std::size_t per_block = std::size(gpt::block_parameter_names);
    for (int64_t l = 0; l < s.blocks; ++l) {
      const torch::Tensor* w = &params[2 + per_block * static_cast<std::size_t>(l)];
      // w: ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias, ln2_gain, ln2_bias, fc_weight,
      // fc_bias, fc_proj_weight, fc_proj_bias.
      const torch::Tensor qkv = torch::addmm(w[3], norm(h, w[0], w[1]), w[2]);
      const torch::Tensor q = split(qkv.slice(1, 0, H)), k = split(qkv.slice(1, H, 2 * H)),
                          v = split(qkv.slice(1, 2 * H, 3 * H));
      const torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
      const torch::Tensor probabilities =
          torch::softmax(scores.masked_fill(future, -std::numeric_limits<float>::infinity()), -1);
      const torch::Tensor y = torch::matmul(probabilities, v).transpose(1, 2).reshape({B * S, H});
      h = h + torch::addmm(w[5], y, w[4]);
      const torch::Tensor hidden = torch::gelu(torch::addmm(w[9], norm(h, w[6], w[7]), w[8]), "tanh");
      h = h + torch::addmm(w[11], hidden, w[10]);
    }
    const std::size_t n = params.size();
    return torch::addmm(params[n - 1], norm(h, params[n - 4], params[n - 3]), params[n - 2]);
  }
};

TorchModel::TorchModel(const GptData& data, const GptShape& shape) : impl_(new Impl) {
  impl_->kind = Impl::Kind::gpt;
  impl_->gpt_shape = shape;
  // The same float32 parameters as remat's: computed by gpt::Model (in double, rounded once), copied.
  auto model = gpt::Model<float>::deterministic(
      gpt::Config{shape.vocabulary, shape.width, shape.heads, shape.seq_len, shape.blocks, 0.0});
  for (remat::Parameter<float>* p : model.parameters()) impl_->params.push_back(to_tensor(p->value(), true));
  impl_->ids = torch::tensor(std::vector<int64_t>(data.ids.begin(), data.ids.end()), torch::kInt64);
  impl_->labels = torch::tensor(std::vector<int64_t>(data.targets.begin(), data.targets.end()), torch::kInt64);
  impl_->positions = torch::arange(shape.batch * shape.seq_len, torch::kInt64).remainder(shape.seq_len);
  impl_->future = torch::ones({shape.seq_len, shape.seq_len}, torch::kBool).triu(1);
}

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
  impl_->kind = Impl::Kind::blocks;
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
  clear(impl_->params);
  const torch::Tensor logits = impl_->kind == Impl::Kind::gpt   ? impl_->forward_gpt()
                               : impl_->kind == Impl::Kind::mlp ? impl_->forward_mlp()
                                                                : impl_->forward_blocks();
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

std::vector<Matrix<float>> TorchModel::parameter_gradients() const {
  std::vector<Matrix<float>> g;
  for (const torch::Tensor& p : impl_->params) g.push_back(to_matrix(p.grad()));
  return g;
}

void torch_set_threads(int threads) {
  torch::set_num_threads(threads);
}

}  // namespace bench
