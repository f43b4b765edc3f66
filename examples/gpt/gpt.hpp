// A pre-layer-norm GPT (GPT-2's block structure) written from remat's public ops: the model of
// docs/gpt.md, shared by examples/gpt, bench workload W3 and the tests (tests/gpt).
//
//   gpt::Config config{.vocabulary = 256, .width = 128, .heads = 4, .seq_len = 64, .blocks = 4};
//   nn::Generator generator(seed);
//   gpt::Model<float> model = gpt::Model<float>::random(config, generator);
//   remat::Tape<float> tape;
//   remat::Var<float> loss = model.loss(tape, ids, targets, {gpt::Recompute::attention, gpt::Attention::unfused});
//   tape.backward(loss);   // gradients accumulate in model.parameters()
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <remat/nn/linear.hpp>
#include <remat/remat.hpp>

namespace gpt {

using remat::Index;
using remat::Matrix;
using remat::Parameter;
using remat::Var;

/// The model's sizes. width must be divisible by heads.
struct Config {
  Index vocabulary = 256;  ///< V (bytes)
  Index width = 128;       ///< H
  Index heads = 4;         ///< d = H / heads per head
  Index seq_len = 64;      ///< S, the context length
  Index blocks = 4;        ///< L
  double dropout = 0;      ///< p, on attention probabilities and both residual branches (training mode only)
};

/// Which activations the backward pass recomputes (docs/gpt.md §Checkpointing).
enum class Recompute {
  none,           ///< every residual saved
  block,          ///< each block a nothing_saveable region: only block inputs are kept
  attention,      ///< selective (Korthikanti et al. 2023): the attention core (scores … values) recomputed
  dots_no_batch,  ///< each block a dots_with_no_batch_dims_saveable region (JAX's policy)
  sqrt,           ///< checkpoint_sequential over round(√L) segments of blocks (Chen et al. 2016)
};

/// How attention is computed: softmax(attention_scores) then attention_values, or the fused op.
enum class Attention { unfused, fused };

struct Options {
  Options(Recompute r = Recompute::none, Attention a = Attention::unfused,  // NOLINT: {r, a} converts, as it did
          std::function<remat::policies::Decision(const remat::OpInfo&)> policy = {})
      : recompute(r), attention(a), block_policy(std::move(policy)) {}
  Recompute recompute;
  Attention attention;
  /// With Recompute::none: when set, each block is a checkpoint region under this policy (a policy that stores
  /// residuals compressed, docs/compression.md, as bench/compression_error.cpp gives).
  std::function<remat::policies::Decision(const remat::OpInfo&)> block_policy;
};

inline const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::block:
      return "block";
    case Recompute::attention:
      return "attention";
    case Recompute::dots_no_batch:
      return "dots_no_batch";
    case Recompute::sqrt:
      return "sqrt";
  }
  return "?";
}

/// The parameters of one block, in the contract's order.
template <class T>
struct Block {
  Parameter<T> ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias, ln2_gain, ln2_bias, fc_weight, fc_bias,
      fc_proj_weight, fc_proj_bias;
};

inline const char* const block_parameter_names[] = {"ln1_gain",    "ln1_bias",  "qkv_weight",     "qkv_bias",
                                                    "proj_weight", "proj_bias", "ln2_gain",       "ln2_bias",
                                                    "fc_weight",   "fc_bias",   "fc_proj_weight", "fc_proj_bias"};

