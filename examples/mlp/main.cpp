// Trains a multilayer perceptron on Fashion-MNIST with remat, optionally with gradient checkpointing.
// See docs/mlp.md for the flags, the measured numbers and how to reproduce them.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <remat/io/safetensors.hpp>
#include <remat/nn/adam.hpp>
#include <remat/nn/linear.hpp>
#include <remat/remat.hpp>

#include "../common/data_parallel.hpp"
#include "../common/report.hpp"
#include "../common/settings.hpp"
#include "../common/threads.hpp"
#include "idx.hpp"
#include "state_file.hpp"
#include "training_step.hpp"

namespace {

using examples::check_setting;
using examples::cpu_seconds;
using examples::dropout_seed;
using examples::finite_number;
using examples::Limits;
using examples::megabytes;
using examples::number;
using examples::positive_limits;
using examples::Ranks;
using examples::setting_text;

using remat::Matrix;
using remat::Var;

constexpr int classes = 10;
/// Fashion-MNIST's 28×28 images, flattened: the input width of --estimate, which reads no data.
constexpr remat::Index image_pixels = 28 * 28;

constexpr Limits<int> epochs_limits{0, 100000}, batch_limits{1, 1 << 20};
constexpr Limits<double> dropout_limits{0.0, 0.99};

/// The command line; hidden, activation, dropout and checkpoint are mlp::NetworkOptions (training_step.hpp).
struct Options : mlp::NetworkOptions {
  std::string data = "/usr/share/datasets/fashion-mnist";
  int epochs = 8;
  int batch = 128;
  double lr = 1e-3;
  int threads = 0;  // 0: examples::default_threads
  long limit = 0;
  bool json = false;
  std::string save, resume;
  std::string save_weights, load_weights;  // safetensors files of the layers' weights alone
  std::uint64_t seed = 42;
  int eval_batch = 1000;
  std::string schedule = "cosine";
  int stop_after = 0;
  bool distributed = false;
  bool timing = false;
  bool estimate = false;
  bool flush_denormal = true;
};

/// One training epoch's results; kept in the state file so a resumed run reports the whole history.
struct EpochRecord {
  double loss = 0, train_accuracy = 0, test_accuracy = 0, seconds = 0;
};

/// Everything a run needs to continue exactly where it stopped.
struct Model {
  std::vector<remat::nn::Linear<float>> layers;  // hidden layers, then the output layer
  std::unique_ptr<remat::nn::Adam<float>> adam;
  remat::nn::Generator shuffle;  // the shuffling stream; its state is saved
  std::vector<EpochRecord> history;
};

/// Test accuracy, in batches, with gradients off (remat::NoGradGuard, as torch.no_grad): the parameters are
/// referenced, not copied, no op holds a residual, and each batch's values are freed as soon as its handles go.
double evaluate(const Options& o, Model& model, const mlp::Dataset& test, remat::Tape<float>& tape) {
  tape.clear();
  remat::NoGradGuard<float> no_grad(tape);
  std::vector<Var<float>> parameters;
  for (auto& layer : model.layers) {
    parameters.push_back(tape.variable(layer.weight));
    parameters.push_back(tape.variable(layer.bias));
  }
  const auto n = test.images.rows();
  long correct = 0;
  for (remat::Index first = 0; first < n; first += o.eval_batch) {
    const remat::Index m = std::min<remat::Index>(o.eval_batch, n - first);
    Var<float> logits = mlp::forward(o, parameters, tape.constant(test.images.middleRows(first, m)), false);
    correct += mlp::count_correct(logits.value(), test.labels, static_cast<std::size_t>(first));
  }
  tape.clear();
  return static_cast<double>(correct) / static_cast<double>(n);
}

/// The hidden layers and the output layer for `inputs` input columns, initialised from --seed.
std::vector<remat::nn::Linear<float>> make_layers(const Options& o, remat::Index inputs) {
  remat::nn::Generator init(o.seed);
  const auto init_kind = o.activation == "relu" ? remat::nn::Init::he_uniform : remat::nn::Init::glorot_uniform;
  std::vector<remat::nn::Linear<float>> layers;
  remat::Index width = inputs;
  for (int h : o.hidden) {
    layers.emplace_back(width, h, init, init_kind);
    width = h;
  }
  layers.emplace_back(width, classes, init, remat::nn::Init::glorot_uniform);
  return layers;
}

/// "784→512→512→10".
std::string network_text(const Options& o, remat::Index inputs) {
  std::string shape = std::to_string(inputs);
  for (int h : o.hidden) shape += "→" + std::to_string(h);
  return shape + "→" + std::to_string(classes);
}

/// --estimate: the memory of one training step of a full batch with the --checkpoint mode, counted on a
/// shapes-only tape (remat::estimate_memory) by the step the training runs (TrainingStep::record). No data is
/// read (the input is an unevaluated [batch, 784] expression) and nothing is trained.
int estimate_step(const Options& o) {
  std::vector<remat::nn::Linear<float>> layers = make_layers(o, image_pixels);
  const std::vector<int> labels(static_cast<std::size_t>(o.batch), 0);
  mlp::TrainingStep step;
  const remat::MemoryEstimate e = remat::estimate_memory([&](remat::Tape<float>& tape) {
    tape.seed(dropout_seed(o.seed, 0));
    const auto r = step.record(tape, o, layers, Matrix<float>::Zero(o.batch, image_pixels), labels);
    return std::make_tuple(r.loss, r.logits);  // the step reads the logits after backward (accuracy)
  });
  std::printf("MLP %s %s, dropout %g, batch %d, checkpoint %s: one training step, estimated from shapes\n",
              network_text(o, image_pixels).c_str(), o.activation.c_str(), o.dropout, o.batch, o.checkpoint.c_str());
  examples::print_estimate(e, o.json, "saved_bytes_per_step", "peak_bytes_per_step",
                           "\"checkpoint\":\"" + o.checkpoint + "\",\"batch\":" + std::to_string(o.batch));
  return 0;
}

// ---- weights in the safetensors format (--save-weights, --load-weights) ----

/// The layers as PyTorch's nn.Linear names and lays them out in a torch.nn.ModuleList called `layers`:
/// "layers.I.weight" [out, in] and "layers.I.bias" [out] (remat's own W is [in, out], b [1, out]), so that
/// the file loads into such a PyTorch model with load_state_dict, and a PyTorch model's file loads here.
std::vector<remat::safetensors::Entry> weight_entries(std::vector<remat::nn::Linear<float>>& layers) {
  std::vector<remat::safetensors::Entry> entries;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const auto layer = remat::safetensors::torch_linear("layers." + std::to_string(i), layers[i]);
    entries.insert(entries.end(), layer.begin(), layer.end());
  }
  return entries;
}

