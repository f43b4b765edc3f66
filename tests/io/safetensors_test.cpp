// remat/io/safetensors.hpp: round trips (bitwise, float and double, every layout), the file layout against the
// reference writer's own test vectors, files written by PyTorch (tests/io/reference.safetensors and
// reference_cnn.safetensors, made by make_safetensors_reference.py), N-D Parameters. The refusals are in
// safetensors_errors_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "safetensors_support.hpp"

namespace safetensors_test {

namespace st = remat::safetensors;
namespace fs = std::filesystem;
using remat::Matrix;
using remat::Parameter;
using st::Layout;
using namespace safetensors_support;

// ---- round trips ----

TEST(SafetensorsRoundTrip, FloatAndDoubleParametersAreBitwiseEqual) {
  TemporaryDirectory dir;
  const std::string path = dir.file("model.safetensors");
  Parameter<float> w(awkward<float>(3, 5, 1)), b(awkward<float>(1, 5, 2)), empty(Matrix<float>(0, 4));
  Parameter<double> d(awkward<double>(4, 2, 3)), s(awkward<double>(1, 1, 4));
  st::save(path, {{"w", w}, {"b", b}, {"empty", empty}, {"d", d}, {"s", s}}, {{"format", "pt"}, {"note", "é ✓"}});

  Parameter<float> w2(Matrix<float>::Zero(3, 5)), b2(Matrix<float>::Zero(1, 5)), empty2(Matrix<float>(0, 4));
  Parameter<double> d2(Matrix<double>::Zero(4, 2)), s2(Matrix<double>::Zero(1, 1));
  const std::uint64_t version = w2.version();
  const float* buffer = w2.value().data();
  st::load(path, {{"w", w2}, {"b", b2}, {"empty", empty2}, {"d", d2}, {"s", s2}});
  EXPECT_TRUE(bitwise_equal(w2.value(), w.value()));
  EXPECT_TRUE(bitwise_equal(b2.value(), b.value()));
  EXPECT_TRUE(bitwise_equal(d2.value(), d.value()));
  EXPECT_TRUE(bitwise_equal(s2.value(), s.value()));
  EXPECT_EQ(empty2.rows(), 0);
  EXPECT_GT(w2.version(), version) << "a load is a modification: tapes that recorded the Parameter become stale";
  EXPECT_EQ(w2.value().data(), buffer) << "loaded in place";

  const st::Header h = st::read_header(path);
  EXPECT_EQ(h.metadata, (st::Metadata{{"format", "pt"}, {"note", "é ✓"}}));
  ASSERT_EQ(h.tensors.size(), 5u);
  EXPECT_EQ(h.find("w")->shape, (std::vector<std::uint64_t>{3, 5}));
  EXPECT_EQ(h.find("b")->shape, (std::vector<std::uint64_t>{1, 5})) << "Layout::matrix keeps [1,n] as [1,n]";
  EXPECT_EQ(h.find("empty")->shape, (std::vector<std::uint64_t>{0, 4}));
  EXPECT_EQ(h.find("empty")->begin, h.find("empty")->end);
  EXPECT_EQ(h.find("d")->dtype, "F64");
  EXPECT_EQ(h.find("w")->dtype, "F32");
  EXPECT_EQ(h.find("nothing"), nullptr);
}

TEST(SafetensorsRoundTrip, MatricesRoundTripBitwise) {
  TemporaryDirectory dir;
  const std::string path = dir.file("m.safetensors");
  const std::map<std::string, Matrix<double>> saved = {{"a", awkward<double>(2, 3, 5)},
                                                       {"b", awkward<double>(1, 7, 6)}};
  st::save_matrices(path, saved);
  const auto loaded = st::load_matrices<double>(path);
  ASSERT_EQ(loaded.size(), 2u);
  for (const auto& [name, m] : saved) EXPECT_TRUE(bitwise_equal(loaded.at(name), m)) << name;
  EXPECT_TRUE(st::read_header(path).metadata.empty()) << "no \"__metadata__\" when none is given";
}

TEST(SafetensorsRoundTrip, FileLayoutFollowsTheReferenceWriter) {
  TemporaryDirectory dir;
  // The reference implementation's own test vectors (safetensors/src/tensor.rs, test_empty): no tensor,
  // without and with metadata.
  st::save(dir.file("empty.safetensors"), {});
  EXPECT_EQ(read_bytes(dir.file("empty.safetensors")), u64_le(8) + "{}      ");
  st::save(dir.file("metadata.safetensors"), {}, {{"framework", "pt"}});
  EXPECT_EQ(read_bytes(dir.file("metadata.safetensors")),
            u64_le(40) + "{\"__metadata__\":{\"framework\":\"pt\"}}     ");

  // The metadata first; then the tensors by dtype size (F64 first, so that every tensor is aligned to its
  // element size) then by name; the data in that order, row-major, little-endian.
  Parameter<float> z(Matrix<float>{{1.0f, 2.0f}}), a(Matrix<float>{{3.0f}, {4.0f}});
  Parameter<double> y(Matrix<double>{{5.0}});
  const std::string path = dir.file("order.safetensors");
  st::save(path, {{"z", z}, {"a", a}, {"y", y}}, {{"k", "v"}});
  const std::string header =
      "{\"__metadata__\":{\"k\":\"v\"},\"y\":{\"dtype\":\"F64\",\"shape\":[1,1],\"data_offsets\":[0,8]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[8,16]},"
      "\"z\":{\"dtype\":\"F32\",\"shape\":[1,2],\"data_offsets\":[16,24]}}";
  EXPECT_EQ(read_bytes(path),
            file_of(header, bytes_of(std::vector<double>{5.0}) + bytes_of(std::vector<float>{3.0f, 4.0f, 1.0f, 2.0f})));
}

TEST(SafetensorsRoundTrip, LayoutsTransposeAndReshapeOnlyWhenAsked) {
  TemporaryDirectory dir;
  const std::string path = dir.file("layouts.safetensors");
  Parameter<float> w(Matrix<float>{{1, 2, 3}, {4, 5, 6}}), b(Matrix<float>{{7, 8, 9}});
  st::save(path, {{"w", w, Layout::transposed}, {"b", b, Layout::vector}});
  const st::Header h = st::read_header(path);
  EXPECT_EQ(h.find("w")->shape, (std::vector<std::uint64_t>{3, 2}));
  EXPECT_EQ(h.find("b")->shape, (std::vector<std::uint64_t>{3}));
  // The file holds wᵀ row-major: 1 4 2 5 3 6.
  const auto m = st::load_matrices<float>(path);
  EXPECT_EQ(m.at("w"), (Matrix<float>{{1, 4}, {2, 5}, {3, 6}}));
  EXPECT_EQ(m.at("b"), (Matrix<float>{{7, 8, 9}})) << "a 1-D tensor [n] is a [1,n] matrix";

  Parameter<float> w2(Matrix<float>::Zero(2, 3)), b2(Matrix<float>::Zero(1, 3)), b3(Matrix<float>::Zero(1, 3));
  st::load(path, {{"w", w2, Layout::transposed}, {"b", b2}});  // [n] into a [1,n] Parameter with Layout::matrix
  EXPECT_EQ(w2.value(), w.value());
  EXPECT_EQ(b2.value(), b.value());
  st::save(dir.file("row.safetensors"), {{"b", b}});  // [1,3] into Layout::vector
  st::load(dir.file("row.safetensors"), {{"b", b3, Layout::vector}});
  EXPECT_EQ(b3.value(), b.value());

  // A scalar (shape []) into a [1,1] Parameter.
  const std::string scalar = dir.file("scalar.safetensors");
  write_bytes(scalar,
              file_of(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})", bytes_of(std::vector<double>{-2.5})));
  Parameter<double> s(Matrix<double>::Zero(1, 1));
  st::load(scalar, {{"s", s}});
  EXPECT_EQ(s.value()(0, 0), -2.5);

  remat_test::expect_error_naming<remat::shape_error>(
      [&] {
        st::save(dir.file("never.safetensors"), {{"w", w, Layout::vector}});
      },
      {"\"w\"", "Layout::vector", "[2,3]"});
  EXPECT_FALSE(fs::exists(dir.file("never.safetensors")));
}

TEST(SafetensorsRoundTrip, TorchLinearNamesAndLaysOutAsPyTorch) {
  TemporaryDirectory dir;
  remat::nn::Generator g(7);
  remat::nn::Linear<double> layer(4, 3, g), copy(4, 3, g);
  copy.bias.mutable_value().setConstant(1.0);
  const std::string path = dir.file("linear.safetensors");
  st::save(path, st::torch_linear("fc", layer));
  const st::Header h = st::read_header(path);
  EXPECT_EQ(h.find("fc.weight")->shape, (std::vector<std::uint64_t>{3, 4})) << "PyTorch's [out,in]";
  EXPECT_EQ(h.find("fc.bias")->shape, (std::vector<std::uint64_t>{3})) << "PyTorch's 1-D bias";
  st::load(path, st::torch_linear("fc", copy));
  EXPECT_EQ(copy.weight.value(), layer.weight.value());
  EXPECT_EQ(copy.bias.value(), layer.bias.value());
}

// ---- a file written by PyTorch ----

/// tests/io/reference.txt: NAME DTYPE [SHAPE] VALUES... (float.hex).
/// NAME → values of tests/io/`file` (reference.txt or reference_cnn.txt, make_safetensors_reference.py's).
std::map<std::string, std::vector<double>> read_reference(const std::string& file = "reference.txt") {
  std::ifstream in(std::string(REMAT_SOURCE_DIR) + "/tests/io/" + file);
  std::map<std::string, std::vector<double>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string name, dtype, shape, value;
    fields >> name >> dtype >> shape;
    while (fields >> value) out[name].push_back(std::strtod(value.c_str(), nullptr));
  }
  return out;
}

