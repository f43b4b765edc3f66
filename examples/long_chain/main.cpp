// long_chain: a 1000-step explicit-Euler neural ODE trained with three schedules — the plain tape,
// √n segments (checkpoint_sequential) and binomial checkpointing (revolve) — printing memory, recomputation
// and time per training step for each, and checking that all three train bitwise identically.
//
// Model: dx/dt = tanh(x·W + b), x(0) = input batch, Euler steps of h = 1/n up to t = 1; loss = mean squared
// error of x(1) against a fixed target; plain gradient descent on W and b.
//
// Usage: long_chain [--steps N] [--checkpoints S] [--train-steps K] [--batch B] [--width D]  (--help lists them)
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <remat/nn/linear.hpp>
#include <remat/remat.hpp>

namespace {

struct Options {
  std::int64_t steps = 1000;
  std::int64_t checkpoints = 10;
  int train_steps = 5;
  remat::Index batch = 128;
  remat::Index width = 64;
};

/// A reproducible matrix with entries uniform in [−scale, scale].
remat::Matrix<float> random_matrix(remat::Index rows, remat::Index cols, std::uint64_t seed, float scale) {
  remat::nn::Generator g(seed);
  remat::Matrix<float> m(rows, cols);
  for (remat::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>((2 * g.uniform() - 1) * scale);
  return m;
}

enum class Schedule { plain, sqrt_segments, revolve };
const char* name(Schedule s) {
  switch (s) {
    case Schedule::plain:
      return "plain tape";
    case Schedule::sqrt_segments:
      return "sqrt(n) segments";
    case Schedule::revolve:
      return "revolve";
  }
  return "?";
}

struct Report {
  std::vector<float> losses;
  remat::Matrix<float> final_weight;
  std::size_t peak_bytes = 0, saved_bytes = 0, replayed_ops = 0, replayed_bytes = 0;
  std::int64_t step_recomputations = 0;  // step evaluations in backward, from the schedule
  double milliseconds = 0;               // per training step, the fastest one (robust to a loaded machine)
};

Report train(const Options& o, Schedule schedule) {
  remat::Parameter<float> weight(random_matrix(o.width, o.width, 1, 1.5f / std::sqrt(static_cast<float>(o.width))));
  remat::Parameter<float> bias(random_matrix(1, o.width, 2, 0.1f));
  const remat::Matrix<float> input = random_matrix(o.batch, o.width, 3, 1.0f);
  const remat::Matrix<float> target = random_matrix(o.batch, o.width, 4, 1.0f);
  const double h = 1.0 / static_cast<double>(o.steps);
  const float learning_rate = 0.5f;
  const int segments = static_cast<int>(std::lround(std::sqrt(static_cast<double>(o.steps))));

  Report r;
  remat::Tape<float> tape;
  for (int k = 0; k < o.train_steps; ++k) {
    const auto start = std::chrono::steady_clock::now();
    tape.clear();
    auto w = tape.variable(weight);
    auto b = tape.variable(bias);
    auto step = [&](remat::Var<float> x) { return x + remat::tanh(remat::linear(x, w, b)) * h; };
    auto x = tape.constant(input);
    switch (schedule) {
      case Schedule::plain:
        for (std::int64_t i = 0; i < o.steps; ++i) x = step(x);
        r.step_recomputations = 0;
        break;
      case Schedule::sqrt_segments: {
        const std::vector<std::function<remat::Var<float>(remat::Var<float>)>> layers(static_cast<std::size_t>(o.steps),
                                                                                      step);
        x = remat::checkpoint_sequential(layers, segments, x);
        // Every step outside the last segment is replayed once.
        r.step_recomputations = (segments - 1) * (o.steps / segments);
        break;
      }
      case Schedule::revolve:
        x = remat::revolve(step, x, o.steps, o.checkpoints);
        r.step_recomputations = remat::revolve_recomputations(o.steps, o.checkpoints);
        break;
    }
    auto loss = remat::mse_loss(x, tape.constant(target));
    x = remat::Var<float>();
    r.saved_bytes = tape.memory().saved_bytes;
    r.losses.push_back(loss.item());
    weight.zero_grad();
    bias.zero_grad();
    tape.backward(loss);  // adds into the parameters' gradients
    weight.mutable_value() -= learning_rate * w.grad();
    bias.mutable_value() -= learning_rate * b.grad();
    const auto m = tape.memory();
    r.peak_bytes = m.peak_bytes;
    r.replayed_ops = m.replayed_ops;
    r.replayed_bytes = m.replayed_bytes;
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (k == 0 || ms < r.milliseconds) r.milliseconds = ms;
  }
  r.final_weight = weight.value();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "Trains a 1000-step explicit-Euler neural ODE with the plain tape, sqrt(n) segments and revolve, "
      "printing memory, recomputation and time per training step for each.",
      "long_chain"};
  app.add_option("--steps", o.steps, "Euler steps n of the chain")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--checkpoints", o.checkpoints, "States revolve may store (s)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--train-steps", o.train_steps, "Gradient-descent steps per schedule")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--batch", o.batch, "Rows of the state x")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--width", o.width, "Columns of the state x")->capture_default_str()->check(CLI::Range(1, 1 << 16));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // --help exits 0; a bad flag is a usage error
    return code == 0 ? 0 : 2;
  }
  std::printf(
      "neural ODE, %lld explicit Euler steps, batch %lld x width %lld (one state = %lld B), %d training "
      "steps\n\n",
      static_cast<long long>(o.steps), static_cast<long long>(o.batch), static_cast<long long>(o.width),
      static_cast<long long>(o.batch * o.width * 4), o.train_steps);
  std::printf("%-18s %14s %14s %16s %14s %12s\n", "schedule", "saved B", "peak B", "step re-evals", "replayed ops",
              "ms / step");
  std::vector<Report> reports;
  try {
    for (Schedule s : {Schedule::plain, Schedule::sqrt_segments, Schedule::revolve}) {
      reports.push_back(train(o, s));
      const Report& r = reports.back();
      std::string label = name(s);
      if (s == Schedule::revolve) label += " s=" + std::to_string(o.checkpoints);
      std::printf("%-18s %14zu %14zu %16lld %14zu %12.1f\n", label.c_str(), r.saved_bytes, r.peak_bytes,
                  static_cast<long long>(r.step_recomputations), r.replayed_ops, r.milliseconds);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::printf("\nloss per training step:");
  for (float l : reports[0].losses) std::printf(" %.6f", static_cast<double>(l));
  std::printf("\n");
  bool same = true;
  for (const Report& r : reports)
    same = same && r.losses == reports[0].losses && (r.final_weight.array() == reports[0].final_weight.array()).all();
  std::printf("all schedules train bitwise identically: %s\n", same ? "yes" : "NO");
  return same ? 0 : 1;
}