void save_weights(const Options& o, Model& model, remat::Index inputs) {
  const remat::safetensors::Metadata metadata = {{"format", "pt"},
                                                 {"model", "remat MLP " + network_text(o, inputs)},
                                                 {"activation", o.activation},
                                                 {"epochs", std::to_string(model.history.size())}};
  remat::safetensors::save(o.save_weights, weight_entries(model.layers), metadata);
}

// ---- training state file ----

std::uint32_t activation_id(const std::string& a) {
  return a == "relu" ? 0 : a == "tanh" ? 1 : 2;
}
const char* activation_names[] = {"relu", "tanh", "gelu"};

std::vector<unsigned char> encode_state(const Options& o, Model& model, std::uint64_t train_count) {
  mlp::StateWriter w;
  w.u64(o.seed);
  w.u32(static_cast<std::uint32_t>(o.batch));
  w.f64(o.dropout);
  w.u64(train_count);
  w.u32(activation_id(o.activation));
  const auto& a = model.adam->options();
  w.f64(o.lr);  // the base rate; the schedule sets the current one from it
  w.u32(o.schedule == "cosine" ? 1 : 0);
  w.u32(static_cast<std::uint32_t>(o.epochs));
  w.f64(a.beta1);
  w.f64(a.beta2);
  w.f64(a.epsilon);
  w.u64(model.adam->step_count());
  w.u64(model.shuffle.state());
  w.u32(static_cast<std::uint32_t>(model.layers.size()));
  for (std::size_t k = 0; k < model.adam->size(); ++k) {
    w.matrix(model.adam->value(k));
    w.matrix(model.adam->first_moment(k));
    w.matrix(model.adam->second_moment(k));
  }
  w.u32(static_cast<std::uint32_t>(model.history.size()));
  for (const EpochRecord& e : model.history) {
    w.f64(e.loss);
    w.f64(e.train_accuracy);
    w.f64(e.test_accuracy);
    w.f64(e.seconds);
  }
  return w.bytes();
}

/// The epoch records at the end of the file. The count is checked before anything is allocated for it: no more
/// records than the epochs the run was planned for (each save follows an epoch ≤ --epochs, and --epochs is
/// saved with it), and a payload ending before them names the history.
std::vector<EpochRecord> decode_history(mlp::StateReader& r, std::uint32_t planned_epochs) {
  const std::uint32_t count = r.u32();
  if (count > planned_epochs)
    throw mlp::state_error(r.path(), "has a history of " + std::to_string(count) + " epochs but was planned for " +
                                         std::to_string(planned_epochs));
  std::vector<EpochRecord> history(count);
  try {
    for (EpochRecord& e : history) {
      e.loss = r.f64();
      e.train_accuracy = r.f64();
      e.test_accuracy = r.f64();
      e.seconds = r.f64();
    }
  } catch (const mlp::state_error&) {
    throw mlp::state_error(r.path(), "the payload ends inside the history of " + std::to_string(count) + " epochs");
  }
  return history;
}

