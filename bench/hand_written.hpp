// The zero-overhead floor: the same workloads written by hand with Eigen (GEMM through OpenBLAS when
// REMAT_USE_BLAS is on), forward and backprop into preallocated buffers, no tape. With segments > 1
// the chain keeps only segment boundaries and recomputes each checkpointed segment right before its
// backward (the floor for checkpoint_sequential).
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "workloads.hpp"

namespace bench {

inline std::size_t bytes(const Matrix<float>& m) { return static_cast<std::size_t>(m.size()) * sizeof(float); }

/// Gradients of every weight, in the layout of Data::affine and Data::norm.
struct Gradients {
  std::vector<Affine> affine, norm;
};

/// Softmax cross-entropy (mean over rows) of `logits`; writes softmax into `probs`; returns the loss.
inline float cross_entropy_forward(const Matrix<float>& logits, const std::vector<int>& labels, Matrix<float>& probs) {
  double total = 0;
  for (Index i = 0; i < logits.rows(); ++i) {
    const float m = logits.row(i).maxCoeff();
    probs.row(i).array() = (logits.row(i).array() - m).exp();
    const float z = probs.row(i).sum();
    probs.row(i) /= z;
    total += m + std::log(z) - logits(i, labels[static_cast<std::size_t>(i)]);
  }
  return static_cast<float>(total / static_cast<double>(logits.rows()));
}

/// d loss / d logits = (softmax − onehot) / rows, into `g`.
inline void cross_entropy_backward(const Matrix<float>& probs, const std::vector<int>& labels, Matrix<float>& g) {
  const float scale = 1.0f / static_cast<float>(probs.rows());
  g = scale * probs;
  for (Index i = 0; i < probs.rows(); ++i) g(i, labels[static_cast<std::size_t>(i)]) -= scale;
}

/// W0, W1, W1-small: layer l computes tanh(in·W_l + b_l); the head is linear + cross-entropy.
class HandMlp {
 public:
  struct Buffers {
    Matrix<float> out;  // tanh output, the only residual of a layer
    std::size_t residual_bytes() const { return bytes(out); }
    std::size_t total_bytes() const { return bytes(out); }
  };

  HandMlp(const Data& data, const MlpShape& s) : data_(data), s_(s) {
    for (const Affine& a : data.affine)
      grads_.affine.push_back({Matrix<float>(a.weight.rows(), a.weight.cols()), Matrix<float>(1, a.bias.cols())});
    gz_.resize(s.batch, s.hidden);
    logits_.resize(s.batch, s.output);
    probs_.resize(s.batch, s.output);
    glogits_.resize(s.batch, s.output);
  }
  Index layers() const { return s_.layers; }
  Index width() const { return s_.hidden; }
  Buffers make_buffers() const { return {Matrix<float>(s_.batch, s_.hidden)}; }

  void forward(Index l, const Matrix<float>& in, Buffers& b) const {
    const Affine& a = data_.affine[static_cast<std::size_t>(l)];
    b.out.noalias() = in * a.weight;
    b.out.rowwise() += a.bias.row(0);  // (a broadcast inside tanh() would not vectorize)
    b.out.array() = b.out.array().tanh();
  }
  void backward(Index l, const Matrix<float>& in, const Buffers& b, const Matrix<float>& gout, Matrix<float>* gin) {
    const Affine& a = data_.affine[static_cast<std::size_t>(l)];
    Affine& g = grads_.affine[static_cast<std::size_t>(l)];
    gz_.array() = gout.array() * (1.0f - b.out.array().square());
    g.weight.noalias() = in.transpose() * gz_;
    g.bias = gz_.colwise().sum();
    if (gin) gin->noalias() = gz_ * a.weight.transpose();
  }
  float head_forward(const Matrix<float>& in) {
    const Affine& a = data_.affine.back();
    logits_.noalias() = in * a.weight;
    logits_.rowwise() += a.bias.row(0);
    return cross_entropy_forward(logits_, data_.labels, probs_);
  }
  void head_backward(const Matrix<float>& in, Matrix<float>& gin) {
    const Affine& a = data_.affine.back();
    Affine& g = grads_.affine.back();
    cross_entropy_backward(probs_, data_.labels, glogits_);
    g.weight.noalias() = in.transpose() * glogits_;
    g.bias = glogits_.colwise().sum();
    gin.noalias() = glogits_ * a.weight.transpose();
  }
  std::size_t head_residual_bytes() const { return bytes(probs_); }
  std::size_t other_bytes() const {
    std::size_t n = bytes(gz_) + bytes(logits_) + bytes(probs_) + bytes(glogits_);
    for (const Affine& a : grads_.affine) n += bytes(a.weight) + bytes(a.bias);
    return n;
  }
  const Gradients& gradients() const { return grads_; }

