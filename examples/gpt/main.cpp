// Trains the byte-level GPT of docs/gpt.md (gpt.hpp) on Debian's fortunes corpus with remat, optionally
// with gradient checkpointing, and samples text from it. See docs/gpt.md §Training for the flags, the
// measured default run and how to reproduce it.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <remat/io/safetensors.hpp>
#include <remat/nn/adamw.hpp>
#include <remat/nn/warmup_cosine_schedule.hpp>
#include <remat/remat.hpp>

#include "../common/data_parallel.hpp"
#include "../common/report.hpp"
#include "../common/settings.hpp"
#include "../common/state_file.hpp"
#include "../common/threads.hpp"
#include "corpus.hpp"
#include "gpt.hpp"
#include "training_step.hpp"

namespace {

using examples::check_setting;
using examples::cpu_seconds;
using examples::dropout_seed;
using examples::finite_number;
using examples::json_string;
using examples::Limits;
using examples::megabytes;
using examples::number;
using examples::positive_limits;
using examples::Ranks;
using examples::setting_text;

using remat::Var;

// --steps may be 0 (evaluate only), a state file's steps may not: a run that trains nothing writes none.
constexpr Limits<int> layers_limits{1, 1024}, batch_limits{1, 1 << 20}, steps_limits{1, 1 << 30},
    warmup_limits{0, 1 << 30};
constexpr Limits<int> size_limits{1, 1 << 16};  ///< --width, --heads and --seq-len
constexpr Limits<double> dropout_limits{0.0, 0.99};

/// The command line.
struct Options {
  std::string data = "/usr/share/games/fortunes";
  int layers = 4, width = 128, heads = 4, seq_len = 64, batch = 16;
  int steps = 1500, warmup = 100;
  double lr = 3e-3;
  double dropout = 0;
  std::uint64_t seed = 42;
  bool flush_denormal = true;
  int threads = 0;  // 0: examples::default_threads
  std::string checkpoint = "none", attention = "unfused";
  int log_every = 100, eval_every = 250, eval_batches = 16;
  int sample_bytes = 300;
  double temperature = 0.8;
  std::string prompt;
  bool json = false;
  std::string state;
  std::string save_weights, load_weights;  // safetensors files of the parameters alone
  int save_every = 100, stop_after = 0;
  bool distributed = false, timing = false;
  bool estimate = false;
};

constexpr double weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, clip_norm = 1.0, min_lr_fraction = 0.1;

gpt::Recompute recompute_of(const std::string& s) {
  for (auto r : {gpt::Recompute::none, gpt::Recompute::block, gpt::Recompute::attention, gpt::Recompute::dots_no_batch,
                 gpt::Recompute::sqrt})
    if (s == gpt::to_string(r)) return r;
  return gpt::Recompute::none;  // unreachable: CLI11 checked the name
}

gpt::Attention attention_of(const Options& o) {
  return o.attention == "fused" ? gpt::Attention::fused : gpt::Attention::unfused;
}

/// What a run continues from: the parameters (in the model), the optimizer, and the batch stream.
struct Training {
  std::unique_ptr<gpt::Model<float>> model;
  std::vector<remat::Parameter<float>*> optimized;  ///< the optimizer's order: decayed, then undecayed
  std::unique_ptr<remat::nn::AdamW<float>> optimizer;
  remat::nn::Generator batches;  ///< draws the windows of each batch; its state is saved
  double last_loss = NAN;        ///< the training loss of the last step taken (saved: a resumed run reports it)
};

gpt::Config config_of(const Options& o) {
  gpt::Config c;
  c.vocabulary = 256;
  c.width = o.width;
  c.heads = o.heads;
  c.seq_len = o.seq_len;
  c.blocks = o.layers;
  c.dropout = o.dropout;
  return c;
}

void make_optimizer(const Options& o, Training& t) {
  const auto decayed = t.model->decayed_parameters(), undecayed = t.model->undecayed_parameters();
  t.optimized = decayed;
  t.optimized.insert(t.optimized.end(), undecayed.begin(), undecayed.end());
  remat::nn::AdamW<float>::Options a;
  a.learning_rate = o.lr;
  a.beta1 = beta1;
  a.beta2 = beta2;
  a.weight_decay = weight_decay;
  t.optimizer = std::make_unique<remat::nn::AdamW<float>>(
      std::vector<remat::nn::ParameterGroup<float>>{{decayed}, {undecayed, 0.0}}, a);
}

// ---- training state file (examples/common/state_file.hpp) ----

constexpr examples::StateFormat state_format{{'R', 'E', 'M', 'A', 'T', 'G', 'P', 'T'}, 1, "remat GPT"};

std::vector<unsigned char> encode_state(const Options& o, const gpt::Corpus& corpus, const Training& t) {
  examples::StateWriter w;
  w.u64(o.seed);
  for (int v : {o.layers, o.width, o.heads, o.seq_len, o.batch, o.warmup}) w.u32(static_cast<std::uint32_t>(v));
  w.u64(static_cast<std::uint64_t>(o.steps));
  w.f64(o.dropout);
  w.f64(o.lr);
  w.u64(corpus.bytes.size());
  w.u32(corpus.crc32);
  w.u64(t.optimizer->step_count());
  w.u64(t.batches.state());
  w.f64(t.last_loss);
  w.u32(static_cast<std::uint32_t>(t.optimizer->size()));
  for (std::size_t k = 0; k < t.optimizer->size(); ++k) {
    w.matrix(t.optimizer->value(k));
    w.matrix(t.optimizer->first_moment(k));
    w.matrix(t.optimizer->second_moment(k));
  }
  return w.bytes();
}

/// Reads the settings at the head of a state file into `o`. The file's settings win; a flag given on the
/// command line that contradicts them is an error (the run could not continue identically), except
/// --steps, which extends or shortens the run (the cosine schedule is then recomputed for the new total).
void decode_settings(examples::StateReader& r, Options& o, const CLI::App& app) {
  auto take = [&](const char* flag, auto& option, auto file_value) {
    using V = std::decay_t<decltype(option)>;
    const V value = static_cast<V>(file_value);
    if (app.count(flag) && option != value)
      throw examples::state_error(r.path(), std::string("was written with ") + flag + " " + setting_text(value) +
                                                " but the command line gives " + setting_text(option) +
                                                "; drop the flag to continue with the file's setting");
    option = value;
  };
  take("--seed", o.seed, r.u64());
  for (auto [flag, option, limits] :
       {std::tuple{"--layers", &o.layers, layers_limits}, std::tuple{"--width", &o.width, size_limits},
        std::tuple{"--heads", &o.heads, size_limits}, std::tuple{"--seq-len", &o.seq_len, size_limits},
        std::tuple{"--batch", &o.batch, batch_limits}, std::tuple{"--warmup", &o.warmup, warmup_limits}}) {
    const std::uint32_t value = r.u32();
    check_setting(r, flag, value, limits);  // before the cast to int: 0xFFFFFFFF would become -1
    take(flag, *option, value);
  }
  const std::uint64_t steps = r.u64();
  check_setting(r, "--steps", steps, steps_limits);
  if (!app.count("--steps"))
    o.steps = static_cast<int>(steps);
  else if (static_cast<std::uint64_t>(o.steps) != steps)
    std::printf("note: the run was planned for %llu steps, now %d: the cosine schedule is recomputed for %d\n",
                static_cast<unsigned long long>(steps), o.steps, o.steps);
  const double dropout = r.f64(), lr = r.f64();
  check_setting(r, "--dropout", dropout, dropout_limits);
  check_setting(r, "--lr", lr, positive_limits);
  take("--dropout", o.dropout, dropout);
  take("--lr", o.lr, lr);
  // run()'s checks of the flags, made here of the file's settings so that the message names the file. Given on
  // the command line, --width and --heads equal the file's (take); --steps may differ and is run()'s to check.
  if (o.width % o.heads != 0)
    throw examples::state_error(r.path(), "was written with --width " + std::to_string(o.width) +
                                              ", which its --heads " + std::to_string(o.heads) + " does not divide");
  if (!app.count("--steps") && o.steps <= o.warmup)
    throw examples::state_error(r.path(), "was written with --steps " + std::to_string(o.steps) +
                                              ", which does not exceed its --warmup " + std::to_string(o.warmup));
}

/// Reads the rest of the file into `t` (made for the file's settings). Everything is read into
/// temporaries first: a file that fails half-way changes nothing.
void decode_training(examples::StateReader& r, const gpt::Corpus& corpus, Training& t) {
  const std::uint64_t bytes = r.u64();
  const std::uint32_t crc = r.u32();
  if (bytes != corpus.bytes.size() || crc != corpus.crc32)
    throw examples::state_error(r.path(), "was written training on a corpus of " + std::to_string(bytes) +
                                              " bytes (CRC-32 " + std::to_string(crc) + ") but " + corpus.directory +
                                              " has " + std::to_string(corpus.bytes.size()) + " bytes (CRC-32 " +
                                              std::to_string(corpus.crc32) + "); check --data");
  const std::uint64_t steps = r.u64(), batches = r.u64();
  const double last_loss = r.f64();
  const std::uint32_t count = r.u32();
  if (count != t.optimized.size())
    throw examples::state_error(r.path(), "has " + std::to_string(count) + " parameters but the model has " +
                                              std::to_string(t.optimized.size()));
  std::vector<remat::Matrix<float>> values(count), m(count), v(count);
  for (std::size_t k = 0; k < count; ++k) {
    const remat::Index rows = t.optimized[k]->rows(), cols = t.optimized[k]->cols();
    const std::string what = "parameter " + std::to_string(k);
    r.matrix(values[k], rows, cols, what);
    r.matrix(m[k], rows, cols, what + " first moment");
    r.matrix(v[k], rows, cols, what + " second moment");
  }
  r.expect_end();
  for (std::size_t k = 0; k < count; ++k) {
    t.optimized[k]->mutable_value() = values[k];
    t.optimizer->first_moment(k) = m[k];
    t.optimizer->second_moment(k) = v[k];
  }
  t.optimizer->step_count() = steps;
  t.batches.set_state(batches);
  t.last_loss = last_loss;
}

// ---- weights in the safetensors format (--save-weights, --load-weights) ----

/// A parameter's name in the file and how its matrix is laid out there.
struct TorchName {
  const char* remat;  ///< gpt::Model::parameter_names(), without "blockL."
  const char* torch;  ///< under "transformer.h.L." for a block's parameters
  remat::safetensors::Layout layout;
};
using Layout = remat::safetensors::Layout;
/// nanoGPT's names (github.com/karpathy/nanoGPT, model.py: class GPT) and PyTorch's layouts, so that the file
/// loads with load_state_dict into a nanoGPT-style module and such a module's file loads here: nn.Linear
/// weights [out, in] (remat's W is [in, out]), biases and layer-norm weights 1-D [n] (remat's are [1, n]),
/// nn.Embedding weights [num, dim] as remat's. docs/gpt.md §Weights lists where the model differs from nanoGPT.
constexpr TorchName model_torch_names[] = {
    {"token_embedding", "transformer.wte.weight", Layout::matrix},
    {"position_embedding", "transformer.wpe.weight", Layout::matrix},
    {"lnf_gain", "transformer.ln_f.weight", Layout::vector},
    {"lnf_bias", "transformer.ln_f.bias", Layout::vector},
    {"head_weight", "lm_head.weight", Layout::transposed},
    {"head_bias", "lm_head.bias", Layout::vector},  // nanoGPT's head has no bias; this model's has one
};
constexpr TorchName block_torch_names[] = {
    {"ln1_gain", "ln_1.weight", Layout::vector},
    {"ln1_bias", "ln_1.bias", Layout::vector},
    {"qkv_weight", "attn.c_attn.weight", Layout::transposed},  // q, k, v in nanoGPT's order: rows [0,H), [H,2H), ...
    {"qkv_bias", "attn.c_attn.bias", Layout::vector},
    {"proj_weight", "attn.c_proj.weight", Layout::transposed},
    {"proj_bias", "attn.c_proj.bias", Layout::vector},
    {"ln2_gain", "ln_2.weight", Layout::vector},
    {"ln2_bias", "ln_2.bias", Layout::vector},
    {"fc_weight", "mlp.c_fc.weight", Layout::transposed},
    {"fc_bias", "mlp.c_fc.bias", Layout::vector},
    {"fc_proj_weight", "mlp.c_proj.weight", Layout::transposed},
    {"fc_proj_bias", "mlp.c_proj.bias", Layout::vector},
};

/// Every parameter of `model` under its PyTorch name. Looked up by the model's own names rather than by
/// position, so that a parameter added to gpt.hpp without a name here stops the program instead of being
/// saved under another parameter's name.
std::vector<remat::safetensors::Entry> weight_entries(gpt::Model<float>& model) {
  const std::vector<remat::Parameter<float>*> parameters = model.parameters();
  const std::vector<std::string> names = model.parameter_names();
  std::vector<remat::safetensors::Entry> entries;
  for (std::size_t n = 0; n < parameters.size(); ++n) {
    std::string name = names[n], prefix;
    const TorchName* begin = std::begin(model_torch_names);
    const TorchName* end = std::end(model_torch_names);
    if (name.compare(0, 5, "block") == 0) {  // "block3.qkv_weight" → "transformer.h.3." and "qkv_weight"
      const std::size_t dot = name.find('.');
      prefix = "transformer.h." + name.substr(5, dot - 5) + ".";
      name = name.substr(dot + 1);
      begin = std::begin(block_torch_names);
      end = std::end(block_torch_names);
    }
    const TorchName* t = std::find_if(begin, end, [&](const TorchName& c) { return name == c.remat; });
    if (t == end) throw std::logic_error("gpt: no PyTorch name for the parameter " + names[n]);
    entries.emplace_back(prefix + t->torch, *parameters[n], t->layout);
  }
  return entries;
}

/// The flags of the model a weights file describes in its metadata ("" if it does not say: a file written
/// by PyTorch), for the message of a file that does not fit.
std::string model_flags_of(const remat::safetensors::Metadata& metadata) {
  std::string flags;
  for (const auto& [key, flag] : {std::pair{"layers", "--layers"}, std::pair{"width", "--width"},
                                  std::pair{"heads", "--heads"}, std::pair{"seq_len", "--seq-len"}}) {
    const auto it = metadata.find(key);
    if (it == metadata.end()) return "";
    flags += (flags.empty() ? "" : " ") + std::string(flag) + " " + it->second;
  }
  return flags;
}

/// Loads --load-weights into `model`. The shapes fix every size of the model but the head count, which the
/// metadata of a file written here records: a file of another --heads would load and compute something else.
void load_weights(const Options& o, gpt::Model<float>& model) {
  namespace st = remat::safetensors;
  st::Header header;
  try {
    header = st::read_header(o.load_weights);
    const auto heads = header.metadata.find("heads");
    if (heads != header.metadata.end() && heads->second != std::to_string(o.heads))
      throw std::runtime_error("--load-weights: " + o.load_weights + ": the weights are of a model with " +
                               heads->second + " heads (its metadata) but --heads is " + std::to_string(o.heads));
    st::load(o.load_weights, weight_entries(model));
  } catch (const remat::mismatch_error& e) {  // the library's message names the file and the tensor
    const std::string flags = model_flags_of(header.metadata);
    throw std::runtime_error("--load-weights: " + std::string(e.what()) +
                             (flags.empty() ? "" : " (the file's metadata: " + flags + ")"));
  } catch (const remat::io_error& e) {
    throw std::runtime_error("--load-weights: " + std::string(e.what()));
  }
}

/// Writes --save-weights: the parameters alone (the optimizer's state is --state's), with the model's shape
/// in the metadata, which PyTorch ignores and a reader needs to build the model.
void save_weights(const Options& o, Training& t) {
  const remat::safetensors::Metadata metadata = {{"format", "pt"},
                                                 {"model", "remat GPT"},
                                                 {"layers", std::to_string(o.layers)},
                                                 {"width", std::to_string(o.width)},
                                                 {"heads", std::to_string(o.heads)},
                                                 {"seq_len", std::to_string(o.seq_len)},
                                                 {"vocab", std::to_string(t.model->config().vocabulary)},
                                                 {"gelu", "tanh"},
                                                 {"steps", std::to_string(t.optimizer->step_count())}};
  remat::safetensors::save(o.save_weights, weight_entries(*t.model), metadata);
}

// ---- --estimate ----

/// --estimate: the memory of one training step (a batch of B windows of S bytes) with the --checkpoint and
/// --attention settings, counted on a shapes-only tape (remat::estimate_memory) by the model code the training
/// runs. No corpus is read (the ids are zeros, which shapes do not depend on) and nothing is trained.
int estimate_step(const Options& o) {
  gpt::Model<float> model(config_of(o));  // zero parameters: an estimate reads none
  const std::size_t tokens = static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(o.seq_len);
  const std::vector<int> ids(tokens, 0), targets(tokens, 0);
  const gpt::Options options{recompute_of(o.checkpoint), attention_of(o)};
  const remat::MemoryEstimate e = remat::estimate_memory([&](remat::Tape<float>& tape) {
    tape.seed(dropout_seed(o.seed, 0));
    return model.loss(tape, ids, targets, options);
  });
  std::printf(
      "GPT L=%d H=%d heads=%d S=%d V=256, batch %d, dropout %g, attention %s, checkpoint %s: one training step, "
      "estimated from shapes\n",
      o.layers, o.width, o.heads, o.seq_len, o.batch, o.dropout, o.attention.c_str(), o.checkpoint.c_str());
  examples::print_estimate(e, o.json, "saved_bytes", "peak_bytes",
                           "\"checkpoint\":\"" + o.checkpoint + "\",\"attention\":\"" + o.attention +
                               "\",\"batch\":" + std::to_string(o.batch));
  return 0;
}

// ---- evaluation and sampling ----

/// Mean cross-entropy (nats per byte) over a fixed set of validation windows: eval_batches batches of
/// B windows spread evenly over the validation split, the same at every evaluation, so the curve
/// compares like with like. Evaluation mode (no dropout), on its own tape.
double validation_loss(const Options& o, const gpt::Corpus& corpus, const gpt::Windows& windows,
                       gpt::Model<float>& model, remat::Tape<float>& tape, std::vector<int>& ids,
                       std::vector<int>& targets) {
  const std::size_t n = static_cast<std::size_t>(o.eval_batches) * static_cast<std::size_t>(o.batch);
  const gpt::Options eval{gpt::Recompute::none, attention_of(o)};
  double sum = 0;
  for (int e = 0; e < o.eval_batches; ++e) {
    for (std::size_t b = 0; b < static_cast<std::size_t>(o.batch); ++b) {
      const std::size_t i = static_cast<std::size_t>(e) * static_cast<std::size_t>(o.batch) + b;
      windows.fill(corpus,
                   static_cast<std::size_t>(static_cast<double>(i) * static_cast<double>(windows.count()) /
                                            static_cast<double>(n)),
                   b, ids, targets);
    }
    tape.clear();
    sum += static_cast<double>(model.loss(tape, ids, targets, eval).item());
  }
  tape.clear();
  return sum / o.eval_batches;
}

/// Continues `context` by `count` bytes: each byte from the logits of the last S bytes (fewer at the
/// start: the window is padded on the right, which causal attention never looks at), greedy
/// (remat::argmax_rows) at temperature 0, else drawn from softmax(logits / temperature).
std::string sample(const Options& o, gpt::Model<float>& model, std::string context, remat::Tape<float>& tape) {
  remat::nn::Generator g(o.seed ^ 0x2545f4914f6cdd1dULL);
  const std::size_t S = static_cast<std::size_t>(o.seq_len);
  const gpt::Options eval{gpt::Recompute::none, attention_of(o)};
  std::vector<int> ids(S);
  std::vector<double> p(256);
  std::string out;
  for (int n = 0; n < o.sample_bytes; ++n) {
    const std::size_t used = std::min(S, context.size());
    std::fill(ids.begin(), ids.end(), 0);
    for (std::size_t s = 0; s < used; ++s) ids[s] = static_cast<unsigned char>(context[context.size() - used + s]);
    tape.clear();
    Var<float> logits = model.logits(tape, ids, eval);
    const auto row = static_cast<remat::Index>(used - 1);
    int next;
    if (o.temperature == 0) {
      next = remat::argmax_rows(logits)[used - 1];
    } else {
      const auto v = logits.value();
      const float top = v.row(row).maxCoeff();
      double total = 0;
      for (int j = 0; j < 256; ++j)
        total += p[static_cast<std::size_t>(j)] = std::exp((v(row, j) - top) / o.temperature);
      double u = g.uniform() * total;
      next = 255;
      for (int j = 0; j < 256; ++j)
        if ((u -= p[static_cast<std::size_t>(j)]) < 0) {
          next = j;
          break;
        }
    }
    context.push_back(static_cast<char>(next));
    out.push_back(static_cast<char>(next));
  }
  tape.clear();
  return out;
}

// ---- output ----

/// The sum of every parameter's elements, in double, in the contract's order: equal runs print equal
/// sums; with the CRC-32 of the parameters' bytes it shows bitwise equality.
double parameter_checksum(gpt::Model<float>& model) {
  double sum = 0;
  for (remat::Parameter<float>* p : model.parameters())
    for (remat::Index i = 0; i < p->value().size(); ++i) sum += static_cast<double>(p->value().data()[i]);
  return sum;
}

int run(Options& o, const CLI::App& app, const Ranks& ranks) {
  if (o.threads == 0) o.threads = examples::default_threads(ranks.size);
  remat::set_num_threads(o.threads);  // remat's kernels and OpenBLAS's products
  // As in the MLP example: a weight whose gradient is 0 for many steps after a non-zero one (the embedding
  // row of a rare byte) has an AdamW moment that decays by beta1 a step into subnormals, which are slow
  // (remat/flush_denormal.hpp).
  remat::set_flush_denormal(o.flush_denormal);
  // The state file's settings come first: they decide the model's shape and the split.
  std::unique_ptr<examples::StateReader> resume;
  if (!o.state.empty() && std::filesystem::exists(o.state)) {
    if (!o.load_weights.empty())  // the state file holds the weights the run continues from
      throw std::invalid_argument("--state " + o.state +
                                  " exists, and a resumed run continues from its weights: drop --load-weights, or "
                                  "give --state a new file");
    resume = std::make_unique<examples::StateReader>(examples::read_state_file(o.state, state_format));
    decode_settings(*resume, o, app);
  }
  // After the state file's settings: a file written with dropout makes --attention fused an error too.
  if (o.attention == "fused" && o.dropout > 0) {
    char given[32];
    std::snprintf(given, sizeof given, "%g", o.dropout);
    throw std::invalid_argument(std::string("--attention fused has no dropout (got --dropout ") + given +
                                "); use --attention unfused or --dropout 0");
  }
  if (o.width % o.heads != 0)
    throw std::invalid_argument("--width " + std::to_string(o.width) + " is not divisible by --heads " +
                                std::to_string(o.heads));
  if (o.steps > 0 && o.steps <= o.warmup)  // --steps 0 takes no step: there is no schedule
    throw std::invalid_argument("--steps " + std::to_string(o.steps) + " must exceed --warmup " +
                                std::to_string(o.warmup));
  if (o.batch < ranks.size)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + " is smaller than the " +
                                std::to_string(ranks.size) + " ranks: every rank needs a sequence of each batch");
  if (o.estimate) return estimate_step(o);
  if (!o.state.empty() && ranks.rank == 0) examples::check_state_destination(o.state);  // before steps are spent
  if (!o.save_weights.empty() && ranks.rank == 0) examples::check_state_destination(o.save_weights);