/// Restores `model` from a validated file. The file's training settings win; a flag given on the
/// command line that contradicts them is an error (the run could not continue identically).
void decode_state(mlp::StateReader& r, Options& o, const CLI::App& app, Model& model, std::uint64_t train_count) {
  auto conflict = [&](const char* flag, const std::string& file_value, const std::string& given) {
    throw mlp::state_error(r.path(), std::string("was written with ") + flag + " " + file_value +
                                         " but the command line gives " + given +
                                         "; drop the flag to continue with the file's setting");
  };
  const std::uint64_t seed = r.u64();
  if (app.count("--seed") && seed != o.seed) conflict("--seed", std::to_string(seed), std::to_string(o.seed));
  o.seed = seed;
  const std::uint32_t batch = r.u32();
  check_setting(r, "--batch", batch, batch_limits);
  if (app.count("--batch") && batch != static_cast<std::uint32_t>(o.batch))
    conflict("--batch", std::to_string(batch), std::to_string(o.batch));
  o.batch = static_cast<int>(batch);
  const double dropout = r.f64();
  check_setting(r, "--dropout", dropout, dropout_limits);
  if (app.count("--dropout") && dropout != o.dropout)
    conflict("--dropout", setting_text(dropout), setting_text(o.dropout));
  o.dropout = dropout;
  const std::uint64_t count = r.u64();
  if (count != train_count)
    throw mlp::state_error(r.path(), "was written training on " + std::to_string(count) + " images but this run uses " +
                                         std::to_string(train_count) + " (check --limit and --data)");
  const std::uint32_t activation = r.u32();
  if (activation > 2) throw mlp::state_error(r.path(), "unknown activation id " + std::to_string(activation));
  if (app.count("--activation") && activation_names[activation] != o.activation)
    conflict("--activation", activation_names[activation], o.activation);
  o.activation = activation_names[activation];
  remat::nn::Adam<float>::Options a;
  a.learning_rate = r.f64();
  const std::uint32_t schedule = r.u32();
  const std::uint32_t epochs = r.u32();
  a.beta1 = r.f64();
  a.beta2 = r.f64();
  a.epsilon = r.f64();
  check_setting(r, "--lr", a.learning_rate, positive_limits);
  check_setting(r, "--epochs", epochs, epochs_limits);
  if (app.count("--lr") && a.learning_rate != o.lr) conflict("--lr", setting_text(a.learning_rate), setting_text(o.lr));
  o.lr = a.learning_rate;
  if (schedule > 1) throw mlp::state_error(r.path(), "unknown schedule id " + std::to_string(schedule));
  const char* schedule_name = schedule == 1 ? "cosine" : "constant";
  if (app.count("--schedule") && o.schedule != schedule_name) conflict("--schedule", schedule_name, o.schedule);
  o.schedule = schedule_name;
  if (!app.count("--epochs"))
    o.epochs = static_cast<int>(epochs);
  else if (static_cast<std::uint32_t>(o.epochs) != epochs && o.schedule == "cosine")
    std::printf("note: the run was planned for %u epochs, now %d: the cosine schedule is recomputed for %d\n", epochs,
                o.epochs, o.epochs);
  const std::uint64_t steps = r.u64();
  const std::uint64_t shuffle_state = r.u64();
  const std::uint32_t layer_count = r.u32();
  if (layer_count != model.layers.size())
    throw mlp::state_error(r.path(), "has " + std::to_string(layer_count) + " layers but the model has " +
                                         std::to_string(model.layers.size()) + " (check --hidden)");
  std::vector<remat::Parameter<float>*> parameters;
  for (auto& layer : model.layers) {
    parameters.push_back(&layer.weight);
    parameters.push_back(&layer.bias);
  }
  // Read everything into temporaries first: a file that fails half-way changes nothing.
  std::unique_ptr<remat::nn::Adam<float>> adam;
  try {  // the betas and epsilon have no flag: Adam's own check, naming the file
    adam = std::make_unique<remat::nn::Adam<float>>(parameters, a);
  } catch (const remat::domain_error& e) {
    throw mlp::state_error(r.path(), std::string("has Adam settings that are refused: ") + e.what());
  }
  std::vector<Matrix<float>> values(parameters.size());
  for (std::size_t k = 0; k < parameters.size(); ++k) {
    const std::string what = (k % 2 ? "bias " : "weight ") + std::to_string(k / 2);
    r.matrix(values[k], parameters[k]->rows(), parameters[k]->cols(), what + " (check --hidden)");
    r.matrix(adam->first_moment(k), parameters[k]->rows(), parameters[k]->cols(), what + " first moment");
    r.matrix(adam->second_moment(k), parameters[k]->rows(), parameters[k]->cols(), what + " second moment");
  }
  std::vector<EpochRecord> history = decode_history(r, epochs);
  r.expect_end();
  adam->step_count() = steps;
  for (std::size_t k = 0; k < parameters.size(); ++k) parameters[k]->mutable_value() = values[k];
  model.adam = std::move(adam);
  model.shuffle.set_state(shuffle_state);
  model.history = std::move(history);
}

