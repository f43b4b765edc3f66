// The N-D shape ops (reshape, view, flatten, squeeze, unsqueeze, permute, transpose, concat, stack, slice,
// index_select, gather): gradchecks on rank-1, rank-3 and rank-4 inputs, values against plain loops where the
// kernels take several paths (permute's runs and tiles, concat's and stack's trees), errors (type, op name,
// shapes), and that a failed concat or stack leaves the tape unchanged. The values against PyTorch are in
// nd_reference_test.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "gradcheck.hpp"
#include "nd_gradcheck.hpp"
#include "random.hpp"
#include "remat/remat.hpp"

namespace nd_shape_ops_test {

using remat::Index;
using remat::Shape;
using remat::Tape;
using V = remat::Var<double>;
using Inputs = std::vector<V>;
using remat_test::weighted_sum;

using Unary = std::function<V(const V&)>;

void check_unary(const char* what, const Shape& s, const Unary& f) {
  SCOPED_TRACE(std::string(what) + " of " + remat::to_string(s));
  EXPECT_TRUE(
      remat_test::nd_check([&](Tape<double>& t, const Inputs& x) { return weighted_sum(t, f(x[0])); }, {s}, -1, 1, 31));
}

const Shape rank1{6}, rank3{2, 3, 4}, rank4{2, 3, 1, 4};

TEST(NdShapeOps, ReshapeViewFlattenSqueezeUnsqueezeGradcheck) {
  check_unary("reshape", rank1, [](const V& x) { return remat::reshape(x, {2, -1}); });
  check_unary("reshape", rank3, [](const V& x) { return remat::reshape(x, {4, 1, 6}); });
  check_unary("reshape", rank4, [](const V& x) { return remat::reshape(x, {-1}); });
  check_unary("view", rank3, [](const V& x) { return remat::view(x, {6, -1}); });
  check_unary("view", rank4, [](const V& x) { return remat::view(x, {3, 8}); });
  check_unary("flatten", rank1, [](const V& x) { return remat::flatten(x); });
  check_unary("flatten", rank3, [](const V& x) { return remat::flatten(x, 1); });
  check_unary("flatten", rank4, [](const V& x) { return remat::flatten(x, 1, 2); });
  check_unary("squeeze", rank1, [](const V& x) { return remat::squeeze(x, 0); });
  check_unary("squeeze", rank4, [](const V& x) { return remat::squeeze(x, 2); });
  check_unary("unsqueeze", rank1, [](const V& x) { return remat::unsqueeze(x, 1); });
  check_unary("unsqueeze", rank3, [](const V& x) { return remat::unsqueeze(x, -2); });
  check_unary("unsqueeze", rank4, [](const V& x) { return remat::unsqueeze(x, 0); });
}

TEST(NdShapeOpsShapes, ReshapeFamilyShapes) {
  Tape<double> tape;
  const V x = tape.variable(rank3, remat_test::nd_values(rank3, 1).data());
  EXPECT_EQ(remat::reshape(x, {3, -1, 2}).shape(), (Shape{3, 4, 2}));
  EXPECT_EQ(remat::view(x, {24}).shape(), (Shape{24}));
  EXPECT_EQ(remat::flatten(x).shape(), (Shape{24}));
  EXPECT_EQ(remat::flatten(x, 0, 1).shape(), (Shape{6, 4}));
  EXPECT_EQ(remat::squeeze(x, 1).shape(), rank3) << "a dim of size 3 stays, as in PyTorch";
  EXPECT_EQ(remat::unsqueeze(x, 3).shape(), (Shape{2, 3, 4, 1}));
  const V one = tape.variable(Shape{1, 1}, remat_test::nd_values(Shape{1, 1}, 2).data());
  EXPECT_EQ(remat::reshape(one, {}).shape(), Shape::scalar());
  EXPECT_EQ(remat::flatten(remat::reshape(one, {})).shape(), (Shape{1}));
  EXPECT_EQ(remat::squeeze(remat::reshape(one, {}), -1).shape(), Shape::scalar());
  EXPECT_EQ(remat::unsqueeze(remat::reshape(one, {}), 0).shape(), (Shape{1}));
  EXPECT_EQ(remat::reshape(x, 4, 6).shape(), (Shape{4, 6})) << "the 2-D form";
}

/// x permuted by plain loops: y dimension k is x dimension perm[k].
std::vector<double> permuted(const std::vector<double>& x, const Shape& s, const std::vector<int>& perm) {
  const int r = s.rank();
  std::vector<Index> stride(static_cast<std::size_t>(r));
  for (int d = r - 1, n = 1; d >= 0; --d) {
    stride[static_cast<std::size_t>(d)] = n;
    n *= static_cast<int>(s[d]);
  }
  std::vector<double> y;
  std::vector<Index> i(static_cast<std::size_t>(r), 0);  // index into y
  for (Index e = 0; e < s.numel(); ++e) {
    Index offset = 0;
    for (int k = 0; k < r; ++k) offset += i[static_cast<std::size_t>(k)] * stride[static_cast<std::size_t>(perm[k])];
    y.push_back(x[static_cast<std::size_t>(offset)]);
    for (int k = r - 1; k >= 0; --k)
      if (++i[static_cast<std::size_t>(k)] < s[perm[k]])
        break;
      else
        i[static_cast<std::size_t>(k)] = 0;
  }
  return y;
}

// full_like, zeros_like and ones_like give x's shape at every rank (torch.full_like): the value of rank 2 is one
// op, another rank's a [1, numel] constant viewed as x's shape. They read no tensor, so inside a checkpoint under
// nothing_saveable the product zeros_like(x)·x saves nothing (JAX's test_constants_not_hoisted, at rank 3), and x +
// ones_like(x) has the gradient of x alone.
TEST(NdShapeOpsShapes, FullLikeZerosLikeOnesLikeKeepXsShapeAtEveryRank) {
  for (const Shape& s : {Shape::scalar(), Shape{5}, Shape{2, 3, 4}, Shape{2, 1, 3, 1}, Shape{2, 2, 1, 2, 3}}) {
    SCOPED_TRACE(remat::to_string(s));
    const std::vector<double> data(static_cast<std::size_t>(s.numel()), 0.25);
    Tape<double> tape;
    const V x = tape.variable(s, data.data());
    const V f = remat::full_like(x, 1.0 / 3.0);
    EXPECT_EQ(f.shape(), s);
    EXPECT_EQ(remat::zeros_like(x).shape(), s);
    EXPECT_EQ(remat::ones_like(x).shape(), s);
    const remat::MatrixView<double> fv = f.value();
    for (Index i = 0; i < s.numel(); ++i) EXPECT_EQ(fv.data()[i], 1.0 / 3.0);  // the double value, exactly
    const V y = remat::add(x, remat::ones_like(x));
    EXPECT_EQ(y.shape(), s);
    tape.backward(remat::sum(y));
    const remat::MatrixView<double> g = x.grad();
    for (Index i = 0; i < s.numel(); ++i) EXPECT_EQ(g.data()[i], 1.0);
  }
  Tape<double> tape;
  const std::vector<double> data(24, 0.5);
  const V x = tape.variable(rank3, data.data());
  const V z = remat::checkpoint([](V v) { return remat::multiply(remat::zeros_like(v), v); },
                                remat::policies::nothing_saveable)(x);
  EXPECT_EQ(z.shape(), rank3);
  EXPECT_EQ(tape.memory().saved_bytes, 0u);
  tape.backward(remat::sum(z));
  const remat::MatrixView<double> g = x.grad();
  for (Index i = 0; i < 24; ++i) EXPECT_EQ(g.data()[i], 0.0);
}

TEST(NdShapeOps, PermuteMatchesLoopsOnRunsTilesAndMergedDims) {
  const std::vector<std::pair<Shape, std::vector<int>>> cases{{Shape{2, 3, 4}, {2, 0, 1}},
                                                              {Shape{2, 3, 4}, {1, 0, 2}},
                                                              {Shape{40, 70}, {1, 0}},
                                                              {Shape{3, 37, 45}, {0, 2, 1}},
                                                              {Shape{2, 3, 4, 5}, {0, 2, 1, 3}},
                                                              {Shape{2, 3, 4, 5}, {3, 2, 1, 0}},
                                                              {Shape{1, 5, 1, 6}, {3, 2, 1, 0}},
                                                              {Shape{2, 3, 4, 5}, {2, 3, 0, 1}},
                                                              {Shape{5}, {0}},
                                                              {Shape{33, 2, 65}, {2, 1, 0}},
                                                              {Shape{2, 1, 3, 1, 2}, {4, 3, 2, 1, 0}}};
  for (const auto& [s, perm] : cases) {
    SCOPED_TRACE(remat::to_string(s));
    Tape<double> tape;
    const remat::Matrix<double> m = remat_test::nd_values(s, 5);
    const std::vector<double> x(m.data(), m.data() + m.size());
    const V y = remat::permute(tape.variable(s, m.data()), perm);
    const auto v = y.value();
    EXPECT_EQ(std::vector<double>(v.data(), v.data() + v.size()), permuted(x, s, perm));
  }
}

TEST(NdShapeOps, PermuteTransposeGradcheck) {
  check_unary("permute", rank1, [](const V& x) { return remat::permute(x, {0}); });
  check_unary("permute", rank3, [](const V& x) { return remat::permute(x, {2, 0, 1}); });
  check_unary("permute", rank3, [](const V& x) { return remat::permute(x, {1, 0, -1}); });
  check_unary("permute", rank4, [](const V& x) { return remat::permute(x, {3, 1, 2, 0}); });
  check_unary("transpose", rank1, [](const V& x) { return remat::transpose(x, 0, -1); });
  check_unary("transpose", rank3, [](const V& x) { return remat::transpose(x, 0, 2); });
  check_unary("transpose", rank4, [](const V& x) { return remat::transpose(x, -1, 1); });
  check_unary("transpose", Shape{3, 4}, [](const V& x) { return remat::transpose(x); });
}

TEST(NdShapeOps, ConcatStackGradcheckAndTrees) {
  for (int parts : {1, 2, 3, 4, 5, 7, 10}) {
    for (const Shape& s : {rank1, rank3, rank4}) {
      SCOPED_TRACE(std::to_string(parts) + " parts of " + remat::to_string(s));
      const std::vector<Shape> shapes(static_cast<std::size_t>(parts), s);
      for (int dim : {0, -1}) {
        EXPECT_TRUE(remat_test::nd_check(
            [&](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::concat(x, dim)); }, shapes, -1, 1,
            31));
        EXPECT_TRUE(remat_test::nd_check(
            [&](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::stack(x, dim)); }, shapes, -1, 1,
            31));
      }
    }
  }
  // Parts of different sizes along dim, and stack in a middle dimension.
  EXPECT_TRUE(
      remat_test::nd_check([](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::concat(x, 1)); },
                           {Shape{2, 1, 3}, Shape{2, 4, 3}, Shape{2, 2, 3}, Shape{2, 3, 3}}, -1, 1, 31));
  EXPECT_TRUE(remat_test::nd_check([](Tape<double>& t, const Inputs& x) { return weighted_sum(t, remat::stack(x, 2)); },
                                   {rank4, rank4, rank4, rank4}, -1, 1, 31));
}