  gpt::Corpus corpus = gpt::read_corpus(o.data);
  gpt::split(corpus, static_cast<std::size_t>(o.seq_len));
  const gpt::Windows train_windows(corpus.train, static_cast<std::size_t>(o.seq_len));
  const gpt::Windows validation_windows(corpus.validation, static_cast<std::size_t>(o.seq_len));
  const double baseline = gpt::unigram_entropy(corpus, corpus.train);

  Training t;
  if (resume) {
    t.model = std::make_unique<gpt::Model<float>>(config_of(o));
    make_optimizer(o, t);
    decode_training(*resume, corpus, t);
  } else {
    remat::nn::Generator init(o.seed);
    t.model = std::make_unique<gpt::Model<float>>(gpt::Model<float>::random(config_of(o), init));
    // Every rank reads the file (a shared file system, as --state assumes); DataParallel then checks that the
    // ranks hold the same parameters.
    if (!o.load_weights.empty()) load_weights(o, *t.model);
    make_optimizer(o, t);
    t.batches.set_state(o.seed ^ 0x5851f42d4c957f2dULL);
  }
  gpt::Model<float>& model = *t.model;
  const std::vector<remat::Parameter<float>*> parameters = model.parameters();
  std::size_t parameter_count = 0;
  for (const remat::Parameter<float>* p : parameters) parameter_count += static_cast<std::size_t>(p->value().size());
  std::optional<remat::nn::WarmupCosineSchedule> schedule;  // none for --steps 0, which takes no step
  if (o.steps > 0) schedule.emplace(o.lr, o.warmup, o.steps, min_lr_fraction * o.lr);
  const gpt::Options options{recompute_of(o.checkpoint), attention_of(o)};
  remat::Tape<float> tape, eval_tape;
  // --distributed: every rank starts from rank 0's parameters (ranks given different model flags stop here
  // with a message), and the gradients are averaged over the ranks in buckets all-reduced while backward runs.
  examples::DataParallel data_parallel(ranks, parameters, tape, o.timing);
  {  // a state file on every rank or none, the same one, or the ranks would train apart (or hang)
    const std::string hint = "every rank must be given the same --seed and --state file";
    data_parallel.check_same_on_every_rank(t.optimizer->step_count(), "the step to start from (--state)", hint);
    data_parallel.check_same_on_every_rank(t.batches.state(), "the batch stream (--seed, --state)", hint);
    // Each rank makes its own optimizer step: flushing on some ranks only would make their weights differ.
    data_parallel.check_same_on_every_rank(o.flush_denormal ? 1u : 0u, "--flush-denormal",
                                           "give every rank the same --flush-denormal or --no-flush-denormal");
  }