 private:
  const Data& data_;
  MlpShape s_;
  Gradients grads_;
  Matrix<float> gz_, logits_, probs_, glogits_;
};

/// W2: block b computes out = in + Linear2(gelu(Linear1(layer_norm(in)))); the head is layer_norm,
/// linear and cross-entropy.
class HandBlocks {
 public:
  static constexpr float k = 0.7978845608028654f;  // √(2/π)
  static constexpr float c = 0.044715f;

  struct Buffers {
    Matrix<float> normed, stats, inner, activated, out;  // stats: per row (mean, 1/σ)
    std::size_t residual_bytes() const { return bytes(normed) + bytes(stats) + bytes(inner) + bytes(activated) + bytes(out); }
    std::size_t total_bytes() const { return residual_bytes(); }
  };

  HandBlocks(const Data& data, const BlockShape& s) : data_(data), s_(s) {
    for (const Affine& a : data.affine)
      grads_.affine.push_back({Matrix<float>(a.weight.rows(), a.weight.cols()), Matrix<float>(1, a.bias.cols())});
    for (const Affine& a : data.norm) grads_.norm.push_back({Matrix<float>(1, a.weight.cols()), Matrix<float>(1, a.bias.cols())});
    ginner_.resize(s.batch, s.inner);
    gnormed_.resize(s.batch, s.model);
    head_ = make_buffers();
    logits_.resize(s.batch, s.classes);
    probs_.resize(s.batch, s.classes);
    glogits_.resize(s.batch, s.classes);
  }
  Index layers() const { return s_.blocks; }
  Index width() const { return s_.model; }
  Buffers make_buffers() const {
    return {Matrix<float>(s_.batch, s_.model), Matrix<float>(s_.batch, 2), Matrix<float>(s_.batch, s_.inner),
            Matrix<float>(s_.batch, s_.inner), Matrix<float>(s_.batch, s_.model)};
  }