template <class T>
void expect_exactly(const Matrix<T>& m, const std::vector<double>& expected, const std::string& name) {
  ASSERT_EQ(static_cast<std::size_t>(m.size()), expected.size()) << name;
  for (remat::Index i = 0; i < m.size(); ++i) {
    const T e = static_cast<T>(expected[static_cast<std::size_t>(i)]);
    EXPECT_TRUE(std::memcmp(&m.data()[i], &e, sizeof(T)) == 0)
        << name << "[" << i << "]: " << m.data()[i] << " vs " << e;
  }
}

TEST(SafetensorsPyTorchFile, LoadsEveryValueExactly) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/io/reference.safetensors";
  const auto expected = read_reference();
  ASSERT_EQ(expected.size(), 7u) << "tests/io/reference.txt not found or incomplete";

  // torch.nn.Linear(4, 3) into remat's nn::Linear(4, 3): weight [3,4] transposed into [4,3], bias [3] into [1,3].
  remat::nn::Generator g(1);
  remat::nn::Linear<float> layer(4, 3, g);
  Parameter<double> matrix(Matrix<double>::Zero(2, 3)), scalar(Matrix<double>::Zero(1, 1));
  Parameter<float> special(Matrix<float>::Zero(1, 5));
  std::vector<st::Entry> entries = st::torch_linear("linear", layer);
  entries.insert(entries.end(), {{"double.matrix", matrix}, {"double.scalar", scalar}, {"float.special", special}});
  st::load(path, entries);

  expect_exactly<float>(Matrix<float>(layer.weight.value().transpose()), expected.at("linear.weight"), "linear.weight");
  expect_exactly<float>(layer.bias.value(), expected.at("linear.bias"), "linear.bias");
  expect_exactly<double>(matrix.value(), expected.at("double.matrix"), "double.matrix");
  expect_exactly<double>(scalar.value(), expected.at("double.scalar"), "double.scalar");
  expect_exactly<float>(special.value(), expected.at("float.special"), "float.special");
  EXPECT_TRUE(std::signbit(special.value()(0, 2))) << "-0 stays -0";

  // remat's y = x·W + b with the loaded layer equals PyTorch's y = x·Wᵀ + b (to rounding: the sums of four
  // products may be ordered or fused differently).
  const std::vector<double>& x = expected.at("input");
  const std::vector<double>& y = expected.at("output");
  Matrix<float> input(2, 4);
  for (remat::Index i = 0; i < input.size(); ++i) input.data()[i] = static_cast<float>(x[static_cast<std::size_t>(i)]);
  remat::Tape<float> tape;
  const Matrix<float> out =
      remat::linear(tape.constant(input), tape.constant(layer.weight.value()), tape.constant(layer.bias.value()))
          .value();
  ASSERT_EQ(out.size(), 6);
  for (remat::Index i = 0; i < out.size(); ++i)
    EXPECT_NEAR(out.data()[i], y[static_cast<std::size_t>(i)], 1e-6) << "output[" << i << "]";

  const st::Header h = st::read_header(path);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.tensors.front().name, "double.matrix") << "F64 first, as the reference writer orders them";

  // The whole file as matrices of double: F32 converts exactly with convert_dtype, and is refused without.
  st::LoadOptions convert;
  convert.convert_dtype = true;
  const auto all = st::load_matrices<double>(path, convert);
  EXPECT_EQ(all.size(), 5u);
  EXPECT_EQ(all.at("linear.bias").rows(), 1);
  expect_exactly<double>(all.at("linear.weight"), expected.at("linear.weight"), "linear.weight as double");
  expect_io_error<remat::mismatch_error>([&] { st::load_matrices<double>(path); },
                                         {path, "\"float.special\"", "F32", "F64", "convert_dtype"}, "float.special");
}

