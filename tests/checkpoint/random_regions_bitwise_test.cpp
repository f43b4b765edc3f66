// Checkpointed random programs against the same programs recorded plainly: random programs (random ops,
// random broadcasting operands, random nested checkpoint regions with random policies, regions returning
// captured values / inputs / duplicates) recorded with and without checkpoint(). The loss and every variable's gradient
// must be bitwise equal; a retained second backward must give the same bits again; print_saved_residuals' total must
// equal memory().saved_bytes; clear() must return live_bytes to 0. In double, gradients also match central finite
// differences.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "remat/remat.hpp"

// Named after the file: this directory's test files are compiled as one translation unit (tests/CMakeLists.txt).
namespace random_regions_bitwise_test {

using remat::Matrix;
using remat::Tape;
using remat::Var;

constexpr remat::Index R = 3, C = 4;

template <class T>
struct Leaves {
  std::vector<Matrix<T>> values;  // one per variable, created in order
};

// A deterministic program generator/executor. All choices come from `rng`; f bodies are called exactly
// once in the forward pass in both modes, so both modes draw the same sequence.
template <class T>
class Program {
 public:
  Program(std::uint64_t seed, bool use_checkpoint, bool smooth_only)
      : rng_(seed),
        policy_rng_(std::make_shared<std::mt19937_64>(seed ^ 0x9e37)),
        checkpoint_(use_checkpoint),
        smooth_(smooth_only) {}

  // Records the program on `tape`; returns the loss. `vars` receives every variable leaf.
  Var<T> record(Tape<T>& tape, std::vector<Var<T>>& vars, const std::vector<Matrix<T>>* override_values = nullptr) {
    tape_ = &tape;
    vars_ = &vars;
    override_ = override_values;
    std::vector<Var<T>> env;
    for (int i = 0; i < 3; ++i) env.push_back(leaf(R, C));
    row_ = leaf(1, C);
    col_ = leaf(R, 1);
    scalar_ = leaf(1, 1);
    w_ = leaf(C, C);
    gain_ = leaf(1, C);
    bias_ = leaf(1, C);
    body(env, 0, 10 + pick(10));
    // Every value reaches the loss, so every region output receives a gradient.
    Var<T> loss = remat::mean(remat::square(env.back()));
    for (std::size_t k = 0; k + 1 < env.size(); ++k) loss = loss + remat::mean(env[k]) * (0.25 + 0.5 * pick(2));
    return loss;
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<std::uint64_t>(n)); }