template <class T>
class Model {
 public:
  /// Zero-initialised parameters of the contract's shapes. Throws remat::shape_error for sizes below 1
  /// or a width not divisible by heads, remat::domain_error for dropout outside [0, 1).
  explicit Model(const Config& config) : config_(config) {
    const Index V = config.vocabulary, H = config.width, S = config.seq_len;
    if (V < 1 || H < 1 || config.heads < 1 || S < 1 || config.blocks < 1 || H % config.heads != 0)
      throw remat::shape_error(
          "gpt::Model: need vocabulary, width, heads, seq_len, blocks >= 1 and width divisible "
          "by heads; got V = " +
          std::to_string(V) + ", H = " + std::to_string(H) + ", heads = " + std::to_string(config.heads) +
          ", S = " + std::to_string(S) + ", L = " + std::to_string(config.blocks));
    if (!(config.dropout >= 0 && config.dropout < 1))
      throw remat::domain_error("gpt::Model: dropout must be in [0, 1), got " + std::to_string(config.dropout));
    token_embedding_ = zeros(V, H);
    position_embedding_ = zeros(S, H);
    blocks_.resize(static_cast<std::size_t>(config.blocks));
    for (Block<T>& b : blocks_) {
      b.ln1_gain = zeros(1, H), b.ln1_bias = zeros(1, H);
      b.qkv_weight = zeros(H, 3 * H), b.qkv_bias = zeros(1, 3 * H);
      b.proj_weight = zeros(H, H), b.proj_bias = zeros(1, H);
      b.ln2_gain = zeros(1, H), b.ln2_bias = zeros(1, H);
      b.fc_weight = zeros(H, 4 * H), b.fc_bias = zeros(1, 4 * H);
      b.fc_proj_weight = zeros(4 * H, H), b.fc_proj_bias = zeros(1, H);
    }
    lnf_gain_ = zeros(1, H), lnf_bias_ = zeros(1, H);
    head_weight_ = zeros(H, V), head_bias_ = zeros(1, V);
  }