// ---- N-D Parameters: PyTorch's convolution and batch norm ----

TEST(SafetensorsNd, PyTorchsConv2dAndBatchNorm2dLoadExactlyIntoTheNnLayers) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/tests/io/reference_cnn.safetensors";
  const auto expected = read_reference("reference_cnn.txt");
  ASSERT_EQ(expected.size(), 9u) << "tests/io/reference_cnn.txt not found or incomplete";
  remat::nn::Generator g(1);
  remat::nn::Conv2d<float> conv(2, 3, {3, 2}, g, remat::Conv2dOptions().padding(1), true);
  remat::nn::BatchNorm2d<float> bn(3);
  std::vector<st::Entry> entries = st::torch_conv2d("conv", conv);
  for (st::Entry& e : st::torch_batch_norm2d("bn", bn)) entries.push_back(e);
  // PyTorch's batch norm state also holds num_batches_tracked (I64 []), which the layer keeps: a strict load.
  EXPECT_EQ(entries.back().name(), "bn.num_batches_tracked");
  st::load(path, entries);
  EXPECT_EQ(expected.at("bn.num_batches_tracked"), std::vector<double>{2});
  EXPECT_EQ(bn.num_batches_tracked(), 2);
  EXPECT_EQ(conv.weight.shape(), (remat::Shape{3, 2, 3, 2}));
  expect_exactly<float>(conv.weight.value(), expected.at("conv.weight"), "conv.weight");
  expect_exactly<float>(conv.bias.value(), expected.at("conv.bias"), "conv.bias");
  for (const char* name : {"weight", "bias", "running_mean", "running_var"}) {
    const Parameter<float>& p = std::string(name) == "weight"         ? bn.weight
                                : std::string(name) == "bias"         ? bn.bias
                                : std::string(name) == "running_mean" ? bn.running_mean
                                                                      : bn.running_var;
    expect_exactly<float>(p.value(), expected.at(std::string("bn.") + name), std::string("bn.") + name);
  }
  // remat's conv2d with the loaded layer equals PyTorch's output (to float's rounding of 13-term sums).
  const std::vector<double>& x = expected.at("input");
  const std::vector<float> input(x.begin(), x.end());
  remat::Tape<float> tape;
  const Matrix<float> y = conv.forward(tape, tape.constant(remat::Shape{1, 2, 4, 4}, input.data())).value();
  const std::vector<double>& want = expected.at("output");
  ASSERT_EQ(static_cast<std::size_t>(y.size()), want.size());
  for (remat::Index i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y.data()[i], want[static_cast<std::size_t>(i)], 1e-6) << "output[" << i << "]";
}