  std::printf(
      "GPT L=%d H=%d heads=%d S=%d V=256: %zu parameters; dropout %g, attention %s, checkpoint %s, %d thread%s%s%s\n",
      o.layers, o.width, o.heads, o.seq_len, parameter_count, o.dropout, o.attention.c_str(), o.checkpoint.c_str(),
      o.threads, o.threads == 1 ? "" : "s", o.flush_denormal ? ", subnormals flushed to zero" : "",
      examples::blas_kernels_text().c_str());
  std::printf("corpus %s: %zu files, %zu bytes; train %zu / validation %zu bytes (every 20th block of %zu bytes)\n",
              corpus.directory.c_str(), corpus.files.size(), corpus.bytes.size(), corpus.train.bytes,
              corpus.validation.bytes, corpus.block);
  std::printf("unigram baseline (entropy of the training bytes): %.4f nats/byte (%.4f bits/byte)\n", baseline,
              baseline / std::log(2.0));
  if (o.steps > 0)
    std::printf(
        "AdamW lr %g (warm-up %d steps, cosine to %g at step %d), betas %g/%g, weight decay %g on matrices, clip %g; "
        "batch %d x %d bytes, seed %llu\n",
        o.lr, o.warmup, min_lr_fraction * o.lr, o.steps, beta1, beta2, weight_decay, clip_norm, o.batch, o.seq_len,
        static_cast<unsigned long long>(o.seed));
  else
    std::printf("--steps 0: no training; the parameters are evaluated (batches of %d x %d bytes) and sampled\n",
                o.batch, o.seq_len);
  if (ranks.distributed)
    std::printf("data parallel: %d ranks, each trains on its shard of every global batch of %d sequences\n", ranks.size,
                o.batch);
  if (resume)
    std::printf("resumed from %s at step %llu\n", o.state.c_str(),
                static_cast<unsigned long long>(t.optimizer->step_count()));
  if (!o.load_weights.empty()) std::printf("weights loaded from %s\n", o.load_weights.c_str());
  std::fflush(stdout);

