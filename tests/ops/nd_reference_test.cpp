// The N-D ops against PyTorch 1.13 float64 values (tests/ops/nd_reference.txt, written by
// tests/ops/make_nd_reference.py): for each case, the output's shape and values, and the gradients of
// sum(output ⊙ weight) with respect to every differentiable input, plain and under every checkpoint policy
// (bitwise equal to plain).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "api_checks.hpp"
#include "nd_reference.hpp"
#include "remat/remat.hpp"

namespace nd_reference_test {

using remat::Shape;
using remat::Tape;
using remat::Var;
using remat_test::ReferenceCase;
using V = Var<double>;

using Builder = std::function<V(const std::vector<V>&, const ReferenceCase&)>;

/// The integer values of input k (index_select's and gather's indices).
std::vector<int> integers(const ReferenceCase& c, std::size_t k) {
  return std::vector<int>(c.inputs[k].values.begin(), c.inputs[k].values.end());
}

/// The shape ops (reshape, permute, concat, gather, …).
void add_shape_ops(std::map<std::string, Builder>& m) {
  using C = const ReferenceCase&;
  using X = const std::vector<V>&;
  m["reshape"] = [](X x, C c) { return remat::reshape(x[0], c.dims("shape")); };
  m["flatten"] = [](X x, C c) { return remat::flatten(x[0], c.ints("start").at(0), c.ints("end").at(0)); };
  m["squeeze"] = [](X x, C c) { return remat::squeeze(x[0], c.ints("dim").at(0)); };
  m["unsqueeze"] = [](X x, C c) { return remat::unsqueeze(x[0], c.ints("dim").at(0)); };
  m["permute"] = [](X x, C c) { return remat::permute(x[0], c.ints("dims")); };
  m["transpose"] = [](X x, C c) { return remat::transpose(x[0], c.ints("dim0").at(0), c.ints("dim1").at(0)); };
  m["concat"] = [](X x, C c) { return remat::concat(x, c.ints("dim").at(0)); };
  m["stack"] = [](X x, C c) { return remat::stack(x, c.ints("dim").at(0)); };
  m["slice"] = [](X x, C c) {
    return remat::slice(x[0], c.ints("dim").at(0), c.dims("begin").at(0), c.dims("count").at(0));
  };
  m["index_select"] = [](X x, C c) { return remat::index_select(x[0], c.ints("dim").at(0), integers(c, 1)); };
  m["gather"] = [](X x, C c) { return remat::gather(x[0], c.ints("dim").at(0), integers(c, 1), c.inputs[1].shape); };
}

/// The ops this build implements in N-D, by the file's case name.
const std::map<std::string, Builder>& builders() {
  static const std::map<std::string, Builder> b = [] {
    std::map<std::string, Builder> m;
    auto unary = [&](const char* name, V (*f)(const V&)) {
      m[name] = [f](const std::vector<V>& x, const ReferenceCase&) { return f(x[0]); };
    };
    unary("neg", remat::neg<double>);
    unary("abs", remat::abs<double>);
    unary("exp", remat::exp<double>);
    unary("log", remat::log<double>);
    unary("sqrt", remat::sqrt<double>);
    unary("square", remat::square<double>);
    unary("sin", remat::sin<double>);
    unary("cos", remat::cos<double>);
    unary("tanh", remat::tanh<double>);
    unary("sigmoid", remat::sigmoid<double>);
    unary("relu", remat::relu<double>);
    unary("gelu", remat::gelu<double>);
    m["softplus"] = [](const std::vector<V>& x, const ReferenceCase&) { return remat::softplus(x[0]); };
    m["pow"] = [](const std::vector<V>& x, const ReferenceCase& c) { return remat::pow(x[0], c.number("exponent")); };
    m["add"] = [](const std::vector<V>& x, const ReferenceCase&) { return x[0] + x[1]; };
    m["subtract"] = [](const std::vector<V>& x, const ReferenceCase&) { return x[0] - x[1]; };
    m["multiply"] = [](const std::vector<V>& x, const ReferenceCase&) { return x[0] * x[1]; };
    m["divide"] = [](const std::vector<V>& x, const ReferenceCase&) { return x[0] / x[1]; };
    m["matmul"] = [](const std::vector<V>& x, const ReferenceCase&) { return remat::matmul(x[0], x[1]); };
    m["linear"] = [](const std::vector<V>& x, const ReferenceCase&) { return remat::linear(x[0], x[1], x[2]); };
    add_shape_ops(m);
    // The composite graph of make_nd_reference.py's docstring: broadcasting, a softmax over a middle dim,
    // permute, reshape, a batched matmul, concat and reductions.
    m["graph"] = [](const std::vector<V>& in, const ReferenceCase&) {
      const V h = remat::matmul(in[0], in[1]) + in[2];
      const V z = remat::permute(remat::softmax(h, 1), {0, 2, 1, 3});
      const V p = remat::matmul(remat::reshape(z, {2, 4, 18}), in[3]);
      const V c = remat::concat({p, in[4]}, 2);
      // sum/mean over every dim ({}) are rank 0, as PyTorch's loss.
      return remat::sum(remat::square(remat::sum(c, {1}, true)), {}) +
             remat::mean(remat::exp(remat::mean(c, {2})), {}) + remat::sum(remat::max(c, {1}), {});
    };

    // Reductions over dims, softmaxes over any dim, PyTorch's elementwise ops, layer_norm over trailing dims.
    m["sum"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      return remat::sum(x[0], c.ints("dims"), c.number("keepdim") != 0);
    };
    m["mean"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      return remat::mean(x[0], c.ints("dims"), c.number("keepdim") != 0);
    };
    m["max"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      return remat::max(x[0], c.ints("dims"), c.number("keepdim") != 0);
    };
    m["softmax"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      return remat::softmax(x[0], c.ints("dim").at(0));
    };
    m["log_softmax"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      return remat::log_softmax(x[0], c.ints("dim").at(0));
    };
    m["maximum"] = [](const std::vector<V>& x, const ReferenceCase&) { return remat::maximum(x[0], x[1]); };
    m["minimum"] = [](const std::vector<V>& x, const ReferenceCase&) { return remat::minimum(x[0], x[1]); };
    m["where"] = [](const std::vector<V>& x, const ReferenceCase&) { return remat::where(x[0], x[1], x[2]); };
    m["clamp"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      const auto bound = [&](const char* key) {
        return c.has(key) ? std::optional<double>(c.number(key)) : std::optional<double>();
      };
      return remat::clamp(x[0], bound("min"), bound("max"));
    };
    m["leaky_relu"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      return remat::leaky_relu(x[0], c.number("negative_slope"));
    };
    unary("silu", remat::silu<double>);
    m["layer_norm"] = [](const std::vector<V>& x, const ReferenceCase& c) {
      return remat::layer_norm(x[0], Shape(c.dims("normalized_shape")), x[1], x[2], c.number("eps"));
    };
    return m;
  }();
  return b;
}

/// Integer inputs (labels, indices) and where's condition are not differentiable: recorded as constants.
bool differentiable(const ReferenceCase& c, std::size_t k) {
  return c.grads.count(static_cast<int>(k)) > 0;
}

struct Result {
  Shape shape;
  std::vector<double> output;
  std::vector<std::vector<double>> grads;  // per input, empty when not differentiable
};

/// build(x), or build recorded as a checkpoint region under `policy`.
V apply(const ReferenceCase& c, const Builder& build, const std::vector<V>& x, const remat_test::AnyPolicy* policy) {
  if (!policy) return build(x, c);
  switch (x.size()) {
    case 1:
      return remat::checkpoint([&](const V& a) { return build({a}, c); }, *policy)(x[0]);
    case 2:
      return remat::checkpoint([&](const V& a, const V& b) { return build({a, b}, c); }, *policy)(x[0], x[1]);
    case 3:
      return remat::checkpoint(
          [&](const V& a, const V& b, const V& d) {
            return build({a, b, d}, c);
          },
          *policy)(x[0], x[1], x[2]);
    case 5:  // the composite graph
      return remat::checkpoint(
          [&](const V& a, const V& b, const V& d, const V& e, const V& f) {
            return build({a, b, d, e, f}, c);
          },
          *policy)(x[0], x[1], x[2], x[3], x[4]);
    default:
      ADD_FAILURE() << "no checkpointed form for " << x.size() << " inputs";
      return build(x, c);
  }
}

Result run(const ReferenceCase& c, const Builder& build, const remat_test::AnyPolicy* policy) {
  Tape<double> tape;
  std::vector<V> x;
  for (std::size_t k = 0; k < c.inputs.size(); ++k) {
    const auto& in = c.inputs[k];
    x.push_back(differentiable(c, k) ? tape.variable(in.shape, in.values.data())
                                     : tape.constant(in.shape, in.values.data()));
  }
  V y = apply(c, build, x, policy);
  Result r;
  r.shape = y.shape();
  const auto value = y.value();
  r.output.assign(value.data(), value.data() + value.size());
  const V w = tape.constant(c.output.shape, c.weight.data());
  tape.backward(remat::sum(y * w));
  for (std::size_t k = 0; k < x.size(); ++k) {
    if (!differentiable(c, k)) {
      r.grads.emplace_back();
      continue;
    }
    const auto g = x[k].grad();
    r.grads.emplace_back(g.data(), g.data() + g.size());
  }
  return r;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

const std::vector<ReferenceCase>& cases() {
  static const auto c = remat_test::read_reference_cases(REMAT_SOURCE_DIR "/tests/ops/nd_reference.txt");
  return c;
}

TEST(NdReference, EveryImplementedOpMatchesPyTorchAndEveryPolicyIsBitwiseEqualToPlain) {
  std::set<std::string> covered;
  int ran = 0;
  for (const ReferenceCase& c : cases()) {
    auto b = builders().find(c.name);
    if (b == builders().end()) continue;
    SCOPED_TRACE("case " + c.name + " at nd_reference.txt:" + std::to_string(c.line));
    const Result plain = run(c, b->second, nullptr);
    EXPECT_EQ(plain.shape, c.output.shape) << remat::to_string(plain.shape);
    EXPECT_TRUE(remat_test::close_to_reference(plain.output, c.output.values));
    for (const auto& [k, g] : c.grads) {
      SCOPED_TRACE("grad of input " + std::to_string(k));
      EXPECT_TRUE(remat_test::close_to_reference(plain.grads[static_cast<std::size_t>(k)], g.values));
    }
    for (const auto& [name, policy] : remat_test::every_policy()) {
      SCOPED_TRACE(name);
      const Result r = run(c, b->second, &policy);
      EXPECT_TRUE(same_bits(r.output, plain.output));
      for (std::size_t k = 0; k < r.grads.size(); ++k) EXPECT_TRUE(same_bits(r.grads[k], plain.grads[k]));
    }
    covered.insert(c.name);
    ++ran;
  }
  EXPECT_EQ(covered.size(), builders().size()) << "an implemented op has no case in the file";
  EXPECT_GE(ran, 263);  // every case but cross_entropy's 4 (its loss is [1,1], PyTorch's rank 0)
}

}  // namespace nd_reference_test