TEST(SafetensorsNd, BatchNorm2dsCounterIsSavedAsAnI64ScalarAndLoaded) {
  TemporaryDirectory dir;
  const std::string path = dir.file("bn.safetensors");
  remat::nn::BatchNorm2d<float> bn(3, 1e-5, std::nullopt);
  bn.running_mean.mutable_value().setConstant(0.25f);
  bn.num_batches_tracked() = (std::int64_t{1} << 40) + 3;  // beyond 32 bits
  st::save(path, st::torch_batch_norm2d("bn", bn));
  const st::Header h = st::read_header(path);
  ASSERT_NE(h.find("bn.num_batches_tracked"), nullptr);
  EXPECT_EQ(h.find("bn.num_batches_tracked")->dtype, "I64");
  EXPECT_TRUE(h.find("bn.num_batches_tracked")->shape.empty());
  EXPECT_EQ(h.tensors.size(), 5u);

  remat::nn::BatchNorm2d<float> back(3);
  st::load(path, st::torch_batch_norm2d("bn", back));  // strict: every tensor named
  EXPECT_EQ(back.num_batches_tracked(), (std::int64_t{1} << 40) + 3);
  EXPECT_TRUE(back.running_mean.value() == bn.running_mean.value());

  // A file without the counter (saved by remat before the layer kept one) loads and leaves the count as it is.
  const std::string old = dir.file("old.safetensors");
  std::vector<st::Entry> four = st::torch_batch_norm2d("bn", bn);
  four.pop_back();
  st::save(old, four);
  remat::nn::BatchNorm2d<float> kept(3);
  kept.num_batches_tracked() = 5;
  st::load(old, st::torch_batch_norm2d("bn", kept));
  EXPECT_EQ(kept.num_batches_tracked(), 5);
  EXPECT_TRUE(kept.running_mean.value() == bn.running_mean.value());
  // A counter entry made with required true is missed, naming it.
  std::int64_t count = 9;
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(old, {{"bn.num_batches_tracked", count}});
      },
      {"\"bn.num_batches_tracked\"", "1 missing"}, "bn.num_batches_tracked");

  // A counter of another dtype or shape is refused, and nothing changes.
  const std::string wrong = dir.file("wrong.safetensors");
  Parameter<float> as_float(Matrix<float>::Constant(1, 1, 2.0f));
  four.emplace_back("bn.num_batches_tracked", as_float);
  st::save(wrong, four);
  remat::nn::BatchNorm2d<float> untouched(3);
  untouched.num_batches_tracked() = 4;
  expect_io_error<remat::mismatch_error>([&] { st::load(wrong, st::torch_batch_norm2d("bn", untouched)); },
                                         {"\"bn.num_batches_tracked\"", "F32 [1,1]", "I64 scalar"},
                                         "bn.num_batches_tracked");
  EXPECT_EQ(untouched.num_batches_tracked(), 4);
  EXPECT_TRUE(untouched.running_mean.value().isZero());
  EXPECT_EQ(count, 9);
}