  Var<T> leaf(remat::Index r, remat::Index c) {
    Matrix<T> m(r, c);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (remat::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(u(rng_));
    const std::size_t k = vars_->size();
    if (override_) m = (*override_)[k];
    vars_->push_back(tape_->variable(m));
    return vars_->back();
  }

  Var<T> any(const std::vector<Var<T>>& env) {
    return env[static_cast<std::size_t>(pick(static_cast<int>(env.size())))];
  }

  Var<T> op(const std::vector<Var<T>>& env) {
    const Var<T> a = any(env);
    const Var<T> b = any(env);
    const int n_ops = 26;
    for (;;) {
      switch (pick(n_ops)) {
        case 0:
          return remat::tanh(a);
        case 1:
          return remat::sin(a);
        case 2:
          return remat::exp(remat::tanh(a));
        case 3:
          return remat::sigmoid(a);
        case 4:
          if (smooth_) continue;
          return remat::relu(a);
        case 5:
          return remat::gelu(a);
        case 6:
          return remat::square(a) * 0.5;
        case 7:
          if (smooth_) continue;
          return remat::abs(a);
        case 8:
          return remat::softplus(a) - 0.5;
        case 9:
          return -a;
        case 10:
          return a * b;
        case 11:
          return a + b;
        case 12:
          return a - b;
        case 13:
          return a / (remat::sigmoid(b) + 1.0);
        case 14:
          return remat::tanh(remat::matmul(a, w_));
        case 15:
          return remat::linear(a, w_, bias_);
        case 16:
          return remat::layer_norm(a, gain_, bias_);
        case 17:
          return remat::dropout(a, 0.25);
        case 18:
          return remat::softmax(a);
        case 19:
          return remat::log_softmax(a) * 0.25;
        case 20:
          return remat::checkpoint_name(a, pick(2) ? "a" : "b");
        case 21: {  // broadcasting with a row, a column or a scalar, on either side
          const Var<T>& s = pick(3) == 0 ? row_ : (pick(2) ? col_ : scalar_);
          switch (pick(4)) {
            case 0:
              return pick(2) ? a + s : s + a;
            case 1:
              return pick(2) ? a * s : s * a;
            case 2:
              return pick(2) ? a - s : s - a;
            default:
              return pick(2) ? a / (remat::sigmoid(s) + 1.0) : s / (remat::sigmoid(a) + 1.0);
          }
        }
        case 22:
          return a * remat::sum_rows(b);  // [R,C] * [R,1]
        case 23:
          return a * remat::mean(b);  // [R,C] * [1,1]
        case 24: {                    // a loss inside: cross_entropy has an op-specific residual (its softmax)
          return a + remat::cross_entropy(b, {0, 3, 1}) * 0.1;
        }
        case 25:
          return remat::sqrt(remat::square(a) + 1.0) + remat::pow(remat::sigmoid(b) + 0.5, 1.5);
      }
    }
  }

  std::function<bool(const remat::OpInfo&)> random_policy() {
    switch (pick(7)) {
      case 0:
        return remat::policies::nothing_saveable;
      case 1:
        return remat::policies::everything_saveable;
      case 2:
        return remat::policies::dots_saveable;
      case 3:
        return remat::policies::save_only_these_names({"a"});
      case 4:
        return remat::policies::save_any_names_but_these({"a"});
      case 5:
        return remat::policies::save_from_both_policies(remat::policies::dots_saveable,
                                                        remat::policies::save_only_these_names({"b"}));
      default: {
        auto r = policy_rng_;
        return [r](const remat::OpInfo&) { return ((*r)() & 1u) != 0; };
      }
    }
  }

  // Appends `count` instructions' results to env.
  void body(std::vector<Var<T>>& env, int depth, int count) {
    for (int i = 0; i < count; ++i) {
      if (depth < 4 && pick(4) == 0) {
        region(env, depth);
      } else {
        env.push_back(op(env));
      }
    }
  }

  void region(std::vector<Var<T>>& env, int depth) {
    const Var<T> x = any(env), y = any(env);
    const int n = 1 + pick(6);
    const int policy_choice_draws = 1;
    (void)policy_choice_draws;
    auto policy = random_policy();  // drawn in both modes
    auto f = [this, env, depth, n](Var<T> a, Var<T> b) {
      std::vector<Var<T>> local = env;  // captured outer values are usable inside
      local.push_back(a);
      local.push_back(b);
      const std::size_t first_new = local.size() - 2;
      body(local, depth + 1, n);
      // Mostly values computed inside; sometimes an input, a captured outer value, or the same one twice.
      auto choose = [&]() {
        if (pick(5) == 0) return any(local);
        return local[first_new + static_cast<std::size_t>(pick(static_cast<int>(local.size() - first_new)))];
      };
      Var<T> o1 = choose();
      Var<T> o2 = pick(6) == 0 ? o1 : choose();
      return std::make_tuple(o1, o2);
    };
    auto out = checkpoint_ ? remat::checkpoint(f, policy)(x, y) : f(x, y);
    env.push_back(std::get<0>(out));
    env.push_back(std::get<1>(out));
  }

  std::mt19937_64 rng_;
  std::shared_ptr<std::mt19937_64> policy_rng_;
  bool checkpoint_, smooth_;
  Tape<T>* tape_ = nullptr;
  std::vector<Var<T>>* vars_ = nullptr;
  const std::vector<Matrix<T>>* override_ = nullptr;
  Var<T> row_, col_, scalar_, w_, gain_, bias_;
};

template <class T>
bool bitwise_equal(const Matrix<T>& a, const Matrix<T>& b) {
  if (a.rows() != b.rows() || a.cols() != b.cols()) return false;
  return std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.size())) == 0;
}

struct Result {
  double loss = 0;
  std::vector<Matrix<double>> grads;
};