  eval_tape.set_training(false);
  eval_tape.set_grad_enabled(false);  // evaluation keeps no residuals (torch.no_grad)
  // Every rank draws the windows of the whole global batch (the same stream) and trains on its sequences
  // [first, last) of it: the global batch is the single-process one.
  const std::size_t B = static_cast<std::size_t>(o.batch), S = static_cast<std::size_t>(o.seq_len);
  const std::size_t first = ranks.begin(B), last = ranks.end(B);
  const std::size_t tokens = B * S;  // of the global batch
  std::vector<int> ids((last - first) * S), targets((last - first) * S), eval_ids(tokens), eval_targets(tokens);
  examples::TimingTotals run_timing;
  double last_grad_norm = NAN;  // of the last step of this run (before clipping; the reduced gradient's)
  std::size_t saved_bytes = 0, peak_bytes = 0;
  double train_seconds = 0, train_cpu_seconds = 0, window_seconds = 0;
  int steps_this_run = 0, window_steps = 0;
  double validation = NAN;
  std::uint64_t validated_at = ~std::uint64_t{0};
  auto evaluate = [&](std::uint64_t step) {
    validation = validation_loss(o, corpus, validation_windows, model, eval_tape, eval_ids, eval_targets);
    validated_at = step;
    std::printf("step %5llu  validation %.4f nats/byte (%.4f bits/byte)\n", static_cast<unsigned long long>(step),
                validation, validation / std::log(2.0));
    std::fflush(stdout);
  };
  auto save = [&] {  // rank 0's: the ranks' states are the same
    if (!o.state.empty() && ranks.rank == 0)
      examples::write_state_file(o.state, state_format, encode_state(o, corpus, t));
  };

