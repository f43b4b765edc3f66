// The memory side of Chen, Xu, Zhang & Guestrin, "Training Deep Nets with Sublinear Memory Cost" (2016): the peak
// bytes of one training step (forward + backward) of their ImageNet ResNet at batch 32 × 3×224×224, from 100 to
// 1000 layers, recorded on remat's shapes-only tape (remat::estimate_memory: nothing is computed, no tensor is
// allocated, and the figures are byte for byte what tape.memory() reports on a tape that computes).
//
// The network is the one of Chen et al.'s MXNet example (mxnet-memonger, example_resnet.py): a 7×7/2 convolution of
// 64 channels, batch norm and activation, a 3×3/2 max pooling without padding (224 → 112 → 55), four stages of
// bottleneck blocks of widths 64·2^s (1×1, 3×3 with the stage's stride, 1×1 to 4·64·2^s, each convolution followed by
// batch norm and activation; the first block of a stage has a 1×1 projection shortcut, convolution, batch norm and
// activation; the block's output is shortcut + branch, with no activation after the sum), global average pooling, a
// linear layer to 1000 classes and softmax cross-entropy. Activation: relu (their example's leaky relu keeps the same
// buffers). Their example's stage layout is [3, 24, 36, 3] blocks (200 layers); a depth d here has
// B = round((d − 2) / 3) blocks spread over the stages in those proportions (docs/cnn.md says why), so the depth
// reported is 3B + 2 (1001 for 1000). Weights are recorded before the forward pass, once as tape variables (their
// values and gradients count) and once as Parameters (neither counts once the gradient is delivered); batch norm
// runs in training mode without running statistics.
//
// Means, each one estimate of the whole step:
//   plain     no checkpointing
//   sqrt      remat::checkpoint_sequential over the blocks with round(√B) segments (groups of ⌊B / segments⌋
//             consecutive blocks under policies::nothing_saveable, the last group unchecked): Chen's √n strategy
//   block     each block under checkpoint(nothing_saveable)
//   dots      each block under checkpoint(dots_saveable): convolution outputs kept, batch norm and relu recomputed
//   dtr25     Tape::set_memory_budget at 25 % of plain's peak ("does not fit" if it throws memory_budget_error)
//   dtr_least the least budget a bisection finds the step to fit (to 0.5 % of plain's peak), and the peak under it
//   planner   checkpoint_sequential_auto over the blocks in at most 48 groups, the head and loss as the last layer,
//             at the least budget its model admits (read from the memory_budget_error of a 1-byte budget)
//
//   build/bench/chen_resnet_memory [--depths 100,200,...] [--csv FILE] [--skip sqrt,block,dots,dtr25,dtr_least,planner]
//
// Prints two Markdown tables (weights on the tape, weights as Parameters; GB = 10^9 bytes) on stdout, the seconds
// each estimate took on stderr, and the exact bytes into the CSV (one row per depth and weight placement).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <remat/remat.hpp>
#include <remat/schedule/checkpoint_sequential.hpp>
#include <remat/schedule/checkpoint_sequential_auto.hpp>

namespace {

using remat::Index;
using remat::Shape;
using remat::Tape;
using V = remat::Var<float>;

constexpr Index batch = 32, classes = 1000, image = 224, base_width = 64;
constexpr Index features = 4 * (base_width << 3);  // the last stage's output channels, 2048
constexpr int layout_200[4] = {3, 24, 36, 3};      // Chen et al.'s example, 66 blocks
constexpr int layout_blocks_200 = 66;
constexpr int planner_groups = 48;  // plan_schedule takes at most 60 layers

/// Blocks per stage for `blocks` in all, in the proportions of layout_200 (at least one per stage).
std::vector<int> stage_layout(int blocks) {
  std::vector<int> n(4);
  int sum = 0;
  for (int s = 0; s < 4; ++s) {
    n[static_cast<std::size_t>(s)] =
        std::max(1, static_cast<int>(std::lround(double(blocks) * layout_200[s] / layout_blocks_200)));
    sum += n[static_cast<std::size_t>(s)];
  }
  n[2] += blocks - sum;  // the largest stage takes the rounding
  return n;
}

/// One bottleneck block's shapes: input channels, width f (output 4f), stride, projection or identity shortcut.
struct BlockSpec {
  Index in, width, stride;
  bool projection;
};

/// A convolution and the batch norm after it, as tape variables.
struct ConvBn {
  V w, gamma, beta;
};

struct BlockWeights {
  ConvBn c1, c2, c3, shortcut;  // shortcut only with a projection
};

/// Where the weights live: tape variables (their values and gradients are tape buffers, counted) or Parameters
/// (referenced by the tape, values not counted, each gradient handed to its Parameter as soon as the sweep has
/// passed the weight's first reader, and not counted from then on).
enum class Weights { tape, parameters };

/// The network's shapes and, once record() has run on a tape, its weights there.
class Network {
 public:
  Network(int blocks, Weights weights) : layout_(stage_layout(blocks)), weights_kind_(weights) {
    Index in = base_width;
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i < layout_[static_cast<std::size_t>(s)]; ++i) {
        const Index width = base_width << s;
        specs_.push_back({in, width, s > 0 && i == 0 ? 2 : 1, i == 0});
        in = 4 * width;
      }
  }