  /// GPT-2's initialisation (Radford et al. 2019): weights and embeddings N(0, 0.02²), the two
  /// projections into the residual stream N(0, (0.02/√(2L))²), biases 0, gains 1. Draws in parameter order.
  static Model random(const Config& config, remat::nn::Generator& generator) {
    Model m(config);
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.blocks));
    const auto names = m.parameter_names();
    const auto params = m.parameters();
    for (std::size_t n = 0; n < params.size(); ++n) {
      const std::string& name = names[n];
      Matrix<T>& value = params[n]->mutable_value();
      if (ends_with(name, "_gain"))
        value.setOnes();
      else if (ends_with(name, "_bias"))
        value.setZero();
      else
        for (Index i = 0; i < value.size(); ++i)
          value.data()[i] = static_cast<T>(normal(generator) * (ends_with(name, "proj_weight") ? residual_std : 0.02));
    }
    return m;
  }

  /// The deterministic parameters of docs/gpt.md (tests, benchmarks): element (i, j) of parameter n of
  /// shape [r,c] is from u = sin(0.731·(i·c + j) + 1.37·n + 0.25): gains 1 + 0.1u, biases 0.05u, others 0.2u.
  static Model deterministic(const Config& config) {
    Model m(config);
    const auto names = m.parameter_names();
    const auto params = m.parameters();
    for (std::size_t n = 0; n < params.size(); ++n) {
      Matrix<T>& value = params[n]->mutable_value();
      for (Index k = 0; k < value.size(); ++k) {
        const double u = std::sin(0.731 * static_cast<double>(k) + 1.37 * static_cast<double>(n) + 0.25);
        const double v = ends_with(names[n], "_gain") ? 1 + 0.1 * u : ends_with(names[n], "_bias") ? 0.05 * u : 0.2 * u;
        value.data()[k] = static_cast<T>(v);
      }
    }
    return m;
  }

  const Config& config() const { return config_; }

  /// Every parameter, in the contract's order (docs/gpt.md).
  std::vector<Parameter<T>*> parameters() {
    std::vector<Parameter<T>*> p = {&token_embedding_, &position_embedding_};
    for (Block<T>& b : blocks_)
      for (Parameter<T>* q : {&b.ln1_gain, &b.ln1_bias, &b.qkv_weight, &b.qkv_bias, &b.proj_weight, &b.proj_bias,
                              &b.ln2_gain, &b.ln2_bias, &b.fc_weight, &b.fc_bias, &b.fc_proj_weight, &b.fc_proj_bias})
        p.push_back(q);
    for (Parameter<T>* q : {&lnf_gain_, &lnf_bias_, &head_weight_, &head_bias_}) p.push_back(q);
    return p;
  }
  /// Names in the same order ("block0.qkv_weight", ...).
  std::vector<std::string> parameter_names() const {
    std::vector<std::string> n = {"token_embedding", "position_embedding"};
    for (std::size_t l = 0; l < blocks_.size(); ++l)
      for (const char* name : block_parameter_names) n.push_back("block" + std::to_string(l) + "." + name);
    for (const char* name : {"lnf_gain", "lnf_bias", "head_weight", "head_bias"}) n.push_back(name);
    return n;
  }
  /// Parameters that AdamW should decay (matrices of the blocks and the head; not embeddings, biases, gains).
  std::vector<Parameter<T>*> decayed_parameters() { return select(true); }
  std::vector<Parameter<T>*> undecayed_parameters() { return select(false); }

  /// Logits [B·S, V] of token ids (B·S of them, B whole sequences of seq_len, each in [0, V)) recorded on
  /// `tape`. Throws remat::shape_error if ids.size() is not a positive multiple of seq_len,
  /// remat::index_error for an id outside [0, V) (from remat::embedding), remat::domain_error for fused
  /// attention with dropout in training mode.
  Var<T> logits(remat::Tape<T>& tape, const std::vector<int>& ids, const Options& options = {}) {
    return logits_with(tape, ids, options.attention,
                       [&](std::vector<BlockVars>& w, Var<T> x) { return run_blocks(w, std::move(x), options); });
  }

  /// The logits with the L blocks recorded by the caller's `run_blocks(blocks, x)`: `blocks` is a sequence
  /// of L callables Var<T> [B·S, H] → Var<T> [B·S, H] (size() and operator[], the sequence
  /// checkpoint_sequential, run_schedule and checkpoint_sequential_auto take; each records one block, its
  /// attention as `attention` says, nothing checkpointed inside), `x` the embeddings; it returns the
  /// last block's output. Throws as logits(), and whatever run_blocks throws. E.g. a chain planned for a
  /// memory budget (docs/schedules.md):
  ///   model.logits(tape, ids, gpt::Attention::unfused, [&](const auto& blocks, remat::Var<float> x) {
  ///     return remat::checkpoint_sequential_auto(blocks, x, budget_bytes); });
  template <class RunBlocks>
  Var<T> logits(remat::Tape<T>& tape, const std::vector<int>& ids, Attention attention, RunBlocks&& run) {
    const Options inner{Recompute::none, attention};
    return logits_with(tape, ids, attention, [&](std::vector<BlockVars>& w, Var<T> x) {
      const BlockSequence blocks{this, w.data(), w.size(), &inner};
      return run(static_cast<const BlockSequence&>(blocks), std::move(x));
    });
  }

  /// Mean cross-entropy (nats per token) of predicting targets[r] at row r. Throws as logits(), and
  /// remat::shape_error / index_error for targets of the wrong count or range.
  Var<T> loss(remat::Tape<T>& tape, const std::vector<int>& ids, const std::vector<int>& targets,
              const Options& options = {}) {
    return remat::cross_entropy(logits(tape, ids, options), targets);
  }
  /// The same loss with the blocks recorded by `run_blocks` (the logits overload above).
  template <class RunBlocks>
  Var<T> loss(remat::Tape<T>& tape, const std::vector<int>& ids, const std::vector<int>& targets, Attention attention,
              RunBlocks&& run_blocks) {
    return remat::cross_entropy(logits(tape, ids, attention, std::forward<RunBlocks>(run_blocks)), targets);
  }

 private:
  static Parameter<T> zeros(Index rows, Index cols) { return Parameter<T>(Matrix<T>::Zero(rows, cols)); }
  static bool ends_with(const std::string& s, const char* suffix) {
    const std::string t(suffix);
    return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
  }
  /// N(0, 1) by Box–Muller from two uniforms.
  static double normal(remat::nn::Generator& g) {
    const double u1 = 1.0 - g.uniform(), u2 = g.uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  std::vector<Parameter<T>*> select(bool decayed) {
    std::vector<Parameter<T>*> out;
    const auto names = parameter_names();
    const auto params = parameters();
    for (std::size_t n = 0; n < params.size(); ++n) {
      const bool matrix = ends_with(names[n], "_weight");
      if (matrix == decayed) out.push_back(params[n]);
    }
    return out;
  }

  /// Variables of block l's parameters on `tape`.
  struct BlockVars {
    Var<T> ln1_gain, ln1_bias, qkv_weight, qkv_bias, proj_weight, proj_bias, ln2_gain, ln2_bias, fc_weight, fc_bias,
        fc_proj_weight, fc_proj_bias;
  };
  BlockVars vars(remat::Tape<T>& tape, Block<T>& b) {
    return {tape.variable(b.ln1_gain), tape.variable(b.ln1_bias),       tape.variable(b.qkv_weight),
            tape.variable(b.qkv_bias), tape.variable(b.proj_weight),    tape.variable(b.proj_bias),
            tape.variable(b.ln2_gain), tape.variable(b.ln2_bias),       tape.variable(b.fc_weight),
            tape.variable(b.fc_bias),  tape.variable(b.fc_proj_weight), tape.variable(b.fc_proj_bias)};
  }

  /// dropout(x, p) when p > 0, x itself otherwise (no node, no copy).
  Var<T> maybe_dropout(const Var<T>& x) const { return config_.dropout > 0 ? remat::dropout(x, config_.dropout) : x; }

  /// The attention core: causal softmax attention of q, k, v ([B·S, H] each) → [B·S, H].
  Var<T> attention_core(const Var<T>& q, const Var<T>& k, const Var<T>& v, Attention attention) const {
    const Index heads = config_.heads, S = config_.seq_len;
    if (attention == Attention::fused) return remat::scaled_dot_product_attention(q, k, v, heads, S, true);
    Var<T> p = remat::softmax(remat::attention_scores(q, k, heads, S, true));
    return remat::attention_values(maybe_dropout(p), v, heads, S);
  }

  Var<T> block(const BlockVars& w, const Var<T>& x, const Options& options) const {
    const Index H = config_.width;
    Var<T> a = remat::layer_norm(x, w.ln1_gain, w.ln1_bias, 1e-5);
    Var<T> qkv = remat::linear(a, w.qkv_weight, w.qkv_bias);
    Var<T> q = remat::slice_cols(qkv, 0, H), k = remat::slice_cols(qkv, H, H), v = remat::slice_cols(qkv, 2 * H, H);
    qkv = Var<T>();  // no backward reads it: freed once sliced
    Var<T> y;
    if (options.recompute == Recompute::attention) {
      const Attention kind = options.attention;
      y = remat::checkpoint([this, kind](const Var<T>& q_in, const Var<T>& k_in,
                                         const Var<T>& v_in) { return attention_core(q_in, k_in, v_in, kind); },
                            remat::policies::nothing_saveable)(q, k, v);
    } else {
      y = attention_core(q, k, v, options.attention);
    }
    Var<T> x1 = x + maybe_dropout(remat::linear(y, w.proj_weight, w.proj_bias));
    Var<T> m = remat::layer_norm(x1, w.ln2_gain, w.ln2_bias, 1e-5);
    Var<T> h = remat::gelu(remat::linear(m, w.fc_weight, w.fc_bias));
    return x1 + maybe_dropout(remat::linear(h, w.fc_proj_weight, w.fc_proj_bias));
  }

  /// The blocks as checkpoint_sequential's sequence of layers: callables made on demand, so recording
  /// allocates no std::function (a steady training loop allocates nothing, examples/gpt).
  struct BlockSequence {
    const Model* model;
    const BlockVars* w;
    std::size_t count;
    const Options* options;
    std::size_t size() const { return count; }
    auto operator[](std::size_t l) const {
      return [this, l](Var<T> in) { return model->block(w[l], std::move(in), *options); };
    }
  };

  /// Checks the ids, records the embeddings, `run(block variables, x)` for the blocks, and the head.
  template <class Run>
  Var<T> logits_with(remat::Tape<T>& tape, const std::vector<int>& ids, Attention attention, Run&& run) {
    const Index S = config_.seq_len;
    if (ids.empty() || static_cast<Index>(ids.size()) % S != 0)
      throw remat::shape_error("gpt::Model: " + std::to_string(ids.size()) +
                               " ids are not a whole number of sequences of seq_len = " + std::to_string(S));
    if (attention == Attention::fused && config_.dropout > 0 && tape.training())
      throw remat::domain_error("gpt::Model: fused attention has no dropout; use unfused attention with dropout " +
                                std::to_string(config_.dropout));
    positions_.resize(ids.size());
    for (std::size_t r = 0; r < ids.size(); ++r) positions_[r] = static_cast<int>(static_cast<Index>(r) % S);
    Var<T> x = remat::embedding(tape.variable(token_embedding_), ids) +
               remat::embedding(tape.variable(position_embedding_), positions_);
    std::vector<BlockVars>& w = block_vars_;  // scratch kept for its capacity; emptied before returning
    w.clear();
    for (Block<T>& b : blocks_) w.push_back(vars(tape, b));
    try {
      x = run(w, std::move(x));
    } catch (...) {
      w.clear();
      throw;
    }
    w.clear();
    Var<T> normed = remat::layer_norm(x, tape.variable(lnf_gain_), tape.variable(lnf_bias_), 1e-5);
    return remat::linear(normed, tape.variable(head_weight_), tape.variable(head_bias_));
  }

  Var<T> run_blocks(const std::vector<BlockVars>& w, Var<T> x, const Options& options) const {
    Options inner = options;
    switch (options.recompute) {
      case Recompute::none:
      case Recompute::attention:
        if (options.recompute == Recompute::none && options.block_policy) {
          for (const BlockVars& bw : w)
            x = remat::checkpoint([&](const Var<T>& in) { return block(bw, in, options); }, options.block_policy)(x);
          return x;
        }
        for (const BlockVars& bw : w) x = block(bw, x, options);
        return x;
      case Recompute::block:
      case Recompute::dots_no_batch:
        inner.recompute = Recompute::none;
        for (const BlockVars& bw : w) {
          const auto f = [&](const Var<T>& in) { return block(bw, in, inner); };
          x = options.recompute == Recompute::block
                  ? remat::checkpoint(f, remat::policies::nothing_saveable)(x)
                  : remat::checkpoint(f, remat::policies::dots_with_no_batch_dims_saveable)(x);
        }
        return x;
      case Recompute::sqrt: {
        inner.recompute = Recompute::none;
        const BlockSequence layers{this, w.data(), w.size(), &inner};
        const int segments = std::max(1, static_cast<int>(std::lround(std::sqrt(static_cast<double>(w.size())))));
        return remat::checkpoint_sequential(layers, segments, x);
      }
    }
    return x;
  }

  Config config_;
  Parameter<T> token_embedding_, position_embedding_;
  std::vector<Block<T>> blocks_;
  Parameter<T> lnf_gain_, lnf_bias_, head_weight_, head_bias_;
  std::vector<int> positions_;         // scratch, kept for its capacity
  std::vector<BlockVars> block_vars_;  // scratch of run_blocks, kept for its capacity
};

}  // namespace gpt