  while (t.optimizer->step_count() < static_cast<std::uint64_t>(o.steps)) {
    if (o.stop_after > 0 && steps_this_run == o.stop_after) {
      std::printf("stopping after %d step%s as --stop-after asks; run again with --state to continue\n", o.stop_after,
                  o.stop_after == 1 ? "" : "s");
      break;
    }
    const std::uint64_t step = t.optimizer->step_count();
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
    for (std::size_t b = 0; b < B; ++b) {
      const std::size_t window = t.batches.below(train_windows.count());
      if (b >= first && b < last) train_windows.fill(corpus, window, b - first, ids, targets);
    }
    const double lr = schedule->at(step);
    // Each shard's mean loss weighs by its share of the global batch; dropout masks are drawn per rank.
    data_parallel.set_shard(last - first, B);
    data_parallel.start_step();
    gpt::StepResult r = gpt::training_step(
        tape, model, parameters, *t.optimizer, ids, targets, options,
        dropout_seed(o.seed, step) ^ static_cast<std::uint64_t>(ranks.rank) * 0x9e3779b97f4a7c15ULL, lr, clip_norm,
        [&](remat::Tape<float>& tp, const Var<float>& loss) { data_parallel.backward(tp, loss); });
    data_parallel.end_step();
    double loss = r.loss * static_cast<double>(last - first) / static_cast<double>(B);
    data_parallel.sum_over_ranks(&loss, 1);  // the global batch's mean loss (r.loss in one process)
    r.loss = loss;
    if (!std::isfinite(r.grad_norm))
      throw std::runtime_error("training diverged at step " + std::to_string(step) + ": the gradient norm is " +
                               number(r.grad_norm) + " (try a smaller --lr)");
    saved_bytes = r.saved_bytes;
    peak_bytes = std::max(peak_bytes, r.peak_bytes);
    t.last_loss = r.loss;
    last_grad_norm = r.grad_norm;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    train_seconds += seconds;
    train_cpu_seconds += cpu_seconds() - cpu_start;
    window_seconds += seconds;
    ++steps_this_run;
    ++window_steps;
    const std::uint64_t done = step + 1;
    if (o.log_every > 0 && (done % static_cast<std::uint64_t>(o.log_every) == 0 || done == 1 ||
                            done == static_cast<std::uint64_t>(o.steps))) {
      std::printf("step %5llu/%d  loss %.4f  lr %.2e  |g| %.3f  %.0f tok/s  saved %s  peak %s\n",
                  static_cast<unsigned long long>(done), o.steps, t.last_loss, lr, r.grad_norm,
                  static_cast<double>(window_steps * tokens) / window_seconds, megabytes(saved_bytes).c_str(),
                  megabytes(peak_bytes).c_str());
      std::fflush(stdout);
      window_seconds = 0;
      window_steps = 0;
      if (o.timing) {
        const examples::TimingTotals window = data_parallel.take_timing();
        std::printf("%s\n", window.line("to step " + std::to_string(done)).c_str());
        std::fflush(stdout);
        run_timing += window;
      }
    }
    if (o.eval_every > 0 && done % static_cast<std::uint64_t>(o.eval_every) == 0 && ranks.rank == 0) evaluate(done);
    if (o.save_every > 0 && done % static_cast<std::uint64_t>(o.save_every) == 0) save();
  }
  tape.clear();
  save();
  if (!o.save_weights.empty() && ranks.rank == 0) save_weights(o, t);
  run_timing += data_parallel.take_timing();
  const std::uint32_t crc = examples::parameters_crc32(parameters);
  data_parallel.check_same_parameters_bitwise(crc);  // --distributed: the ranks must not have diverged
  const std::uint64_t steps_done = t.optimizer->step_count();
  // Validation and sampling on rank 0 only (it alone prints); the other ranks' parameters are the same.
  if (validated_at != steps_done && ranks.rank == 0) evaluate(steps_done);