  const std::vector<int>& layout() const { return layout_; }
  int blocks() const { return static_cast<int>(specs_.size()); }
  int depth() const { return 3 * blocks() + 2; }

  /// Bytes of the weights (float32): convolutions, batch norms' γ and β, the linear layer.
  std::size_t parameter_bytes() const {
    std::size_t n = conv_bn_numel(3, base_width, 7) + std::size_t(features * classes + classes);
    for (const BlockSpec& b : specs_) {
      n +=
          conv_bn_numel(b.in, b.width, 1) + conv_bn_numel(b.width, b.width, 3) + conv_bn_numel(b.width, 4 * b.width, 1);
      if (b.projection) n += conv_bn_numel(b.in, 4 * b.width, 1);
    }
    return n * sizeof(float);
  }

  /// Records every weight before the forward pass, so the layers' ops read leaves recorded outside any checkpoint
  /// region: tape variables whose values are read from a buffer of zeros (a shapes-only tape reads none), or
  /// Parameters of zeros, made on the first call and referenced by later ones.
  void record(Tape<float>& tape) {
    next_parameter_ = 0;
    stem_ = conv_bn(tape, 3, base_width, 7);
    weights_.clear();
    for (const BlockSpec& b : specs_) {
      BlockWeights w;
      w.c1 = conv_bn(tape, b.in, b.width, 1);
      w.c2 = conv_bn(tape, b.width, b.width, 3);
      w.c3 = conv_bn(tape, b.width, 4 * b.width, 1);
      if (b.projection) w.shortcut = conv_bn(tape, b.in, 4 * b.width, 1);
      weights_.push_back(w);
    }
    fc_w_ = weight(tape, Shape{features, classes});
    fc_b_ = weight(tape, Shape{classes});
  }

  /// The batch of images [32, 3, 224, 224], a constant of zeros.
  V input(Tape<float>& tape) { return tape.constant(Shape{batch, 3, image, image}, zeros(batch * 3 * image * image)); }

  /// conv 7×7/2 → batch norm → relu → max pool 3×3/2: [32, 3, 224, 224] → [32, 64, 55, 55].
  V stem(const V& x) const {
    const V h = unit(x, stem_, remat::Conv2dOptions().stride(2).padding(3));
    return remat::max_pool2d(h, remat::MaxPool2dOptions(3).stride(2));
  }

  /// Bottleneck block k.
  V block(int k, const V& x) const {
    const BlockSpec& b = specs_[static_cast<std::size_t>(k)];
    const BlockWeights& w = weights_[static_cast<std::size_t>(k)];
    V h = unit(x, w.c1, remat::Conv2dOptions());
    h = unit(h, w.c2, remat::Conv2dOptions().stride(b.stride).padding(1));
    h = unit(h, w.c3, remat::Conv2dOptions());
    const V shortcut = b.projection ? unit(x, w.shortcut, remat::Conv2dOptions().stride(b.stride)) : x;
    return shortcut + h;
  }

  /// Global average pooling → linear → cross-entropy: the [1,1] loss.
  V head(const V& h, const std::vector<int>& labels) const {
    const V pooled = remat::flatten(remat::adaptive_avg_pool2d(h, {1, 1}), 1);  // [32, 2048]
    return remat::cross_entropy(remat::linear(pooled, fc_w_, fc_b_), labels);
  }