TEST(SafetensorsNd, SaveWritesTheNdShapeAndLoadChecksIt) {
  TemporaryDirectory dir;
  const std::string path = dir.file("cnn.safetensors");
  remat::nn::Generator g(7);
  remat::nn::Conv2d<float> conv(2, 3, {3, 2}, g, remat::Conv2dOptions().padding(1), true);
  remat::nn::BatchNorm2d<float> bn(3);
  bn.running_var.mutable_value().setConstant(0.5f);
  std::vector<st::Entry> entries = st::torch_conv2d("conv", conv);
  for (st::Entry& e : st::torch_batch_norm2d("bn", bn)) entries.push_back(e);
  st::save(path, entries);
  const st::Header h = st::read_header(path);
  EXPECT_EQ(h.find("conv.weight")->shape, (std::vector<std::uint64_t>{3, 2, 3, 2}));
  EXPECT_EQ(h.find("conv.bias")->shape, (std::vector<std::uint64_t>{3}));
  EXPECT_EQ(h.find("bn.running_var")->shape, (std::vector<std::uint64_t>{3}));

  remat::nn::Generator other(8);
  remat::nn::Conv2d<float> conv2(2, 3, {3, 2}, other, remat::Conv2dOptions().padding(1), true);
  remat::nn::BatchNorm2d<float> bn2(3);
  std::vector<st::Entry> back = st::torch_conv2d("conv", conv2);
  for (st::Entry& e : st::torch_batch_norm2d("bn", bn2)) back.push_back(e);
  st::load(path, back);
  EXPECT_TRUE(conv2.weight.value() == conv.weight.value());
  EXPECT_TRUE(conv2.bias.value() == conv.bias.value());
  EXPECT_TRUE(bn2.running_var.value() == bn.running_var.value());

  // Another N-D shape of the same size is refused, naming both; the matrix view [18, 2] (the leading dimensions
  // by the last: what remat wrote for an N-D Parameter before) loads, and [3, 12] does not.
  Parameter<float> swapped(remat::Tensor<float, 4>(2, 3, 3, 2).setZero());
  st::LoadOptions extra;
  extra.allow_extra = true;
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"conv.weight", swapped}}, extra);
      },
      {"\"conv.weight\" is [3,2,3,2]", "[2,3,3,2]"}, "conv.weight");
  const std::string old = dir.file("matrix_view.safetensors");
  st::save_matrices<float>(old, {{"conv.weight", Matrix<float>::Constant(18, 2, 0.25f)}});
  st::load(old, {{"conv.weight", conv2.weight}});
  EXPECT_EQ(conv2.weight.shape(), (remat::Shape{3, 2, 3, 2}));
  EXPECT_TRUE((conv2.weight.value().array() == 0.25f).all());
  st::save_matrices<float>(old, {{"conv.weight", Matrix<float>::Constant(3, 12, 0.5f)}});
  EXPECT_THROW(st::load(old, {{"conv.weight", conv2.weight}}), remat::mismatch_error);
  // Only a matrix is transposed.
  EXPECT_THROW(st::save(path, {{"conv.weight", conv.weight, Layout::transposed}}), remat::shape_error);
}

}  // namespace safetensors_test