template <class T>
void run_and_compare(std::uint64_t seed) {
  std::vector<Matrix<T>> grads[2], grads_again;
  T loss_value[2] = {0, 0};
  for (int mode = 0; mode < 2; ++mode) {
    Tape<T> tape(seed);
    std::vector<Var<T>> vars;
    Program<T> program(seed, mode == 1, false);
    Var<T> loss = program.record(tape, vars);
    loss_value[mode] = loss.item();
    std::ostringstream os;
    tape.print_saved_residuals(os);
    const std::string text = os.str();
    const std::string expected_total = "  total " + std::to_string(tape.memory().saved_bytes) + " B\n";
    ASSERT_NE(text.find(expected_total), std::string::npos) << "seed " << seed << "\n" << text;
    ASSERT_LE(tape.memory().saved_bytes, tape.memory().live_bytes) << "seed " << seed;
    ASSERT_NO_THROW(tape.backward(loss, /*retain_graph=*/mode == 1)) << "seed " << seed << " mode " << mode;
    for (auto& v : vars) grads[mode].push_back(Matrix<T>(v.grad()));
    if (mode == 1) {
      // A retained graph gives the same bits on a second backward once the accumulated gradients are
      // cleared, and twice the gradient without clearing (accumulation, as PyTorch's .grad).
      const std::size_t replayed = tape.memory().replayed_ops;
      for (auto& v : vars) v.zero_grad();
      ASSERT_NO_THROW(tape.backward(loss, /*retain_graph=*/true)) << "seed " << seed;
      EXPECT_EQ(tape.memory().replayed_ops, replayed) << "seed " << seed;
      for (std::size_t k = 0; k < vars.size(); ++k)
        ASSERT_TRUE(bitwise_equal(grads[1][k], Matrix<T>(vars[k].grad()))) << "seed " << seed << " var " << k;
      ASSERT_NO_THROW(tape.backward(loss)) << "seed " << seed;
      for (std::size_t k = 0; k < vars.size(); ++k)
        ASSERT_TRUE(Matrix<T>(grads[1][k] + grads[1][k]).isApprox(Matrix<T>(vars[k].grad())))
            << "seed " << seed << " var " << k << ": the third backward adds to the second's gradient";
      EXPECT_THROW(tape.backward(loss), remat::freed_value_error);
    }
    vars.clear();
    loss = Var<T>();
    tape.clear();
    EXPECT_EQ(tape.memory().live_bytes, 0u) << "seed " << seed;
  }
  ASSERT_EQ(std::memcmp(&loss_value[0], &loss_value[1], sizeof(T)), 0) << "seed " << seed;
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (std::size_t k = 0; k < grads[0].size(); ++k)
    ASSERT_TRUE(bitwise_equal(grads[0][k], grads[1][k])) << "seed " << seed << " variable " << k << "\nplain\n"
                                                         << grads[0][k] << "\ncheckpointed\n"
                                                         << grads[1][k];
}

TEST(RandomRegionsBitwise, CheckpointedBitwiseEqualsPlainFloat) {
  for (std::uint64_t seed = 1; seed <= 150; ++seed) {
    run_and_compare<float>(seed);
    if (HasFatalFailure()) return;
  }
}

TEST(RandomRegionsBitwise, CheckpointedBitwiseEqualsPlainDouble) {
  for (std::uint64_t seed = 1000; seed < 1100; ++seed) {
    run_and_compare<double>(seed);
    if (HasFatalFailure()) return;
  }
}

// Checkpointed gradients in double against central differences of the plain forward (smooth ops only).
TEST(RandomRegionsBitwise, CheckpointedMatchesFiniteDifferences) {
  for (std::uint64_t seed = 5000; seed < 5012; ++seed) {
    std::vector<Matrix<double>> values, grads;
    {
      Tape<double> tape(seed);
      std::vector<Var<double>> vars;
      Program<double> program(seed, true, true);
      Var<double> loss = program.record(tape, vars);
      tape.backward(loss);
      for (auto& v : vars) {
        values.push_back(Matrix<double>(v.value()));
        grads.push_back(Matrix<double>(v.grad()));
      }
    }
    auto eval = [&](const std::vector<Matrix<double>>& vals) {
      Tape<double> tape(seed);
      std::vector<Var<double>> vars;
      Program<double> program(seed, false, true);
      return program.record(tape, vars, &vals).item();
    };
    std::mt19937 pick(static_cast<unsigned>(seed));
    for (std::size_t k = 0; k < values.size(); ++k) {
      for (int trial = 0; trial < 2; ++trial) {
        const auto e = static_cast<remat::Index>(pick() % static_cast<unsigned>(values[k].size()));
        const double h = 1e-6;
        auto plus = values, minus = values;
        plus[k].data()[e] += h;
        minus[k].data()[e] -= h;
        const double fd = (eval(plus) - eval(minus)) / (2 * h);
        const double g = grads[k].data()[e];
        EXPECT_NEAR(g, fd, 1e-5 + 1e-4 * std::abs(fd)) << "seed " << seed << " variable " << k << " element " << e;
      }
    }
  }
}

}  // namespace random_regions_bitwise_test