 private:
  static std::size_t conv_bn_numel(Index in, Index out, Index k) { return std::size_t(out * in * k * k + 2 * out); }

  const float* zeros(Index n) {
    if (static_cast<Index>(zeros_.size()) < n) zeros_.assign(static_cast<std::size_t>(n), 0.0f);
    return zeros_.data();
  }

  /// A weight of `shape` on `tape`, as weights_kind_ says.
  V weight(Tape<float>& tape, const Shape& shape) {
    if (weights_kind_ == Weights::tape) return tape.variable(shape, zeros(shape.numel()));
    if (next_parameter_ == parameters_.size()) {
      if (shape.rank() == 4) {
        remat::Tensor<float, 4> t(shape[0], shape[1], shape[2], shape[3]);
        t.setZero();
        parameters_.emplace_back(t);
      } else if (shape.rank() == 1) {
        remat::Tensor<float, 1> t(shape[0]);
        t.setZero();
        parameters_.emplace_back(t);
      } else {
        parameters_.emplace_back(remat::Matrix<float>::Zero(shape[0], shape[1]));
      }
    }
    return tape.variable(parameters_[next_parameter_++]);
  }

  ConvBn conv_bn(Tape<float>& tape, Index in, Index out, Index k) {
    ConvBn c;
    c.w = weight(tape, Shape{out, in, k, k});
    c.gamma = weight(tape, Shape{out});
    c.beta = weight(tape, Shape{out});
    return c;
  }

  /// conv → batch norm (training: batch statistics) → relu.
  static V unit(const V& x, const ConvBn& c, const remat::Conv2dOptions& options) {
    const V y = remat::conv2d(x, c.w, options);
    const auto bn = remat::BatchNormFuncOptions<float>().training(true).weight(c.gamma).bias(c.beta);
    return remat::relu(remat::batch_norm(y, nullptr, nullptr, bn));
  }

  std::vector<int> layout_;
  Weights weights_kind_;
  std::vector<remat::Parameter<float>> parameters_;  // Weights::parameters, in recording order
  std::size_t next_parameter_ = 0;
  std::vector<BlockSpec> specs_;
  ConvBn stem_;
  std::vector<BlockWeights> weights_;
  V fc_w_, fc_b_;
  std::vector<float> zeros_;
};

enum class Mode { plain, sqrt, block, dots, dtr, planner };

/// One means' figures.
struct Result {
  bool done = false;
  std::size_t peak = 0;
  std::size_t budget = 0;  // dtr: the budget that ran; planner: its least budget
  double seconds = 0;
};