// ---- output ----

void progress_bar(int epoch, int epochs, std::size_t done, std::size_t total, double loss) {
  const int width = 30;
  const int filled = static_cast<int>(width * done / std::max<std::size_t>(total, 1));
  std::printf(
      "\repoch %d/%d [%s%s] %3d%% loss %.4f", epoch, epochs, std::string(static_cast<std::size_t>(filled), '#').c_str(),
      std::string(static_cast<std::size_t>(width - filled), '.').c_str(), static_cast<int>(100 * done / total), loss);
  std::fflush(stdout);
}

/// Every rank needs a row of each batch of the `n` training images (none if n is 0: --estimate reads no data).
void check_batch_fits(const Options& o, const Ranks& ranks, std::size_t n) {
  if (o.batch < ranks.size)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + " is smaller than the " +
                                std::to_string(ranks.size) + " ranks: every rank needs a row of each batch");
  if (n % static_cast<std::size_t>(o.batch) != 0 &&
      n % static_cast<std::size_t>(o.batch) < static_cast<std::size_t>(ranks.size))
    throw std::invalid_argument("the epoch's last batch has " + std::to_string(n % static_cast<std::size_t>(o.batch)) +
                                " rows, fewer than the " + std::to_string(ranks.size) +
                                " ranks; choose --batch or --limit so that every rank gets a row of it");
}