  void forward(Index l, const Matrix<float>& in, Buffers& b) const {
    const auto i = static_cast<std::size_t>(l);
    norm_forward(data_.norm[i], in, b);
    const Affine& a1 = data_.affine[2 * i];
    const Affine& a2 = data_.affine[2 * i + 1];
    b.inner.noalias() = b.normed * a1.weight;
    b.inner.rowwise() += a1.bias.row(0);
    const auto u = b.inner.array();
    b.activated.array() = 0.5f * u * (1.0f + (k * (u + c * u.cube())).tanh());
    b.out.noalias() = b.activated * a2.weight;
    b.out.rowwise() += a2.bias.row(0);
    b.out += in;
  }
  void backward(Index l, const Matrix<float>& in, const Buffers& b, const Matrix<float>& gout, Matrix<float>* gin) {
    const auto i = static_cast<std::size_t>(l);
    const Affine& a1 = data_.affine[2 * i];
    const Affine& a2 = data_.affine[2 * i + 1];
    Affine& g1 = grads_.affine[2 * i];
    Affine& g2 = grads_.affine[2 * i + 1];
    g2.weight.noalias() = b.activated.transpose() * gout;
    g2.bias = gout.colwise().sum();
    ginner_.noalias() = gout * a2.weight.transpose();
    const auto u = b.inner.array();
    const auto t = (k * (u + c * u.cube())).tanh();
    ginner_.array() *= 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t.square()) * k * (1.0f + 3 * c * u.square());
    g1.weight.noalias() = b.normed.transpose() * ginner_;
    g1.bias = ginner_.colwise().sum();
    gnormed_.noalias() = ginner_ * a1.weight.transpose();
    norm_backward(data_.norm[i], grads_.norm[i], in, b, gnormed_, gin);
    if (gin) *gin += gout;
  }
  float head_forward(const Matrix<float>& in) {
    norm_forward(data_.norm.back(), in, head_);
    const Affine& a = data_.affine.back();
    logits_.noalias() = head_.normed * a.weight;
    logits_.rowwise() += a.bias.row(0);
    return cross_entropy_forward(logits_, data_.labels, probs_);
  }
  void head_backward(const Matrix<float>& in, Matrix<float>& gin) {
    const Affine& a = data_.affine.back();
    Affine& g = grads_.affine.back();
    cross_entropy_backward(probs_, data_.labels, glogits_);
    g.weight.noalias() = head_.normed.transpose() * glogits_;
    g.bias = glogits_.colwise().sum();
    gnormed_.noalias() = glogits_ * a.weight.transpose();
    norm_backward(data_.norm.back(), grads_.norm.back(), in, head_, gnormed_, &gin);
  }
  std::size_t head_residual_bytes() const { return bytes(head_.normed) + bytes(head_.stats) + bytes(probs_); }
  std::size_t other_bytes() const {
    std::size_t n = bytes(ginner_) + bytes(gnormed_) + head_.total_bytes() + bytes(logits_) + bytes(probs_) + bytes(glogits_);
    for (const Affine& a : grads_.affine) n += bytes(a.weight) + bytes(a.bias);
    for (const Affine& a : grads_.norm) n += bytes(a.weight) + bytes(a.bias);
    return n;
  }
  const Gradients& gradients() const { return grads_; }

 private:
  static void norm_forward(const Affine& p, const Matrix<float>& x, Buffers& b) {
    const auto gain = p.weight.row(0).array();
    const auto bias = p.bias.row(0).array();
    for (Index r = 0; r < x.rows(); ++r) {
      const float mu = x.row(r).mean();
      const float var = (x.row(r).array() - mu).square().mean();
      const float rstd = 1.0f / std::sqrt(var + 1e-5f);
      b.stats(r, 0) = mu;
      b.stats(r, 1) = rstd;
      b.normed.row(r).array() = (x.row(r).array() - mu) * rstd * gain + bias;
    }
  }
  // gin = layer-norm input gradient (written, not added); grads of gain and bias written.
  static void norm_backward(const Affine& p, Affine& gp, const Matrix<float>& x, const Buffers& b,
                            const Matrix<float>& g, Matrix<float>* gin) {
    const auto gain = p.weight.row(0).array();
    const Index n = x.cols();
    gp.weight.setZero();
    gp.bias = g.colwise().sum();
    Eigen::Array<float, 1, Eigen::Dynamic> xhat(n), dxhat(n);
    for (Index r = 0; r < x.rows(); ++r) {
      xhat = (x.row(r).array() - b.stats(r, 0)) * b.stats(r, 1);
      gp.weight.row(0).array() += g.row(r).array() * xhat;
      if (!gin) continue;
      dxhat = g.row(r).array() * gain;
      const float mean_d = dxhat.mean();
      const float mean_dx = (dxhat * xhat).mean();
      gin->row(r).array() = b.stats(r, 1) * (dxhat - mean_d - xhat * mean_dx);
    }
  }

  const Data& data_;
  BlockShape s_;
  Gradients grads_;
  Matrix<float> ginner_, gnormed_;
  Buffers head_;
  Matrix<float> logits_, probs_, glogits_;
};