/// The step's memory with `mode`; `budget` for dtr (the tape's budget) and planner (checkpoint_sequential_auto's).
remat::MemoryEstimate estimate(Network& net, Mode mode, std::size_t budget) {
  const std::vector<int> labels(static_cast<std::size_t>(batch), 0);
  return remat::estimate_memory([&](Tape<float>& tape) {
    if (mode == Mode::dtr) tape.set_memory_budget(budget);
    net.record(tape);
    V h = net.stem(net.input(tape));
    const int n = net.blocks();
    auto block = [&net](int k) { return [&net, k](const V& in) { return net.block(k, in); }; };
    switch (mode) {
      case Mode::plain:
      case Mode::dtr:
        for (int k = 0; k < n; ++k) h = net.block(k, h);
        break;
      case Mode::block:
      case Mode::dots:
        for (int k = 0; k < n; ++k)
          h = mode == Mode::block ? remat::checkpoint(block(k), remat::policies::nothing_saveable)(h)
                                  : remat::checkpoint(block(k), remat::policies::dots_saveable)(h);
        break;
      case Mode::sqrt: {
        std::vector<std::function<V(V)>> layers;
        for (int k = 0; k < n; ++k) layers.push_back(block(k));
        const int segments = std::max(1, static_cast<int>(std::lround(std::sqrt(double(n)))));
        h = remat::checkpoint_sequential(layers, segments, h);
        break;
      }
      case Mode::planner: {
        // Groups of consecutive blocks as the chain's layers, the head and the loss as its last.
        const int groups = std::min(n, planner_groups);
        std::vector<std::function<V(V)>> layers;
        for (int g = 0; g < groups; ++g) {
          const int first = g * n / groups, last = (g + 1) * n / groups;
          layers.push_back([&net, first, last](V in) {
            for (int k = first; k < last; ++k) in = net.block(k, in);
            return in;
          });
        }
        layers.push_back([&net, &labels](const V& in) { return net.head(in, labels); });
        return remat::checkpoint_sequential_auto(layers, h, budget);
      }
    }
    return net.head(h, labels);
  });
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Result run(Network& net, Mode mode, std::size_t budget = 0) {
  const auto start = std::chrono::steady_clock::now();
  Result r;
  r.peak = estimate(net, mode, budget).peak_bytes;
  r.done = true;
  r.budget = budget;
  r.seconds = seconds_since(start);
  return r;
}

/// DTR's least feasible budget, by bisection between `lo` (does not fit) and `hi` (fits) to `step` bytes: the
/// result's budget fits, a budget `step` below it did not. A failure's least_budget_bytes() is no bound here: it
/// holds for the failing call from the state that budget's evictions reached, and another budget evicts otherwise
/// (at depth 101, 755.5 MB fits where a 728.6 MB run failed naming 798.7 MB). Nor is DTR's success guaranteed to
/// be monotone in the budget, so this is the least budget of the bisection's path, not a proven least.
Result dtr_least(Network& net, std::size_t lo, std::size_t hi, std::size_t step) {
  const auto start = std::chrono::steady_clock::now();
  Result best = run(net, Mode::dtr, hi);
  while (hi - lo > step) {
    const std::size_t mid = lo + (hi - lo) / 2;
    try {
      // Into a fresh object, then copied: with `best = run(...)`, GCC 12 at -O1 and above left best's done and
      // budget zeroed after a later run threw (not at -O0; not root-caused: a small imitation does not show it).
      const Result fits = run(net, Mode::dtr, mid);
      best = fits;
      hi = mid;
    } catch (const remat::memory_budget_error&) {
      lo = mid;
    }
  }
  best.seconds = seconds_since(start);
  return best;
}

/// checkpoint_sequential_auto at the least budget its model admits.
Result run_planner(Network& net) {
  const auto start = std::chrono::steady_clock::now();
  std::size_t least = 0;
  try {
    run(net, Mode::planner, 1);
    throw std::logic_error("checkpoint_sequential_auto accepted a 1-byte budget");
  } catch (const remat::memory_budget_error& e) {
    least = e.least_budget_bytes();
  }
  Result r = run(net, Mode::planner, least);
  r.seconds = seconds_since(start);
  return r;
}

std::string gb(std::size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", double(bytes) / 1e9);
  return s;
}

std::vector<int> parse_ints(const std::string& list) {
  std::vector<int> v;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoi(item));
  return v;
}