  const std::string context = o.prompt.empty() ? std::string("%\n") : o.prompt;
  const std::string text = o.sample_bytes > 0 && ranks.rank == 0 ? sample(o, model, context, eval_tape) : std::string();
  const double tokens_per_second =
      train_seconds > 0 ? static_cast<double>(static_cast<std::size_t>(steps_this_run) * tokens) / train_seconds : 0.0;
  const double checksum = parameter_checksum(model);
  char train_loss[32] = "none";  // no step taken: --steps 0
  if (!std::isnan(t.last_loss)) std::snprintf(train_loss, sizeof train_loss, "%.4f", t.last_loss);
  std::printf(
      "done: %llu steps, train loss %s, validation %.4f nats/byte (%.4f bits/byte) vs unigram %.4f nats/byte; "
      "%.1f s training this run (CPU %.1f s), %.0f tok/s; saved %s after forward, peak %s\n",
      static_cast<unsigned long long>(steps_done), train_loss, validation, validation / std::log(2.0), baseline,
      train_seconds, train_cpu_seconds, tokens_per_second, megabytes(saved_bytes).c_str(),
      megabytes(peak_bytes).c_str());
  std::printf("parameter checksum %.17g (CRC-32 %u)\n", checksum, crc);
  if (o.timing) std::printf("%s\n", run_timing.line("of this run").c_str());
  if (o.sample_bytes > 0)
    std::printf("sample (temperature %g, %d bytes after %s):\n%s%s\n", o.temperature, o.sample_bytes,
                o.prompt.empty() ? "\"%\\n\"" : "the prompt", o.prompt.c_str(), text.c_str());
  if (o.json) {
    std::ostringstream j;
    j << "{\"steps\":" << steps_done
      << ",\"train_loss\":" << (std::isnan(t.last_loss) ? std::string("null") : number(t.last_loss))
      << ",\"grad_norm\":" << (std::isnan(last_grad_norm) ? std::string("null") : number(last_grad_norm))
      << ",\"val_loss\":" << number(validation) << ",\"val_bits_per_byte\":" << number(validation / std::log(2.0))
      << ",\"unigram_nats_per_byte\":" << number(baseline)
      << ",\"unigram_bits_per_byte\":" << number(baseline / std::log(2.0))
      << ",\"tokens_per_second\":" << number(tokens_per_second) << ",\"train_seconds\":" << number(train_seconds)
      << ",\"train_cpu_seconds\":" << number(train_cpu_seconds) << ",\"saved_bytes\":" << saved_bytes
      << ",\"peak_bytes\":" << peak_bytes << ",\"parameter_checksum\":" << number(checksum)
      << ",\"parameters_crc32\":" << crc << ",\"parameters\":" << parameter_count
      << ",\"corpus_bytes\":" << corpus.bytes.size() << ",\"train_bytes\":" << corpus.train.bytes
      << ",\"val_bytes\":" << corpus.validation.bytes << ",\"layers\":" << o.layers << ",\"width\":" << o.width
      << ",\"heads\":" << o.heads << ",\"seq_len\":" << o.seq_len << ",\"batch\":" << o.batch
      << ",\"lr\":" << number(o.lr) << ",\"dropout\":" << number(o.dropout) << ",\"seed\":" << o.seed
      << ",\"threads\":" << o.threads << ",\"flush_denormal\":" << (o.flush_denormal ? "true" : "false")
      << ",\"checkpoint\":\"" << o.checkpoint << "\",\"attention\":\"" << o.attention << "\",\"ranks\":" << ranks.size
      << ",\"sample\":" << json_string(text);
    if (o.timing) j << ",\"timing\":" << run_timing.json();
    j << "}";
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Trains a byte-level GPT (docs/gpt.md) on Debian's fortunes corpus with remat (reverse-mode autodiff with "
      "gradient checkpointing), reports the validation loss against the unigram baseline, and samples text.",
      "gpt"};
  app.add_option("--data", o.data,
                 "Corpus directory: its regular files not ending in .dat or .u8, sorted by name, concatenated")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "Transformer blocks L")
      ->transform(examples::decimal_integer<decltype(o.layers)>())
      ->capture_default_str()
      ->check(CLI::Range(layers_limits.min, layers_limits.max));
  app.add_option("--width", o.width, "Model width H")
      ->transform(examples::decimal_integer<decltype(o.width)>())
      ->capture_default_str()
      ->check(CLI::Range(size_limits.min, size_limits.max));
  app.add_option("--heads", o.heads, "Attention heads (must divide --width)")
      ->transform(examples::decimal_integer<decltype(o.heads)>())
      ->capture_default_str()
      ->check(CLI::Range(size_limits.min, size_limits.max));
  app.add_option("--seq-len", o.seq_len, "Context length S (bytes)")
      ->transform(examples::decimal_integer<decltype(o.seq_len)>())
      ->capture_default_str()
      ->check(CLI::Range(size_limits.min, size_limits.max));
  app.add_option("--batch", o.batch, "Sequences per batch B")
      ->transform(examples::decimal_integer<decltype(o.batch)>())
      ->capture_default_str()
      ->check(CLI::Range(batch_limits.min, batch_limits.max));
  app.add_option("--steps", o.steps,
                 "Total optimizer steps (a resumed run continues up to this count); 0 only evaluates and samples "
                 "(e.g. the weights of --load-weights)")
      ->transform(examples::decimal_integer<decltype(o.steps)>())
      ->capture_default_str()
      ->check(CLI::Range(0, steps_limits.max));
  app.add_option("--lr", o.lr, "Peak AdamW learning rate (betas 0.9/0.95, weight decay 0.1 on the weight matrices)")
      ->capture_default_str()
      ->check(finite_number)
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "Linear warm-up steps, then a cosine decay to lr/10 at --steps")
      ->transform(examples::decimal_integer<decltype(o.warmup)>())
      ->capture_default_str()
      ->check(CLI::Range(warmup_limits.min, warmup_limits.max));
  app.add_option("--dropout", o.dropout, "Dropout on attention probabilities and both residual branches")
      ->capture_default_str()
      ->check(finite_number)
      ->check(CLI::Range(dropout_limits.min, dropout_limits.max));
  app.add_option("--seed", o.seed, "Seed of the initialisation, the batches, dropout and sampling")
      ->transform(examples::decimal_integer<decltype(o.seed)>())
      ->capture_default_str();
  app.add_option("--threads", o.threads,
                 "Threads of remat's kernels and of OpenBLAS's matrix products (remat::set_num_threads); 0: the "
                 "machine's cores (OMP_NUM_THREADS when set), shared among the MPI ranks on this machine")
      ->transform(examples::decimal_integer<decltype(o.threads)>())
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--checkpoint", o.checkpoint,
                 "What backward recomputes: none; block (each block a nothing_saveable region); attention (the "
                 "attention core, selective); dots_no_batch (each block a dots_with_no_batch_dims_saveable region); "
                 "sqrt (round(sqrt(L)) segments of blocks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "block", "attention", "dots_no_batch", "sqrt"}));
  app.add_option("--attention", o.attention, "unfused (softmax of scores, then values) or fused (no dropout)")
      ->capture_default_str()
      ->check(CLI::IsMember({"unfused", "fused"}));
  app.add_option("--log-every", o.log_every, "Print a progress line every N steps (0 = never)")
      ->transform(examples::decimal_integer<decltype(o.log_every)>())
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--eval-every", o.eval_every, "Validation loss every N steps (0 = only at the end)")
      ->transform(examples::decimal_integer<decltype(o.eval_every)>())
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--eval-batches", o.eval_batches, "Batches of B windows in each validation")
      ->transform(examples::decimal_integer<decltype(o.eval_batches)>())
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--sample-bytes", o.sample_bytes, "Bytes of text to generate at the end (0 = none)")
      ->transform(examples::decimal_integer<decltype(o.sample_bytes)>())
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--temperature", o.temperature, "Sampling temperature (0 = greedy)")
      ->capture_default_str()
      ->check(finite_number)
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--prompt", o.prompt, "Text the sample continues (default: \"%\\n\", the start of a fortune)");
  app.add_flag("--flush-denormal,!--no-flush-denormal", o.flush_denormal,
               "Flush subnormal floats to zero on every thread (remat::set_flush_denormal): without it, AdamW's "
               "moments of weights whose gradient is mostly 0 (rare bytes' embeddings) decay into slow subnormals")
      ->capture_default_str();
  app.add_flag("--json", o.json, "Print one JSON object with the results as the last line of stdout");
  app.add_flag("--estimate", o.estimate,
               "Print the saved and peak bytes of one training step with the --checkpoint and --attention settings, "
               "counted from shapes alone (remat::estimate_memory), and exit: no corpus is read, nothing is trained "
               "(a --state file's settings apply)");
  app.add_option("--state", o.state,
                 "Training state file: resumed from if it exists, written every --save-every steps and at the end "
                 "(atomically)");
  app.add_option("--save-weights", o.save_weights,
                 "Write the parameters alone, in the safetensors format, when training ends (atomically), under "
                 "nanoGPT's names and PyTorch's layouts (transformer.h.I.attn.c_attn.weight [3H,H], ...; docs/gpt.md)");
  app.add_option("--load-weights", o.load_weights,
                 "Start from the parameters in this safetensors file (as --save-weights writes them) instead of "
                 "initialising them from --seed; the optimizer starts afresh; not with a --state file that exists. "
                 "--steps 0 only evaluates them");
  app.add_option("--save-every", o.save_every, "Write --state every N steps (0 = only at the end)")
      ->transform(examples::decimal_integer<decltype(o.save_every)>())
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--stop-after", o.stop_after,
                 "Stop after N steps of this run, as if interrupted (continue with the same --state; 0 = never)")
      ->transform(examples::decimal_integer<decltype(o.stop_after)>())
      ->check(CLI::Range(0, 1 << 30));
  app.add_flag("--distributed", o.distributed,
               "Data-parallel training over MPI ranks (mpirun -np N gpt --distributed): each rank trains on its "
               "shard of the --batch sequences of every global batch, gradients are averaged "
               "(docs/distributed.md); only rank 0 prints, validates, samples and writes --state");
  app.add_flag("--timing", o.timing,
               "Print with each progress line the time of a step and of its backward and, with --distributed, "
               "the all-reduce: bytes per step, the fraction of its time hidden behind backward, the wait it adds "
               "after backward (docs/distributed.md)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (o.steps == 0 && !o.state.empty()) {  // a state file of 0 steps could not be resumed (steps_limits)
    std::fprintf(stderr,
                 "gpt: error: --steps 0 trains nothing, so there is no state to resume or save: drop --state\n");
    return 2;
  }
  if (o.estimate && o.distributed) {
    std::fprintf(stderr, "gpt: error: --estimate counts one process's step: drop --distributed\n");
    return 2;
  }
  return examples::run_main("gpt", o.distributed, argc, argv, [&](const Ranks& ranks) { return run(o, app, ranks); });
}