TEST(NdShapeOps, ConcatAndStackValuesOfManyParts) {
  Tape<double> tape;
  std::vector<V> parts;
  for (int i = 0; i < 7; ++i) {
    const std::vector<double> v{double(i), double(10 + i)};  // part i: [1, 2] = (i, 10 + i)
    parts.push_back(tape.variable(Shape{1, 2}, v.data()));
  }
  const V c = remat::concat(parts, 0);  // [7, 2]
  const V s = remat::stack(parts, 1);   // [1, 7, 2]
  const V t = remat::stack(parts, -1);  // [1, 2, 7]
  EXPECT_EQ(c.shape(), (Shape{7, 2}));
  EXPECT_EQ(s.shape(), (Shape{1, 7, 2}));
  EXPECT_EQ(t.shape(), (Shape{1, 2, 7}));
  const auto cv = c.value(), sv = s.value(), tv = t.value();
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(cv.data()[2 * i], i);
    EXPECT_EQ(cv.data()[2 * i + 1], 10 + i);
    EXPECT_EQ(sv.data()[2 * i + 1], 10 + i);
    EXPECT_EQ(tv.data()[i], i);
    EXPECT_EQ(tv.data()[7 + i], 10 + i);
  }
  EXPECT_TRUE(remat::concat({parts[3]}, -1).is_same(parts[3])) << "one part is returned as it is";
}