int run(Options& o, const CLI::App& app, const Ranks& ranks) {
  if (o.resume.empty()) check_batch_fits(o, ranks, 0);  // a resumed run's batch is the file's: checked after it
  if (o.threads == 0) o.threads = examples::default_threads(ranks.size);
  remat::set_num_threads(o.threads);  // remat's kernels and OpenBLAS's products
  // Adam's first moments of weights of almost always black pixels decay into subnormals, which are slow:
  // flushed, every epoch runs as fast as the first (remat/flush_denormal.hpp, bench/probes/README.md).
  remat::set_flush_denormal(o.flush_denormal);
  if (o.estimate) return estimate_step(o);
  if (!o.save.empty() && ranks.rank == 0) examples::check_state_destination(o.save);  // before an epoch is spent
  if (!o.save_weights.empty() && ranks.rank == 0) examples::check_state_destination(o.save_weights);
  mlp::Dataset train = mlp::read_idx_dataset(o.data, "train", classes);
  mlp::Dataset test = mlp::read_idx_dataset(o.data, "t10k", classes);
  if (test.image_rows != train.image_rows || test.image_cols != train.image_cols)
    throw mlp::data_error(o.data + "/t10k-images-idx3-ubyte.gz",
                          "images are " + std::to_string(test.image_rows) + "x" + std::to_string(test.image_cols) +
                              " but the training images are " + std::to_string(train.image_rows) + "x" +
                              std::to_string(train.image_cols));
  if (o.limit > 0 && o.limit < train.images.rows()) {
    train.images.conservativeResize(o.limit, Eigen::NoChange);
    train.labels.resize(static_cast<std::size_t>(o.limit));
  }
  const auto n = static_cast<std::size_t>(train.images.rows());
  const auto inputs = train.images.cols();
  if (o.resume.empty()) check_batch_fits(o, ranks, n);

  Model model;
  model.layers = make_layers(o, inputs);
  std::vector<remat::Parameter<float>*> parameters;
  for (auto& layer : model.layers) {
    parameters.push_back(&layer.weight);
    parameters.push_back(&layer.bias);
  }
  // Every rank reads the file (a shared file system, as --resume assumes); DataParallel then checks that
  // the ranks hold the same weights.
  if (!o.load_weights.empty()) remat::safetensors::load(o.load_weights, weight_entries(model.layers));
  if (!o.resume.empty()) {
    mlp::StateReader reader = mlp::read_state_file(o.resume);
    decode_state(reader, o, app, model, n);
    check_batch_fits(o, ranks, n);  // with the file's batch
  } else {
    remat::nn::Adam<float>::Options a;
    a.learning_rate = o.lr;
    model.adam = std::make_unique<remat::nn::Adam<float>>(parameters, a);
    model.shuffle.set_state(o.seed ^ 0x5851f42d4c957f2dULL);
  }
  remat::Tape<float> tape, eval_tape;
  // --distributed: every rank starts from rank 0's weights (ranks given different model flags stop here with
  // a message), and the gradients are averaged over the ranks in buckets all-reduced while backward runs.
  examples::DataParallel data_parallel(ranks, parameters, tape, o.timing);
  {  // --resume on every rank or none, from the same file, or the ranks would train apart (or hang)
    const std::string hint = "every rank must be given the same --seed and --resume file";
    data_parallel.check_same_on_every_rank(model.adam->step_count(), "the step to start from (--resume)", hint);
    data_parallel.check_same_on_every_rank(model.history.size(), "the epochs done (--resume)", hint);
    data_parallel.check_same_on_every_rank(model.shuffle.state(), "the shuffling state (--seed, --resume)", hint);
    // Each rank makes its own optimizer step: flushing on some ranks only would make their weights differ.
    data_parallel.check_same_on_every_rank(o.flush_denormal ? 1u : 0u, "--flush-denormal",
                                           "give every rank the same --flush-denormal or --no-flush-denormal");
  }

  const std::string shape = network_text(o, inputs);
  std::printf(
      "MLP %s %s, dropout %g, Adam lr %g (%s), batch %d, %zu training / %ld test images, checkpoint %s, %d "
      "thread%s%s%s\n",
      shape.c_str(), o.activation.c_str(), o.dropout, o.lr, o.schedule.c_str(), o.batch, n,
      static_cast<long>(test.images.rows()), o.checkpoint.c_str(), o.threads, o.threads == 1 ? "" : "s",
      o.flush_denormal ? ", subnormals flushed to zero" : "", examples::blas_kernels_text().c_str());
  if (o.distributed)
    std::printf("data parallel: %d ranks, each trains on its shard of every global batch of %d\n", ranks.size, o.batch);
  if (!o.resume.empty())
    std::printf("resumed from %s after epoch %zu (step %llu)\n", o.resume.c_str(), model.history.size(),
                static_cast<unsigned long long>(model.adam->step_count()));

  const bool terminal = isatty(STDOUT_FILENO) == 1 && !o.json;
  Matrix<float> x_batch(o.batch, inputs);
  std::vector<int> labels;
  mlp::TrainingStep step;
  std::vector<std::size_t> order(n);
  std::size_t saved_bytes = 0, peak_bytes = 0;
  double train_seconds = 0, run_seconds = 0,
         run_cpu_seconds = 0;  // all epochs (including resumed ones), this run's epochs
  std::size_t trained_samples = 0;
  for (const EpochRecord& e : model.history) train_seconds += e.seconds;
  const std::uint64_t total_steps = static_cast<std::uint64_t>(o.epochs) *
                                    ((n + static_cast<std::size_t>(o.batch) - 1) / static_cast<std::size_t>(o.batch));
  int epochs_this_run = 0;
  std::vector<std::string> epoch_timing;  // --timing: one JSON object per epoch of this run

  for (int epoch = static_cast<int>(model.history.size()) + 1; epoch <= o.epochs; ++epoch) {
    if (o.stop_after > 0 && epochs_this_run == o.stop_after) {
      std::printf("stopping after %d epoch%s as --stop-after asks; continue with --resume\n", o.stop_after,
                  o.stop_after == 1 ? "" : "s");
      break;
    }
    ++epochs_this_run;
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (std::size_t i = n - 1; i > 0; --i) std::swap(order[i], order[model.shuffle.below(i + 1)]);  // Fisher–Yates
    double loss_sum = 0;
    long correct = 0;
    std::size_t local_rows = 0;  // the rows this rank trained on so far in the epoch
    for (std::size_t first = 0; first < n; first += static_cast<std::size_t>(o.batch)) {
      const std::size_t global = std::min(static_cast<std::size_t>(o.batch), n - first);
      // This rank's shard of the global batch (all of it without --distributed).
      const std::size_t shard = ranks.begin(global), m = ranks.end(global) - shard;
      labels.resize(m);
      for (std::size_t i = 0; i < m; ++i) {
        x_batch.row(static_cast<remat::Index>(i)) =
            train.images.row(static_cast<remat::Index>(order[first + shard + i]));
        labels[i] = train.labels[order[first + shard + i]];
      }
      std::optional<double> learning_rate;
      if (o.schedule == "cosine")  // α_t = α·(1 + cos(π t / T)) / 2 over all T steps (Loshchilov & Hutter 2017)
        learning_rate = std::max(
            o.lr * 0.5 *
                (1 + std::cos(M_PI * static_cast<double>(model.adam->step_count()) / static_cast<double>(total_steps))),
            1e-12);
      // The first m rows of x_batch (the last batch may be smaller; resizing would reallocate every epoch).
      // Dropout masks are drawn per rank.
      const std::uint64_t seed = dropout_seed(o.seed, model.adam->step_count()) ^
                                 static_cast<std::uint64_t>(ranks.rank) * 0x9e3779b97f4a7c15ULL;
      // Each shard's mean loss weighs by its share of the global batch: the sum over the ranks is the
      // gradient of the global batch's mean loss (shards may differ by a row).
      data_parallel.set_shard(m, global);
      data_parallel.start_step();
      const mlp::TrainingStep::Result r = step.run(
          tape, o, model.layers, *model.adam, x_batch.topRows(static_cast<remat::Index>(m)), labels, seed,
          learning_rate, [&](remat::Tape<float>& t, const Var<float>& loss) { data_parallel.backward(t, loss); });
      data_parallel.end_step();
      saved_bytes = std::max(saved_bytes, r.saved_bytes);
      peak_bytes = std::max(peak_bytes, r.peak_bytes);
      loss_sum += static_cast<double>(r.loss) * static_cast<double>(m);
      local_rows += m;
      correct += r.correct;
      if (terminal && ((first / static_cast<std::size_t>(o.batch)) % 20 == 0 || first + global == n))
        progress_bar(epoch, o.epochs, first + global, n, loss_sum / static_cast<double>(local_rows));
    }
    tape.clear();
    const examples::TimingTotals timing = data_parallel.take_timing();
    {  // the epoch's loss and accuracy over every rank's rows (--distributed)
      double sums[2] = {loss_sum, static_cast<double>(correct)};
      data_parallel.sum_over_ranks(sums, 2);
      loss_sum = sums[0];
      correct = static_cast<long>(sums[1]);
    }
    // Every rank sees the same sums, so every rank stops here together (a NaN spreads to every rank's
    // parameters through the all-reduced gradients, but may show in one rank's shard first).
    if (!std::isfinite(loss_sum))
      throw std::runtime_error("training diverged in epoch " + std::to_string(epoch) + ": the mean loss is " +
                               number(loss_sum / static_cast<double>(n)) + " (try a smaller --lr)");
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = cpu_seconds() - cpu_start;
    run_cpu_seconds += cpu;
    EpochRecord record;
    record.loss = loss_sum / static_cast<double>(n);
    record.train_accuracy = static_cast<double>(correct) / static_cast<double>(n);
    record.seconds = seconds;
    record.test_accuracy = ranks.rank == 0 ? evaluate(o, model, test, eval_tape) : 0.0;  // printed by rank 0
    model.history.push_back(record);
    train_seconds += seconds;
    run_seconds += seconds;
    trained_samples += n;
    if (terminal) std::printf("\r\033[K");
    std::printf(
        "epoch %2d/%d  loss %.4f  train %.2f%%  test %.2f%%  %.2f s (cpu %.2f s)  %.0f samples/s  saved %s/step  peak "
        "%s\n",
        epoch, o.epochs, record.loss, 100 * record.train_accuracy, 100 * record.test_accuracy, seconds, cpu,
        static_cast<double>(n) / seconds, megabytes(saved_bytes).c_str(), megabytes(peak_bytes).c_str());
    if (o.timing) {  // rank 0's (the ranks wait for each other in every all-reduce)
      std::printf("%s\n", timing.line("epoch " + std::to_string(epoch)).c_str());
      epoch_timing.push_back(timing.json());
    }
    std::fflush(stdout);
    if (!o.save.empty() && ranks.rank == 0) mlp::write_state_file(o.save, encode_state(o, model, n));
  }
  if (!o.save_weights.empty() && ranks.rank == 0) save_weights(o, model, inputs);
  const std::uint32_t crc = examples::parameters_crc32(parameters);
  data_parallel.check_same_parameters_bitwise(crc);  // --distributed: the ranks must not have diverged

  const double test_accuracy = model.history.empty() && ranks.rank == 0 ? evaluate(o, model, test, eval_tape)
                               : model.history.empty()                  ? 0.0
                                                                        : model.history.back().test_accuracy;
  const double samples_per_second = run_seconds > 0 ? static_cast<double>(trained_samples) / run_seconds : 0.0;
  std::printf(
      "done: %zu epochs, test accuracy %.2f%%, %.1f s training (%.2f s/epoch), %.0f samples/s, saved %s per step, peak "
      "%s per step\n",
      model.history.size(), 100 * test_accuracy, train_seconds,
      model.history.empty() ? 0.0 : train_seconds / static_cast<double>(model.history.size()), samples_per_second,
      megabytes(saved_bytes).c_str(), megabytes(peak_bytes).c_str());
  if (o.json) {
    auto list = [&](double EpochRecord::*field) {
      std::string out = "[";
      for (std::size_t i = 0; i < model.history.size(); ++i) out += (i ? "," : "") + number(model.history[i].*field);
      return out + "]";
    };
    std::string hidden;
    for (std::size_t i = 0; i < o.hidden.size(); ++i) hidden += (i ? "," : "") + std::to_string(o.hidden[i]);
    const double epochs_run = static_cast<double>(std::max(epochs_this_run, 1));
    std::ostringstream j;
    j << "{\"epochs\":" << model.history.size() << ",\"test_accuracy\":" << number(test_accuracy)
      << ",\"train_accuracy\":" << number(model.history.empty() ? 0.0 : model.history.back().train_accuracy)
      << ",\"loss\":" << number(model.history.empty() ? 0.0 : model.history.back().loss)
      << ",\"train_seconds\":" << number(train_seconds) << ",\"seconds_per_epoch\":" << number(run_seconds / epochs_run)
      << ",\"cpu_seconds_per_epoch\":" << number(run_cpu_seconds / epochs_run)
      << ",\"samples_per_second\":" << number(samples_per_second) << ",\"saved_bytes_per_step\":" << saved_bytes
      << ",\"peak_bytes_per_step\":" << peak_bytes << ",\"checkpoint\":\"" << o.checkpoint << "\",\"schedule\":\""
      << o.schedule << "\",\"hidden\":[" << hidden << "],\"activation\":\"" << o.activation
      << "\",\"batch\":" << o.batch << ",\"lr\":" << number(o.lr) << ",\"dropout\":" << number(o.dropout)
      << ",\"seed\":" << o.seed << ",\"threads\":" << o.threads
      << ",\"flush_denormal\":" << (o.flush_denormal ? "true" : "false") << ",\"train_images\":" << n
      << ",\"parameters_crc32\":" << crc << ",\"ranks\":" << ranks.size << ",\"losses\":" << list(&EpochRecord::loss)
      << ",\"train_accuracies\":" << list(&EpochRecord::train_accuracy)
      << ",\"test_accuracies\":" << list(&EpochRecord::test_accuracy)
      << ",\"epoch_seconds\":" << list(&EpochRecord::seconds);
    if (o.timing) {
      j << ",\"timing\":[";
      for (std::size_t i = 0; i < epoch_timing.size(); ++i) j << (i ? "," : "") << epoch_timing[i];
      j << "]";
    }
    j << "}";
    std::printf("%s\n", j.str().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Trains a multilayer perceptron on Fashion-MNIST with remat (reverse-mode autodiff with gradient "
      "checkpointing) and reports accuracy, speed and the memory the tape saved per step.",
      "mlp"};
  app.add_option("--data", o.data, "Directory with the Fashion-MNIST IDX files (*-idx3-ubyte.gz, *-idx1-ubyte.gz)")
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "Total number of epochs (a resumed run continues up to this count)")
      ->transform(examples::decimal_integer<decltype(o.epochs)>())
      ->capture_default_str()
      ->check(CLI::Range(epochs_limits.min, epochs_limits.max));
  app.add_option("--batch", o.batch, "Mini-batch size")
      ->transform(examples::decimal_integer<decltype(o.batch)>())
      ->capture_default_str()
      ->check(CLI::Range(batch_limits.min, batch_limits.max));
  // One string, split here: CLI11's delimiter drops empty fields, which would read "8,,8" as two layers.
  std::string default_hidden;
  for (std::size_t i = 0; i < o.hidden.size(); ++i) default_hidden += (i ? "," : "") + std::to_string(o.hidden[i]);
  app.add_option_function<std::string>(
         "--hidden",
         [&o](const std::string& text) {
           o.hidden = examples::parse_decimal_list("--hidden", text, examples::Limits<int>{1, 1 << 16});
         },
         "Hidden layer widths, comma-separated (e.g. 1024,1024,1024)")
      ->default_str(default_hidden);
  app.add_option("--activation", o.activation, "Hidden activation")
      ->capture_default_str()
      ->check(CLI::IsMember({"relu", "tanh", "gelu"}));
  app.add_option("--lr", o.lr, "Adam learning rate (Kingma & Ba 2015; betas 0.9, 0.999, eps 1e-8)")
      ->capture_default_str()
      ->check(finite_number)
      ->check(CLI::PositiveNumber);
  app.add_option("--dropout", o.dropout, "Dropout probability after each hidden activation (0 = off)")
      ->capture_default_str()
      ->check(finite_number)
      ->check(CLI::Range(dropout_limits.min, dropout_limits.max));
  app.add_option("--threads", o.threads,
                 "Threads of remat's kernels and of OpenBLAS's matrix products (remat::set_num_threads); 0: the "
                 "machine's cores (OMP_NUM_THREADS when set), shared among the MPI ranks on this machine")
      ->transform(examples::decimal_integer<decltype(o.threads)>())
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--limit", o.limit, "Train on the first N training images only (0 = all 60000)")
      ->transform(examples::decimal_integer<decltype(o.limit)>())
      ->capture_default_str()
      ->check(CLI::Range(0L, 100000000L));
  app.add_option("--checkpoint", o.checkpoint,
                 "Gradient checkpointing: none; layer (each hidden layer a region, nothing_saveable); sqrt "
                 "(round(sqrt(L)) segments of the L layers, each a nothing_saveable region); dots (each hidden layer a "
                 "region, dots_saveable); bf16, int8 (every residual kept compressed: bfloat16, or int8 with a scale "
                 "per 64 elements); sign (relu outputs only relu reads, as with --dropout, in one bit)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "layer", "sqrt", "dots", "bf16", "int8", "sign"}));
  app.add_option("--schedule", o.schedule,
                 "Learning-rate schedule: cosine (decay from --lr to 0 over all steps) or constant")
      ->capture_default_str()
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--stop-after", o.stop_after,
                 "Stop after this many epochs in this run, as if interrupted (continue with --resume; 0 = never)")
      ->transform(examples::decimal_integer<decltype(o.stop_after)>())
      ->check(CLI::Range(0, 100000));
  app.add_option("--seed", o.seed, "Seed of the initialisation, shuffling and dropout")
      ->capture_default_str()
      ->transform(examples::decimal_integer<decltype(o.seed)>());
  app.add_flag("--json", o.json, "Print one JSON object with the results as the last line of stdout");
  app.add_option("--save", o.save, "Write parameters and optimizer state to this file after each epoch (atomically)");
  app.add_option("--resume", o.resume, "Continue training from a file written by --save");
  app.add_option("--save-weights", o.save_weights,
                 "Write the weights alone, in the safetensors format, when training ends (atomically): "
                 "layers.I.weight [out,in] and layers.I.bias [out], as PyTorch's nn.Linear in a ModuleList "
                 "`layers` (docs/saving.md)");
  app.add_option("--load-weights", o.load_weights,
                 "Start from the weights in this safetensors file (as --save-weights writes them) instead of "
                 "initialising them from --seed; the optimizer starts afresh. --epochs 0 only evaluates them");
  app.add_flag("--distributed", o.distributed,
               "Data-parallel training over MPI ranks (mpirun -np N mlp --distributed): each rank trains on its "
               "shard of every global batch of --batch rows, gradients are averaged (docs/distributed.md); "
               "only rank 0 prints");
  app.add_flag("--timing", o.timing,
               "Print per epoch the time of a step and of its backward and, with --distributed, the all-reduce: "
               "bytes per step, the fraction of its time hidden behind backward, the wait it adds after backward "
               "(docs/distributed.md)");
  app.add_flag("--estimate", o.estimate,
               "Print the saved and peak bytes of one training step of a full --batch with the --checkpoint mode, "
               "counted from shapes alone (remat::estimate_memory), and exit: no data is read (28x28 inputs), "
               "nothing is trained");
  app.add_flag("--flush-denormal,!--no-flush-denormal", o.flush_denormal,
               "Flush subnormal floats to zero on every thread (remat::set_flush_denormal): without it, Adam's "
               "moments of the weights of almost always black pixels decay into subnormals and later epochs run slower")
      ->capture_default_str();
  app.add_option("--eval-batch", o.eval_batch, "Batch size of the test-set evaluation")
      ->transform(examples::decimal_integer<decltype(o.eval_batch)>())
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (!o.load_weights.empty() && !o.resume.empty()) {
    std::fprintf(stderr, "mlp: error: --resume restores the weights from the state file: drop --load-weights\n");
    return 2;
  }
  if (o.estimate && (o.distributed || !o.resume.empty())) {
    std::fprintf(stderr, "mlp: error: --estimate counts one process's step from the flags given: drop %s\n",
                 o.distributed ? "--distributed" : "--resume");
    return 2;
  }
  return examples::run_main("mlp", o.distributed, argc, argv, [&](const Ranks& ranks) { return run(o, app, ranks); });
}