const char* const means[] = {"plain", "sqrt", "block", "dots", "dtr25", "dtr_least", "planner"};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> depths;
  for (int d = 100; d <= 1000; d += 100) depths.push_back(d);
  std::string csv_path, skip;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--depths" && i + 1 < argc) {
      depths = parse_ints(argv[++i]);
    } else if (a == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
    } else if (a == "--skip" && i + 1 < argc) {
      skip = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: chen_resnet_memory [--depths 100,200,...] [--csv FILE] "
                   "[--skip sqrt,block,dots,dtr25,dtr_least,planner]\n");
      return 2;
    }
  }
  const auto skipped = [&skip](const std::string& m) {
    return ("," + skip + ",").find("," + m + ",") != std::string::npos;
  };
  FILE* csv = nullptr;
  if (!csv_path.empty()) {
    csv = std::fopen(csv_path.c_str(), "w");
    if (!csv) {
      std::perror(csv_path.c_str());
      return 1;
    }
    std::fprintf(csv, "weights,depth,blocks,layout,parameter_bytes");
    for (const char* m : means) std::fprintf(csv, ",%s_peak_bytes", m);
    std::fprintf(csv, ",dtr25_budget_bytes,dtr_least_budget_bytes,planner_least_budget_bytes\n");
  }
  const std::string header =
      "| depth | blocks per stage | weights | plain | √n segments | per-block nothing_saveable | per-block "
      "dots_saveable | DTR at 25 % of plain | DTR at its least budget | planner at its least budget |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  std::string tables[2];
  const auto total = std::chrono::steady_clock::now();
  try {
    for (const int d : depths) {
      const int blocks = std::max(4, static_cast<int>(std::lround((d - 2) / 3.0)));
      for (const Weights kind : {Weights::tape, Weights::parameters}) {
        Network net(blocks, kind);
        const char* kind_name = kind == Weights::tape ? "tape" : "parameters";
        std::map<std::string, Result> r;
        const auto timed = [&](const std::string& name, auto&& f) {
          if (name != "plain" && skipped(name)) return;
          try {
            r[name] = f();
            std::fprintf(stderr, "depth %d, weights %s, %s: peak %zu B, %.2f s\n", net.depth(), kind_name, name.c_str(),
                         r[name].peak, r[name].seconds);
          } catch (const remat::memory_budget_error& e) {
            std::fprintf(stderr, "depth %d, weights %s, %s: %s\n", net.depth(), kind_name, name.c_str(), e.what());
          }
        };
        const std::size_t plain = (timed("plain", [&] { return run(net, Mode::plain); }), r["plain"].peak);
        timed("sqrt", [&] { return run(net, Mode::sqrt); });
        timed("block", [&] { return run(net, Mode::block); });
        timed("dots", [&] { return run(net, Mode::dots); });
        timed("dtr25", [&] { return run(net, Mode::dtr, plain / 4); });
        timed("dtr_least", [&] {
          const std::size_t step = plain / 200;  // to 0.5 % of plain's peak
          return r["dtr25"].done ? dtr_least(net, 0, plain / 4, step) : dtr_least(net, plain / 4, plain, step);
        });
        timed("planner", [&] { return run_planner(net); });
        const auto cell = [&](const std::string& name) -> std::string {
          const Result& x = r[name];
          if (!x.done) return name == "dtr25" && !skipped(name) ? "does not fit" : "—";
          return gb(x.peak) + " (" + std::to_string(std::lround(100.0 * double(x.peak) / double(plain))) + " %)";
        };
        const auto with_budget = [&](const std::string& name) {
          return r[name].done ? "budget " + gb(r[name].budget) + ": " + cell(name) : cell(name);
        };
        const std::vector<int>& l = net.layout();
        const std::string layout =
            std::to_string(l[0]) + "-" + std::to_string(l[1]) + "-" + std::to_string(l[2]) + "-" + std::to_string(l[3]);
        tables[kind == Weights::tape ? 0 : 1] +=
            "| " + std::to_string(net.depth()) + " | " + layout + " | " + gb(net.parameter_bytes()) + " | " +
            gb(plain) + " | " + cell("sqrt") + " | " + cell("block") + " | " + cell("dots") + " | " + cell("dtr25") +
            " | " + with_budget("dtr_least") + " | " + with_budget("planner") + " |\n";
        if (csv) {
          std::fprintf(csv, "%s,%d,%d,%s,%zu", kind_name, net.depth(), blocks, layout.c_str(), net.parameter_bytes());
          for (const char* m : means) std::fprintf(csv, ",%s", r[m].done ? std::to_string(r[m].peak).c_str() : "");
          for (const char* m : {"dtr25", "dtr_least", "planner"})
            std::fprintf(csv, ",%s", r[m].done ? std::to_string(r[m].budget).c_str() : "");
          std::fprintf(csv, "\n");
          std::fflush(csv);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chen_resnet_memory: %s\n", e.what());
    return 1;
  }
  if (csv) std::fclose(csv);
  std::printf(
      "Chen et al. (2016)'s ImageNet ResNet, batch %lld × 3×%lld×%lld, float32: peak bytes of one training step "
      "(forward + backward), from shapes (remat::estimate_memory); GB = 10^9 B, %% of plain's peak.\n\n",
      static_cast<long long>(batch), static_cast<long long>(image), static_cast<long long>(image));
  std::printf("Weights as tape variables (their values and gradients counted):\n\n%s%s\n", header.c_str(),
              tables[0].c_str());
  std::printf("Weights as Parameters (neither their values nor their delivered gradients counted):\n\n%s%s",
              header.c_str(), tables[1].c_str());
  std::fprintf(stderr, "total %.1f s\n", seconds_since(total));
  return 0;
}
