// Trains a residual network (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016) on
// Fashion-MNIST with remat: basic blocks of conv2d, batch_norm and relu, global average pooling, and the blocks
// optionally checkpointed. See docs/resnet.md for the flags, the measured numbers and how to reproduce them.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <remat/io/safetensors.hpp>
#include <remat/remat.hpp>

#include "../common/report.hpp"
#include "../common/state_file.hpp"
#include "../common/threads.hpp"
#include "../mlp/idx.hpp"
#include "resnet.hpp"

namespace {

using remat::Shape;
using remat::Tape;
using resnet::classes;
using resnet::ResNet;
using resnet::side;
using resnet::V;

struct Options {
  std::string data = "/usr/share/datasets/fashion-mnist";
  int epochs = 9;
  int batch = 128;
  double lr = 0.1;  // the one-cycle schedule's peak
  double momentum = 0.9;
  double weight_decay = 5e-4;
  int width = 16;
  int blocks = 2;  // basic blocks per stage: ResNet-(6·blocks + 2), ResNet-14 by default
  int threads = 0;
  long limit = 0;       // train on the first `limit` images (0: all)
  long test_limit = 0;  // evaluate on the first `test_limit` test images (0: all 10,000)
  std::uint64_t seed = 1;
  std::string checkpoint = "none";
  bool json = false;
  bool estimate = false;
  std::string save, load;
};

/// The images as [count, 784] normalised by the training set's mean and standard deviation.
struct Data {
  mlp::Dataset train, test;
  float mean = 0, std = 1;
};

Data load(const Options& o) {
  Data d{mlp::read_idx_dataset(o.data, "train", classes), mlp::read_idx_dataset(o.data, "t10k", classes)};
  if (o.limit > 0 && o.limit < d.train.images.rows()) {
    d.train.images.conservativeResize(o.limit, Eigen::NoChange);
    d.train.labels.resize(static_cast<std::size_t>(o.limit));
  }
  if (o.test_limit > 0 && o.test_limit < d.test.images.rows()) {
    d.test.images.conservativeResize(o.test_limit, Eigen::NoChange);
    d.test.labels.resize(static_cast<std::size_t>(o.test_limit));
  }
  const double mean = d.train.images.cast<double>().mean();
  const double var = (d.train.images.cast<double>().array() - mean).square().mean();
  d.mean = static_cast<float>(mean);
  d.std = static_cast<float>(std::sqrt(var));
  for (auto* images : {&d.train.images, &d.test.images}) images->array() = (images->array() - d.mean) / d.std;
  return d;
}

/// Test accuracy in evaluation mode (running statistics) without gradients, batches of 1000.
double evaluate(ResNet& net, const mlp::Dataset& test) {
  Tape<float> tape;
  tape.set_training(false);
  remat::NoGradGuard<float> no_grad(tape);
  long correct = 0;
  const remat::Index n = test.images.rows();
  for (remat::Index first = 0; first < n; first += 1000) {
    const remat::Index m = std::min<remat::Index>(1000, n - first);
    const remat::Matrix<float> batch = test.images.middleRows(first, m);
    const V logits = resnet::forward("none", tape, net, tape.constant(Shape{m, 1, side, side}, batch.data()));
    const remat::Matrix<float> l = logits.value();
    for (remat::Index i = 0; i < m; ++i) {
      remat::Index best = 0;
      l.row(i).maxCoeff(&best);
      correct += best == test.labels[static_cast<std::size_t>(first + i)];
    }
    tape.clear();
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

/// "none", "block", "dots", "sqrt" or "budget=<bytes>": the budget's bytes, 0 for the others.
std::size_t budget_bytes(const std::string& mode) {
  if (mode.rfind("budget=", 0) != 0) return 0;
  return static_cast<std::size_t>(std::stoull(mode.substr(7)));
}

/// --estimate: one training step's memory on a shapes-only tape, no data read.
int estimate(const Options& o) {
  remat::nn::Generator g(o.seed);
  ResNet net(o.width, o.blocks, g);
  const std::vector<int> labels(static_cast<std::size_t>(o.batch), 0);
  const remat::Matrix<float> zeros = remat::Matrix<float>::Zero(o.batch, side * side);
  const remat::MemoryEstimate e = remat::estimate_memory([&](Tape<float>& tape) {
    if (budget_bytes(o.checkpoint) > 0) tape.set_memory_budget(budget_bytes(o.checkpoint));
    const V x = tape.constant(Shape{o.batch, 1, side, side}, zeros.data());
    return remat::cross_entropy(resnet::forward(o.checkpoint, tape, net, x), labels);
  });
  std::printf(
      "ResNet width %d, %d block(s) per stage, batch %d, checkpoint %s: one training step, estimated from "
      "shapes\n",
      o.width, o.blocks, o.batch, o.checkpoint.c_str());
  examples::print_estimate(e, o.json, "saved_bytes", "peak_bytes",
                           "\"checkpoint\":\"" + o.checkpoint + "\",\"batch\":" + std::to_string(o.batch));
  return 0;
}

/// The network's weights and batch-norm statistics under the names PyTorch's state_dict gives the reference
/// model's (bench/peers/resnet_fashion_mnist.py): "conv.weight", "bn.*", "blocks.K.conv1.weight", "blocks.K.bn1.*",
/// "blocks.K.shortcut.0.weight", "blocks.K.shortcut.1.*", "fc.weight", "fc.bias".
std::vector<remat::safetensors::Entry> weight_entries(ResNet& net) {
  namespace st = remat::safetensors;
  std::vector<st::Entry> entries;
  auto add = [&](std::vector<st::Entry> more) { entries.insert(entries.end(), more.begin(), more.end()); };
  add(st::torch_conv2d("conv", net.stem));
  add(st::torch_batch_norm2d("bn", net.stem_bn));
  for (std::size_t k = 0; k < net.blocks.size(); ++k) {
    resnet::BasicBlock& b = net.blocks[k];
    const std::string prefix = "blocks." + std::to_string(k);
    add(st::torch_conv2d(prefix + ".conv1", b.conv1));
    add(st::torch_batch_norm2d(prefix + ".bn1", b.bn1));
    add(st::torch_conv2d(prefix + ".conv2", b.conv2));
    add(st::torch_batch_norm2d(prefix + ".bn2", b.bn2));
    if (!b.shortcut_conv.empty()) {
      add(st::torch_conv2d(prefix + ".shortcut.0", b.shortcut_conv[0]));
      add(st::torch_batch_norm2d(prefix + ".shortcut.1", b.shortcut_bn[0]));
    }
  }
  add(st::torch_linear("fc", net.fc));
  return entries;
}

int train(const Options& o) {
  if (!o.save.empty()) examples::check_state_destination(o.save);  // before an epoch is spent
  const Data data = load(o);
  remat::nn::Generator g(o.seed);
  ResNet net(o.width, o.blocks, g);
  if (!o.load.empty()) {
    // Strict: every tensor of PyTorch's state_dict is named, each batch norm's num_batches_tracked included.
    remat::safetensors::load(o.load, weight_entries(net));
  }
  std::vector<remat::Parameter<float>*> decayed, other;
  net.parameters(decayed, other);
  remat::nn::SGD<float> sgd({{decayed}, {other, 0.0}}, {o.lr, o.momentum, o.weight_decay, true});
  const remat::Index n = data.train.images.rows();
  const std::int64_t steps_per_epoch = (n + o.batch - 1) / o.batch;
  // As the PyTorch reference (bench/peers/resnet_fashion_mnist.py): OneCycleLR with pct_start 0.25 and a fixed
  // momentum (cycle_momentum=False).
  // At least 8 steps: the schedule needs pct_start · total_steps > 1 (a run of --epochs 0 or a few images has fewer).
  const remat::nn::OneCycleSchedule schedule(o.lr, std::max<std::int64_t>(8, steps_per_epoch * o.epochs), 0.25);
  std::printf(
      "ResNet width %d, %d block(s) per stage, %lld training images, batch %d, %d epochs, checkpoint %s, "
      "%d threads\n",
      o.width, o.blocks, static_cast<long long>(n), o.batch, o.epochs, o.checkpoint.c_str(), remat::num_threads());
  std::vector<remat::Index> order(static_cast<std::size_t>(n));
  remat::Matrix<float> batch(o.batch, side * side);
  std::vector<int> labels;
  Tape<float> tape;
  if (budget_bytes(o.checkpoint) > 0) tape.set_memory_budget(budget_bytes(o.checkpoint));
  std::int64_t step = 0;
  double last_loss = 0, accuracy = 0, total_seconds = 0;
  std::size_t saved = 0, peak = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    std::iota(order.begin(), order.end(), 0);
    for (remat::Index i = n - 1; i > 0; --i)  // Fisher–Yates with the model's generator
      std::swap(order[static_cast<std::size_t>(i)], order[g.below(static_cast<std::uint64_t>(i + 1))]);
    double loss_sum = 0;
    for (remat::Index first = 0; first < n; first += o.batch) {
      const remat::Index m = std::min<remat::Index>(o.batch, n - first);
      labels.resize(static_cast<std::size_t>(m));
      for (remat::Index i = 0; i < m; ++i) {
        const remat::Index k = order[static_cast<std::size_t>(first + i)];
        batch.row(i) = data.train.images.row(k);
        labels[static_cast<std::size_t>(i)] = data.train.labels[static_cast<std::size_t>(k)];
      }
      tape.clear();
      const V x = tape.constant(Shape{m, 1, side, side}, batch.data());
      const V loss = remat::cross_entropy(resnet::forward(o.checkpoint, tape, net, x), labels);
      saved = std::max(saved, tape.memory().saved_bytes);
      tape.backward(loss);
      peak = std::max(peak, tape.memory().peak_bytes);
      loss_sum += loss.item() * static_cast<double>(m);
      sgd.set_learning_rate(schedule.learning_rate_at(step));
      sgd.step();
      sgd.zero_grad();
      ++step;
    }
    tape.clear();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    total_seconds += seconds;
    last_loss = loss_sum / static_cast<double>(n);
    accuracy = evaluate(net, data.test);
    std::printf("epoch %d: loss %s, test accuracy %.2f %%, %.1f s, saved %s, peak %s\n", epoch,
                examples::number(last_loss).c_str(), 100 * accuracy, seconds, examples::megabytes(saved).c_str(),
                examples::megabytes(peak).c_str());
    std::fflush(stdout);
  }
  if (o.epochs == 0) {  // evaluation only, of the initial or --load'ed weights
    accuracy = evaluate(net, data.test);
    std::printf("test accuracy %.2f %%\n", 100 * accuracy);
  }
  if (!o.save.empty()) remat::safetensors::save(o.save, weight_entries(net), {{"format", "pt"}});
  if (o.json)
    std::printf(
        "{\"final_loss\":%s,\"test_accuracy\":%s,\"train_seconds\":%s,\"saved_bytes\":%zu,\"peak_bytes\":%zu,"
        "\"checkpoint\":\"%s\",\"epochs\":%d,\"batch\":%d,\"threads\":%d}\n",
        examples::number(last_loss).c_str(), examples::number(accuracy).c_str(),
        examples::number(total_seconds).c_str(), saved, peak, o.checkpoint.c_str(), o.epochs, o.batch,
        remat::num_threads());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Trains a residual network on Fashion-MNIST with remat, optionally checkpointing its blocks, and "
      "reports accuracy, time and the memory the tape saved and peaked at per step.",
      "resnet"};
  app.add_option("--data", o.data, "directory of Fashion-MNIST's idx files")->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the training set")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--batch", o.batch, "images per step")->capture_default_str()->check(CLI::Range(2, 1 << 16));
  app.add_option("--lr", o.lr, "the one-cycle schedule's peak learning rate")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 10.0));
  app.add_option("--weight-decay", o.weight_decay, "L2 penalty of the conv and linear weights")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--width", o.width, "channels of the first stage (then 2x, 4x)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--blocks", o.blocks, "basic blocks per stage")->capture_default_str()->check(CLI::Range(1, 1000));
  app.add_option("--threads", o.threads, "remat's threads (0: the cores)")
      ->capture_default_str()
      ->check(CLI::Range(0, 256));
  app.add_option("--limit", o.limit, "train on the first N images (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(0L, 60000L));
  app.add_option("--test-limit", o.test_limit, "evaluate on the first N test images (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(0L, 10000L));
  app.add_option("--seed", o.seed, "initialisation and shuffling seed")->capture_default_str();
  app.add_option("--checkpoint", o.checkpoint,
                 "none, block (each block, nothing_saveable), dots (each block, dots_saveable: keeps the "
                 "convolutions), sqrt (segments of about sqrt(blocks) blocks), bf16 or int8 (each block keeps its "
                 "residuals compressed: bfloat16, or int8 with a scale per 64 elements) or budget=<bytes> (a memory "
                 "budget)")
      ->capture_default_str()
      ->check([](const std::string& m) {
        if (m == "none" || m == "block" || m == "dots" || m == "sqrt" || m == "bf16" || m == "int8")
          return std::string();
        if (m.rfind("budget=", 0) == 0 && m.size() > 7 && m.find_first_not_of("0123456789", 7) == std::string::npos)
          return std::string();
        return std::string("must be none, block, dots, sqrt, bf16, int8 or budget=<bytes>");
      });
  app.add_option("--save", o.save,
                 "write the weights and batch-norm statistics to this safetensors file after training, under "
                 "PyTorch's state_dict names for the same model");
  app.add_option("--load", o.load,
                 "start from the weights and batch-norm statistics of this safetensors file (--epochs 0: evaluate "
                 "them only)");
  app.add_flag("--json", o.json, "print a JSON line of the results at the end");
  app.add_flag("--estimate", o.estimate, "print one step's memory from shapes alone, train nothing");
  CLI11_PARSE(app, argc, argv);
  remat::set_num_threads(o.threads > 0 ? o.threads : examples::default_threads(1));
  try {
    return o.estimate ? estimate(o) : train(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet: %s\n", e.what());
    return 1;
  }
}