/// Runs a Model's chain of layers with `segments` segments: 1 = plain backprop; otherwise every
/// segment but the last keeps only its input and is recomputed right before its backward. Layers of
/// checkpointed segments share one segment's worth of buffers.
template <class Model>
class HandChain {
 public:
  template <class Shape>
  HandChain(const Data& data, const Shape& shape, int segments)
      : data_(data), model_(data, shape), layers_(model_.layers()), segments_(segments) {
    size_ = layers_ / segments_;
    last_begin_ = (segments_ - 1) * size_;
    const Index scratch = segments_ > 1 ? size_ : 0;
    for (Index i = 0; i < scratch + layers_ - last_begin_; ++i) slots_.push_back(model_.make_buffers());
    for (int s = 0; s + 1 < segments_; ++s) boundaries_.emplace_back(data.x.rows(), model_.width());
    for (auto& g : grad_) g.resize(data.x.rows(), model_.width());
  }

  float step() {
    const Matrix<float>* in = &data_.x;
    for (int s = 0; s + 1 < segments_; ++s) {
      in = &forward_range(s * size_, (s + 1) * size_, *in);
      boundaries_[static_cast<std::size_t>(s)] = *in;
      in = &boundaries_[static_cast<std::size_t>(s)];
    }
    in = &forward_range(last_begin_, layers_, *in);
    const float loss = model_.head_forward(*in);
    model_.head_backward(*in, grad_[0]);
    int cur = 0;
    backward_range(last_begin_, layers_, cur);
    for (int s = segments_ - 2; s >= 0; --s) {
      forward_range(s * size_, (s + 1) * size_, input_of(s * size_));
      backward_range(s * size_, (s + 1) * size_, cur);
    }
    return loss;
  }

  const Gradients& gradients() const { return model_.gradients(); }
  /// Bytes that backward reads after the forward pass: input, boundaries, the last segment's residuals, head.
  std::size_t saved_bytes() const {
    std::size_t n = bytes(data_.x) + model_.head_residual_bytes();
    for (const auto& b : boundaries_) n += bytes(b);
    for (Index l = last_begin_; l < layers_; ++l) n += slot(l).residual_bytes();
    return n;
  }
  /// Every buffer of the step (all preallocated, so this is the peak), the input included.
  std::size_t peak_bytes() const {
    std::size_t n = bytes(data_.x) + model_.other_bytes() + bytes(grad_[0]) + bytes(grad_[1]);
    for (const auto& b : boundaries_) n += bytes(b);
    for (const auto& s : slots_) n += s.total_bytes();
    return n;
  }

 private:
  using Buffers = typename Model::Buffers;
  Buffers& slot(Index l) { return slots_[static_cast<std::size_t>(slot_index(l))]; }
  const Buffers& slot(Index l) const { return slots_[static_cast<std::size_t>(slot_index(l))]; }
  Index slot_index(Index l) const { return l < last_begin_ ? l % size_ : (segments_ > 1 ? size_ : 0) + l - last_begin_; }
  const Matrix<float>& input_of(Index l) const {
    if (l == 0) return data_.x;
    if (l % size_ == 0 && l <= last_begin_) return boundaries_[static_cast<std::size_t>(l / size_ - 1)];
    return slot(l - 1).out;
  }
  const Matrix<float>& forward_range(Index begin, Index end, const Matrix<float>& in) {
    const Matrix<float>* x = &in;
    for (Index l = begin; l < end; ++l) {
      model_.forward(l, *x, slot(l));
      x = &slot(l).out;
    }
    return *x;
  }
  void backward_range(Index begin, Index end, int& cur) {
    for (Index l = end - 1; l >= begin; --l) {
      model_.backward(l, input_of(l), slot(l), grad_[cur], l > 0 ? &grad_[1 - cur] : nullptr);
      cur = 1 - cur;
    }
  }

  const Data& data_;
  Model model_;
  Index layers_;
  int segments_;
  Index size_ = 0, last_begin_ = 0;
  std::vector<Buffers> slots_;
  std::vector<Matrix<float>> boundaries_;
  Matrix<float> grad_[2];
};

}  // namespace bench