TEST(NdShapeOps, SliceIndexSelectGatherGradcheck) {
  check_unary("slice", rank1, [](const V& x) { return remat::slice(x, 0, 1, 4); });
  check_unary("slice", rank3, [](const V& x) { return remat::slice(x, 1, -2, 2); });
  check_unary("slice", rank4, [](const V& x) { return remat::slice(x, -1, 0, 3); });
  check_unary("index_select", rank1, [](const V& x) { return remat::index_select(x, 0, {5, 0, 5, 2}); });
  check_unary("index_select", rank3, [](const V& x) { return remat::index_select(x, 1, {2, 2, 0}); });
  check_unary("index_select", rank4, [](const V& x) { return remat::index_select(x, -1, {3, 1, 1, 0, 3}); });
  check_unary("index_select", rank4, [](const V& x) { return remat::index_select(x, 2, {0, 0}); });
  check_unary("gather", rank1, [](const V& x) { return remat::gather(x, 0, {1, 1, 5}, Shape{3}); });
  check_unary("gather", rank3, [](const V& x) {
    std::vector<int> index(2 * 5 * 4);
    for (std::size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int>((7 * i + 1) % 3);
    return remat::gather(x, 1, index, Shape{2, 5, 4});
  });
  check_unary("gather", rank3, [](const V& x) {  // an index smaller than x in the other dims
    return remat::gather(x, -1, {3, 3, 0, 1}, Shape{1, 2, 2});
  });
  check_unary("gather", rank4, [](const V& x) {
    std::vector<int> index(2 * 3 * 1 * 4);
    for (std::size_t i = 0; i < index.size(); ++i) index[i] = static_cast<int>((5 * i + 2) % 2);
    return remat::gather(x, 0, index, Shape{2, 3, 1, 4});
  });
}

TEST(NdShapeOps, RepeatedIndicesAccumulate) {
  Tape<double> tape;
  const std::vector<double> v{1, 2, 3};
  const V x = tape.variable(Shape{3}, v.data());
  tape.backward(remat::sum(remat::index_select(x, 0, {2, 2, 0, 2})) +
                remat::sum(remat::gather(x, 0, {1, 1}, Shape{2})));
  const auto g = x.grad();
  EXPECT_EQ(g.data()[0], 1);
  EXPECT_EQ(g.data()[1], 2);
  EXPECT_EQ(g.data()[2], 3);
}

// ---- errors: the type, and a message naming the op ----

/// Runs `f`, expects exception E whose what() contains every string of `parts`.
template <class E>
void expect_throw(const std::function<void()>& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    const std::string message = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "message \"" << message << "\" lacks \"" << part << "\"";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

TEST(NdShapeOpsErrors, BadDimsThrowIndexErrorNamingTheOp) {
  Tape<double> tape;
  const V x = tape.variable(rank3, remat_test::nd_values(rank3, 1).data());
  using E = remat::index_error;
  expect_throw<E>([&] { remat::flatten(x, 3); }, {"flatten:", "dim 3"});
  expect_throw<E>([&] { remat::flatten(x, 2, 1); }, {"flatten:", "start_dim"});
  expect_throw<E>([&] { remat::squeeze(x, -4); }, {"squeeze:", "dim -4"});
  expect_throw<E>([&] { remat::unsqueeze(x, 4); }, {"unsqueeze:", "dim 4"});
  expect_throw<E>([&] { remat::unsqueeze(x, -5); }, {"unsqueeze:", "dim -5"});
  expect_throw<E>([&] { remat::permute(x, {0, 1, 3}); }, {"permute:", "dim 3"});
  expect_throw<E>([&] { remat::permute(x, {0, 1, -3}); }, {"permute:", "twice"});
  expect_throw<E>([&] { remat::transpose(x, 0, 3); }, {"transpose:", "dim 3"});
  expect_throw<E>([&] { remat::concat({x, x}, 3); }, {"concat:", "dim 3"});
  expect_throw<E>([&] { remat::stack({x, x}, 4); }, {"stack:", "dim 4"});
  expect_throw<E>([&] { remat::stack({x, x}, -5); }, {"stack:", "dim -5"});
  expect_throw<E>([&] { remat::slice(x, -4, 0, 1); }, {"slice:", "dim -4"});
  expect_throw<E>([&] { remat::index_select(x, 3, {0}); }, {"index_select:", "dim 3"});
  expect_throw<E>([&] { remat::gather(x, 3, {0}, Shape{1, 1, 1}); }, {"gather:", "dim 3"});
  EXPECT_EQ(tape.size(), 1u) << "nothing recorded";
}

TEST(NdShapeOpsErrors, BadShapesThrowShapeErrorNamingTheOpAndShapes) {
  Tape<double> tape;
  const V x = tape.variable(rank3, remat_test::nd_values(rank3, 1).data());
  const V y = tape.variable(Shape{2, 5, 4}, remat_test::nd_values(Shape{2, 5, 4}, 2).data());
  using E = remat::shape_error;
  expect_throw<E>([&] { remat::reshape(x, {5, 5}); }, {"reshape:", "[2,3,4]", "[5,5]"});
  expect_throw<E>([&] { remat::reshape(x, {-1, -1}); }, {"reshape:", "only one"});
  expect_throw<E>([&] { remat::reshape(x, {5, -1}); }, {"reshape:", "[5,-1]", "multiple"});
  expect_throw<E>([&] { remat::reshape(x, {0, 24}); }, {"reshape:", "at least 1"});
  expect_throw<E>([&] { remat::reshape(x, {1, 1, 1, 1, 1, 1, 1, 1, 24}); }, {"reshape:", "at most 8"});
  expect_throw<E>([&] { remat::view(x, {7, -1}); }, {"view:", "[2,3,4]"});
  expect_throw<E>([&] { remat::unsqueeze(remat::reshape(x, {1, 1, 1, 1, 1, 2, 3, 4}), 0); }, {"unsqueeze:", "8"});
  expect_throw<E>([&] { remat::permute(x, {0, 1}); }, {"permute:", "[2,3,4]", "rank 3"});
  expect_throw<E>([&] { remat::concat({x, y}, 2); }, {"concat:", "part 1", "[2,5,4]", "[2,3,4]"});
  expect_throw<E>([&] { remat::concat({x, remat::reshape(x, {6, 4})}, 0); }, {"concat:", "part 1", "[6,4]"});
  expect_throw<E>([&] { remat::concat(std::vector<V>{}, 0); }, {"concat:", "no parts"});
  expect_throw<E>([&] { remat::stack({x, y}, 0); }, {"stack:", "part 1", "[2,5,4]"});
  expect_throw<E>([&] { remat::stack(std::vector<V>{}, 0); }, {"stack:", "no parts"});
  expect_throw<E>([&] { remat::slice(x, 1, 1, 3); }, {"slice:", "[2,3,4]", "begin + count"});
  expect_throw<E>([&] { remat::slice(x, 1, 0, 0); }, {"slice:", "count >= 1"});
  expect_throw<E>([&] { remat::index_select(x, 0, {}); }, {"index_select:", "no indices"});
  expect_throw<E>([&] { remat::gather(x, 1, {0, 0}, Shape{2, 1}); }, {"gather:", "[2,1]", "[2,3,4]"});
  expect_throw<E>([&] { remat::gather(x, 1, {0, 0}, Shape{3, 1, 1}); }, {"gather:", "[3,1,1]"});
  expect_throw<E>([&] { remat::gather(x, 1, {0, 0}, Shape{1, 1, 1}); }, {"gather:", "2 index values", "[1,1,1]"});
  const V scalar = remat::reshape(remat::slice(remat::flatten(x), 0, 0, 1), {});
  expect_throw<E>([&] { remat::concat({scalar, scalar}, 0); }, {"concat:", "scalar"});
  expect_throw<E>([&] { remat::slice(scalar, 0, 0, 1); }, {"slice:", "scalar"});
  const std::size_t recorded = tape.size();
  EXPECT_NO_THROW(remat::stack({scalar, scalar}, 0));
  EXPECT_EQ(tape.size(), recorded + 1);
}

TEST(NdShapeOpsErrors, IndicesOutOfRangeThrowIndexErrorNamingTheOp) {
  Tape<double> tape;
  const V x = tape.variable(rank3, remat_test::nd_values(rank3, 1).data());
  using E = remat::index_error;
  expect_throw<E>([&] { remat::slice(x, 2, 4, 1); }, {"slice:", "begin 4", "[2,3,4]"});
  expect_throw<E>([&] { remat::slice(x, 2, -5, 1); }, {"slice:", "begin -5"});
  expect_throw<E>([&] { remat::index_select(x, 1, {0, 3}); }, {"index_select:", "index 3", "position 1", "[2,3,4]"});
  expect_throw<E>([&] { remat::index_select(x, -1, {-1}); }, {"index_select:", "index -1", "position 0"});
  expect_throw<E>([&] { remat::gather(x, 2, {0, 4}, Shape{1, 1, 2}); }, {"gather:", "index value 4", "position 1"});
  expect_throw<E>([&] { remat::gather(x, 0, {-1}, Shape{1, 1, 1}); }, {"gather:", "index value -1"});
  EXPECT_EQ(tape.size(), 1u) << "nothing recorded";
}

TEST(NdShapeOpsErrors, AFailedConcatOrStackRecordsNothing) {
  Tape<double> tape;
  const V x = tape.variable(rank3, remat_test::nd_values(rank3, 1).data());
  const V y = tape.variable(Shape{2, 3, 5}, remat_test::nd_values(Shape{2, 3, 5}, 2).data());
  const std::size_t before = tape.size();
  std::vector<V> parts(6, x);
  parts.push_back(y);  // the last part does not fit: the trees over the first six must not be recorded
  EXPECT_THROW(remat::concat(parts, 1), remat::shape_error);
  EXPECT_THROW(remat::stack(parts, 0), remat::shape_error);
  EXPECT_EQ(tape.size(), before);
  EXPECT_EQ(remat::concat(parts, -1).shape(), (Shape{2, 3, 29}));
}

}  // namespace nd_shape_ops_test
