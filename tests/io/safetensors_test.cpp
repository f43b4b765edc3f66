// remat/io/safetensors.hpp: round trips (bitwise, float and double, every layout), the file layout against
// the reference writer's own test vectors, a file written by PyTorch (tests/io/reference.safetensors, made by
// make_safetensors_reference.py), every rule of the format a file can break, every way a file can fail to fit
// its Parameters (each leaving them unchanged), and atomic saves that fail at each step.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "remat/io/safetensors.hpp"
#include "remat/nn/linear.hpp"
#include "remat/remat.hpp"

namespace safetensors_test {

namespace st = remat::safetensors;
namespace fs = std::filesystem;
using remat::Matrix;
using remat::Parameter;
using st::Layout;

/// A directory of its own for each test, removed with everything in it.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::string pattern = (fs::temp_directory_path() / "remat_safetensors_XXXXXX").string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }
  /// The names in the directory, sorted: a failed save must leave no temporary file behind.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::directory_iterator(path_)) out.push_back(entry.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

/// A file of the given header text (padded with spaces to a multiple of 8 bytes unless `pad` is false) and data.
std::string file_of(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return u64_le(header.size()) + header + data;
}

template <class T>
std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

float float_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
double double_bits(std::uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

/// Values that a careless copy or conversion changes: a NaN with a payload, −0, a subnormal, ±∞, the extremes.
template <class T>
Matrix<T> awkward(remat::Index rows, remat::Index cols, unsigned seed) {
  Matrix<T> m(rows, cols);
  std::uint64_t state = seed;
  for (remat::Index i = 0; i < m.size(); ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    m.data()[i] = static_cast<T>(static_cast<double>(state >> 11) * 0x1.0p-53 * 4 - 2);
  }
  const T specials[] = {-T(0),
                        std::numeric_limits<T>::denorm_min(),
                        std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::max(),
                        std::numeric_limits<T>::lowest(),
                        std::is_same_v<T, float> ? static_cast<T>(float_bits(0x7fc01234u))
                                                 : static_cast<T>(double_bits(0x7ff8000000abcdefULL))};
  for (std::size_t k = 0; k < std::size(specials) && static_cast<remat::Index>(k) < m.size(); ++k)
    m.data()[k] = specials[k];
  return m;
}

template <class T>
bool bitwise_equal(const Matrix<T>& a, const Matrix<T>& b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(T)) == 0;
}

/// The values and versions of Parameters, to check that a failed load changed none of them.
struct Snapshot {
  std::vector<Parameter<float>*> floats;
  std::vector<Parameter<double>*> doubles;
  std::vector<Matrix<float>> float_values;
  std::vector<Matrix<double>> double_values;
  std::vector<std::uint64_t> versions;
  Snapshot(std::vector<Parameter<float>*> f, std::vector<Parameter<double>*> d) : floats(f), doubles(d) {
    for (auto* p : floats) float_values.push_back(p->value()), versions.push_back(p->version());
    for (auto* p : doubles) double_values.push_back(p->value()), versions.push_back(p->version());
  }
  void expect_unchanged() const {
    std::size_t v = 0;
    for (std::size_t k = 0; k < floats.size(); ++k, ++v) {
      EXPECT_TRUE(bitwise_equal(floats[k]->value(), float_values[k])) << "float Parameter " << k << " changed";
      EXPECT_EQ(floats[k]->version(), versions[v]);
    }
    for (std::size_t k = 0; k < doubles.size(); ++k, ++v) {
      EXPECT_TRUE(bitwise_equal(doubles[k]->value(), double_values[k])) << "double Parameter " << k << " changed";
      EXPECT_EQ(doubles[k]->version(), versions[v]);
    }
  }
};

/// f() must throw E whose what() names every one of `words` and whose tensor() is `tensor`.
template <class E, class F>
void expect_io_error(F f, const std::vector<std::string>& words, const std::string& tensor = {}) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "'" << e.what() << "' lacks '" << w << "'";
    EXPECT_EQ(e.tensor(), tensor) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

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
  // PyTorch's batch norm state also holds num_batches_tracked (I64), which remat does not keep.
  Snapshot unchanged({&conv.weight, &conv.bias, &bn.weight, &bn.bias, &bn.running_mean, &bn.running_var}, {});
  expect_io_error<remat::mismatch_error>([&] { st::load(path, entries); },
                                         {"\"bn.num_batches_tracked\"", "allow_extra"}, "bn.num_batches_tracked");
  unchanged.expect_unchanged();
  st::LoadOptions extra;
  extra.allow_extra = true;
  st::load(path, entries, extra);
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

// ---- files that break the format ----

/// A valid two-tensor file's parts, to damage one at a time.
const std::string two_tensors_data = bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6}) + bytes_of(std::vector<double>{7});

struct Destination {
  Parameter<float> a{Matrix<float>::Constant(2, 3, -1.0f)};
  Parameter<double> b{Matrix<double>::Constant(1, 1, -1.0)};
  Snapshot snapshot{{&a}, {&b}};
  std::vector<st::Entry> entries() { return {{"a", a}, {"b", b}}; }
};

/// load(path) of `bytes` must throw E naming `words` (and the file) and leave the Parameters unchanged.
template <class E>
void expect_load_refused(const std::string& case_name, const std::string& bytes, const std::vector<std::string>& words,
                         const std::string& tensor = {}) {
  SCOPED_TRACE(case_name);
  TemporaryDirectory dir;
  const std::string path = dir.file(case_name + ".safetensors");
  write_bytes(path, bytes);
  Destination d;
  std::vector<std::string> all = words;
  all.push_back(path);
  expect_io_error<E>([&] { st::load(path, d.entries()); }, all, tensor);
  d.snapshot.expect_unchanged();
}

TEST(SafetensorsFormat, AValidHandWrittenFileLoads) {
  TemporaryDirectory dir;
  const std::string path = dir.file("valid.safetensors");
  // Padded with spaces, in any order of keys, with an extra member the reader ignores.
  write_bytes(path, file_of(R"({"b":{"shape":[1,1],"dtype":"F64","data_offsets":[24,32]},)"
                            R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24],"extra":1}})",
                            two_tensors_data));
  Destination d;
  st::load(path, d.entries());
  EXPECT_EQ(d.a.value(), (Matrix<float>{{1, 2, 3}, {4, 5, 6}}));
  EXPECT_EQ(d.b.value()(0, 0), 7.0);

  // An empty tensor (a dimension of 0) holds no bytes whatever its other dimensions, and its product does
  // not overflow.
  write_bytes(path, file_of(R"({"e":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", ""));
  EXPECT_EQ(st::read_header(path).find("e")->shape.at(1), ~std::uint64_t{0});

  // A name holding a NUL and a quote is printed escaped, as JSON writes it: the message is not cut at the NUL.
  write_bytes(path, file_of(R"({"a\u0000\"b":{"dtype":"F32","shape":[1,1],"data_offsets":[0,4]}})",
                            bytes_of(std::vector<float>{1})));
  Parameter<float> other(Matrix<float>::Zero(1, 1));
  try {
    st::load(path, {{"other", other}});
    ADD_FAILURE() << "no mismatch_error";
  } catch (const remat::mismatch_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\0'), std::string::npos);
    EXPECT_NE(what.find(R"("a\u0000\"b")"), std::string::npos) << what;
  }
}

TEST(SafetensorsFormat, EveryBrokenRuleIsAFormatError) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})";
  const std::string b = R"("b":{"dtype":"F64","shape":[1,1],"data_offsets":[24,32]})";
  const std::string valid = file_of("{" + a + "," + b + "}", two_tensors_data);
  using remat::format_error;

  expect_load_refused<format_error>("empty", "", {"truncated", "8-byte header length"});
  expect_load_refused<format_error>("seven_bytes", std::string(7, '\0'), {"truncated"});
  expect_load_refused<format_error>("header_over_limit", u64_le(100'000'001) + "{}", {"100000001", "100000000"});
  expect_load_refused<format_error>("header_length_huge", u64_le(~std::uint64_t{0}) + "{}",
                                    {"more than the format's limit"});
  expect_load_refused<format_error>("header_beyond_file", u64_le(1000) + "{" + a + "}", {"1000", "only"});
  expect_load_refused<format_error>("header_cut", valid.substr(0, 40), {"header length", "only 32 bytes"});
  expect_load_refused<format_error>("zero_header", u64_le(0), {"does not begin with '{'"});
  expect_load_refused<format_error>("leading_space", file_of(" {" + a + "," + b + "}", two_tensors_data),
                                    {"does not begin with '{'"});
  expect_load_refused<format_error>("malformed_json", file_of("{" + a + "," + b, two_tensors_data), {"not valid JSON"});
  expect_load_refused<format_error>("trailing_garbage", file_of("{" + a + "," + b + "}x", two_tensors_data),
                                    {"not valid JSON"});
  expect_load_refused<format_error>(
      "invalid_utf8", file_of("{" + a + "," + b + ",\"__metadata__\":{\"k\":\"\xff\"}}", two_tensors_data),
      {"not valid JSON", "UTF-8"});
  expect_load_refused<format_error>("duplicate_tensor", file_of("{" + a + "," + b + "," + a + "}", two_tensors_data),
                                    {"repeats the key \"a\""}, "a");
  expect_load_refused<format_error>(
      "duplicate_field",
      file_of(R"({"a":{"dtype":"F32","dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)" + b + "}", two_tensors_data),
      {"repeats the key \"dtype\""});
  expect_load_refused<format_error>("overlap",
                                    file_of(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                            R"("b":{"dtype":"F64","shape":[1,1],"data_offsets":[16,24]},)"
                                            R"("c":{"dtype":"F64","shape":[1,1],"data_offsets":[24,32]}})",
                                            two_tensors_data),
                                    {"\"b\"'s data_offsets [16,24] overlap tensor \"a\""}, "b");
  expect_load_refused<format_error>("hole",
                                    file_of(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                            R"("b":{"dtype":"F32","shape":[1,1],"data_offsets":[28,32]}})",
                                            two_tensors_data),
                                    {"hole of 4 bytes", "\"a\"", "\"b\""}, "b");
  expect_load_refused<format_error>(
      "not_from_zero", file_of(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]}})", two_tensors_data),
      {"hole of 8 bytes", "start of the data"}, "a");
  expect_load_refused<format_error>("trailing_bytes", valid + "xyz", {"3 bytes after the last tensor"});
  expect_load_refused<format_error>("truncated_data", valid.substr(0, valid.size() - 4), {"truncated", "\"b\""}, "b");
  expect_load_refused<format_error>(
      "size_disagrees",
      file_of(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,24]},)" + b + "}", two_tensors_data),
      {"\"a\"", "16 bytes", "span 24"}, "a");
  expect_load_refused<format_error>(
      "end_before_begin",
      file_of(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[24,0]},)" + b + "}", two_tensors_data),
      {"end before they begin"}, "a");
  expect_load_refused<format_error>(
      "unknown_dtype",
      file_of(R"({"a":{"dtype":"F31","shape":[2,3],"data_offsets":[0,24]},)" + b + "}", two_tensors_data),
      {"unknown or unsupported dtype \"F31\""}, "a");
  expect_load_refused<format_error>(
      "negative_dimension",
      file_of(R"({"a":{"dtype":"F32","shape":[-2,3],"data_offsets":[0,24]},)" + b + "}", two_tensors_data),
      {"\"shape\" holds -2"}, "a");
  expect_load_refused<format_error>(
      "fractional_offset",
      file_of(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24.0]},)" + b + "}", two_tensors_data),
      {"\"data_offsets\" is not [BEGIN, END]"}, "a");
  expect_load_refused<format_error>(
      "nested_shape",
      file_of(R"({"a":{"dtype":"F32","shape":[[2],3],"data_offsets":[0,24]},)" + b + "}", two_tensors_data), {"nests"});
  expect_load_refused<format_error>(
      "shape_overflow",
      file_of(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,24]},)" + b + "}",
              two_tensors_data),
      {"overflows 64 bits"}, "a");
  expect_load_refused<format_error>(
      "missing_field", file_of(R"({"a":{"dtype":"F32","shape":[2,3]},)" + b + "}", two_tensors_data), {"lacks"}, "a");
  expect_load_refused<format_error>("entry_not_object", file_of(R"({"a":[1,2],)" + b + "}", two_tensors_data),
                                    {"\"a\" is not an object"}, "a");
  expect_load_refused<format_error>("metadata_not_string",
                                    file_of("{" + a + "," + b + R"(,"__metadata__":{"epoch":3}})", two_tensors_data),
                                    {"\"__metadata__\"", "\"epoch\""});
}

TEST(SafetensorsFormat, ReadErrorsAreIoErrorsNotFormatErrors) {
  TemporaryDirectory dir;
  Destination d;
  const std::string missing = dir.file("absent.safetensors");
  expect_io_error<remat::io_error>([&] { st::load(missing, d.entries()); }, {missing, "cannot open"});
  EXPECT_THROW(st::load(missing, d.entries()), remat::io_error);
  try {
    st::read_header(missing);
  } catch (const remat::format_error&) {
    ADD_FAILURE() << "a missing file is no format error";
  } catch (const remat::io_error& e) {
    EXPECT_EQ(e.path(), missing);
  }
  expect_io_error<remat::io_error>([&] { st::load(dir.path().string(), d.entries()); }, {"not a regular file"});
  d.snapshot.expect_unchanged();
}

// ---- files that do not fit their Parameters ----

class SafetensorsMismatch : public ::testing::Test {
 protected:
  void SetUp() override {
    path = dir.file("saved.safetensors");
    Parameter<float> w(awkward<float>(2, 3, 11)), b(Matrix<float>{{1, 2, 3}});
    Parameter<double> big(Matrix<double>{{1.0, 1e300}});
    st::save(path, {{"w", w}, {"b", b, Layout::vector}, {"big", big}});
  }
  TemporaryDirectory dir;
  std::string path;
  Parameter<float> w{Matrix<float>::Zero(2, 3)}, b{Matrix<float>::Zero(1, 3)};
  Parameter<double> big{Matrix<double>::Zero(1, 2)};
};

TEST_F(SafetensorsMismatch, MissingTensorIsNamedWithTheFilesNames) {
  Parameter<float> extra(Matrix<float>::Zero(1, 1));
  Snapshot s({&w, &b, &extra}, {&big});
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", w}, {"b", b}, {"big", big}, {"wq", extra}});
      },
      {path, "no tensor \"wq\"", "1 missing", "\"w\"", "\"big\"", "read_header"}, "wq");
  s.expect_unchanged();
}

TEST_F(SafetensorsMismatch, ExtraTensorsAreRefusedUnlessAllowed) {
  Snapshot s({&w, &b}, {&big});
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", w}, {"b", b}});
      },
      {path, "1 tensor that no entry names: \"big\"", "allow_extra"}, "big");
  s.expect_unchanged();
  st::LoadOptions allow;
  allow.allow_extra = true;
  st::load(path, {{"w", w}, {"b", b}}, allow);
  EXPECT_TRUE(bitwise_equal(w.value(), awkward<float>(2, 3, 11)));
}

TEST_F(SafetensorsMismatch, DtypeIsRefusedWithBothNamesOrConvertedOnRequest) {
  Parameter<double> w_double(Matrix<double>::Zero(2, 3));
  Snapshot s({&b}, {&w_double, &big});
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", w_double}, {"b", b}, {"big", big}});
      },
      {path, "tensor \"w\" is F32 in the file", "F64 (double)", "convert_dtype", "F32 to double is exact"}, "w");
  s.expect_unchanged();

  // F32 → double is exact.
  st::LoadOptions convert;
  convert.convert_dtype = true;
  st::load(path, {{"w", w_double}, {"b", b}, {"big", big}}, convert);
  EXPECT_TRUE(bitwise_equal(w_double.value(), Matrix<double>(awkward<float>(2, 3, 11).cast<double>())));

  // F64 → float rounds to nearest; a finite value beyond float's range is refused, and nothing changes.
  Parameter<float> big_float(Matrix<float>::Zero(1, 2));
  Snapshot t({&w, &b, &big_float}, {});
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", w}, {"b", b}, {"big", big_float}});
      },
      {"\"big\" is F64", "F32 (float)", "rounds to nearest"}, "big");
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", w}, {"b", b}, {"big", big_float}}, convert);
      },
      {"\"big\" holds 1e+300 at element 1", "beyond float's range"}, "big");
  t.expect_unchanged();
  const std::string small = dir.file("small.safetensors");
  Parameter<double> third(Matrix<double>{{1.0 / 3.0}});
  st::save(small, {{"third", third}});
  Parameter<float> third_float(Matrix<float>::Zero(1, 1));
  st::load(small, {{"third", third_float}}, convert);
  EXPECT_EQ(third_float.value()(0, 0), static_cast<float>(1.0 / 3.0));
}

TEST_F(SafetensorsMismatch, OtherDtypesAreRefusedEvenWithConversion) {
  const std::string half = dir.file("half.safetensors");
  write_bytes(half, file_of(R"({"h":{"dtype":"F16","shape":[1,2],"data_offsets":[0,4]}})", std::string(4, '\0')));
  Parameter<float> h(Matrix<float>::Zero(1, 2));
  st::LoadOptions convert;
  convert.convert_dtype = true;
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(half, {{"h", h}}, convert);
      },
      {half, "\"h\" is F16", "F32 and F64 only", "tensor.float()"}, "h");
  EXPECT_EQ(h.value(), Matrix<float>::Zero(1, 2));
}

TEST_F(SafetensorsMismatch, ShapeIsRefusedWithAHintForTheTranspose) {
  Parameter<float> wt(Matrix<float>::Zero(3, 2)), wrong(Matrix<float>::Zero(2, 4));
  Snapshot s({&wt, &wrong, &b}, {&big});
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", wt}, {"b", b}, {"big", big}});
      },
      {path, "\"w\" is [2,3]", "[3,2]", "Layout::transposed", "nn.Linear"}, "w");
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", w, Layout::transposed}, {"b", b}, {"big", big}});
      },
      {"\"w\" is [2,3]", "Layout::transposed expects [3,2]", "Layout::matrix"}, "w");
  expect_io_error<remat::mismatch_error>(
      [&] {
        st::load(path, {{"w", wrong}, {"b", b}, {"big", big}});
      },
      {"\"w\" is [2,3]", "[2,4]", "file's sizes"}, "w");
  s.expect_unchanged();
}

TEST_F(SafetensorsMismatch, AFailureAtTheLastTensorLeavesTheFirstUnchanged) {
  // "w" and "b" fit and are read; "big" fails only when converted (a value beyond float's range): nothing is
  // assigned before everything was read.
  Parameter<float> big_float(Matrix<float>::Zero(1, 2));
  Snapshot s({&w, &b, &big_float}, {});
  st::LoadOptions convert;
  convert.convert_dtype = true;
  EXPECT_THROW(st::load(path, {{"w", w}, {"b", b}, {"big", big_float}}, convert), remat::mismatch_error);
  s.expect_unchanged();
}

TEST_F(SafetensorsMismatch, BadNamesAreNameErrorsBeforeAnyIo) {
  Parameter<float> other(Matrix<float>::Zero(2, 3));
  Snapshot s({&w, &other}, {});
  using remat::name_error;
  remat_test::expect_error_naming<name_error>([&] { st::load(path, {{"", w}}); }, {"empty"});
  remat_test::expect_error_naming<name_error>([&] { st::load(path, {{"w", w}, {"w", other}}); }, {"\"w\"", "twice"});
  remat_test::expect_error_naming<name_error>([&] { st::load(path, {{"__metadata__", w}}); }, {"__metadata__"});
  remat_test::expect_error_naming<name_error>([&] { st::load(path, {{"w", w}, {"v", w}}); }, {"\"v\"", "another name"});
  remat_test::expect_error_naming<name_error>([&] { st::load(path, {{"w\xff", w}}); }, {"UTF-8"});
  s.expect_unchanged();
  const std::string before = read_bytes(path);
  remat_test::expect_error_naming<name_error>([&] { st::save(path, {{"w", w}, {"w", other}}); }, {"twice"});
  remat_test::expect_error_naming<name_error>(
      [&] {
        st::save(path, {{"w", w}}, {{"k", "\xc3"}});
      },
      {"metadata", "UTF-8"});
  remat_test::expect_error_naming<name_error>(
      [&] {
        st::save_matrices<float>(path, {{"__metadata__", Matrix<float>::Zero(1, 1)}});
      },
      {"__metadata__"});
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.names(), std::vector<std::string>{"saved.safetensors"});
}

TEST_F(SafetensorsMismatch, LoadMatricesRefusesRankThree) {
  const std::string cube = dir.file("cube.safetensors");
  write_bytes(cube, file_of(R"({"c":{"dtype":"F32","shape":[1,1,2],"data_offsets":[0,8]}})", std::string(8, '\0')));
  expect_io_error<remat::mismatch_error>([&] { st::load_matrices<float>(cube); }, {cube, "\"c\" has rank 3", "2-D"},
                                         "c");
}

TEST(SafetensorsLoad, WhileABackwardReadsAParameterIsATapeErrorAndChangesNothing) {
  TemporaryDirectory dir;
  const std::string path = dir.file("ab.safetensors");
  Parameter<double> a(Matrix<double>{{0.5, -1.0}}), b(Matrix<double>{{2.0, 3.0}});
  {
    Parameter<double> a1(Matrix<double>{{9.0, 9.0}}), b1(Matrix<double>{{8.0, 8.0}});
    st::save(path, {{"a", a1}, {"b", b1}});
  }
  // loss = Σ (b ⊙ c) ⊙ a: a's gradient is complete after the outer product's backward, while b's still waits for
  // the inner product's, so the sweep still holds b.
  remat::Tape<double> tape;
  remat::Var<double> vb = tape.variable(b);
  remat::Var<double> loss = remat::sum((vb * tape.constant(Matrix<double>{{1.5, -2.0}})) * tape.variable(a));
  bool called = false;
  Snapshot s({}, {&a, &b});
  tape.on_gradient_ready([&](Parameter<double>& p) {
    if (&p.value() != &a.value()) return;
    called = true;
    st::load(path, {{"a", a}, {"b", b}});
  });
  remat_test::expect_error_naming<remat::tape_error>([&] { tape.backward(loss); },
                                                     {"safetensors::load", "still reads"});
  EXPECT_TRUE(called);
  s.expect_unchanged();
}

// ---- atomic saves ----

TEST(SafetensorsAtomicSave, ReplacesTheFileAndLeavesNoTemporary) {
  TemporaryDirectory dir;
  const std::string path = dir.file("model.safetensors");
  Parameter<float> w(awkward<float>(3, 3, 21));
  st::save(path, {{"w", w}});
  w.mutable_value()(0, 0) = 42.0f;
  st::save(path, {{"w", w}});
  EXPECT_EQ(dir.names(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(st::load_matrices<float>(path).at("w")(0, 0), 42.0f);
}

/// Runs f with the process's file size limit at `bytes` (writes beyond it fail with EFBIG) and SIGXFSZ
/// ignored (it would otherwise end the process), then restores both.
template <class F>
void with_file_size_limit(rlim_t bytes, F f) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit limited = old;
  limited.rlim_cur = bytes;
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &previous), 0);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  try {
    f();
  } catch (...) {
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::sigaction(SIGXFSZ, &previous, nullptr);
    throw;
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::sigaction(SIGXFSZ, &previous, nullptr);
}

TEST(SafetensorsAtomicSave, AWriteThatFailsHalfWayLeavesTheOldFile) {
  TemporaryDirectory dir;
  const std::string path = dir.file("model.safetensors");
  Parameter<float> small(Matrix<float>::Constant(2, 2, 1.0f)), large(awkward<float>(256, 256, 22));
  st::save(path, {{"w", small}});
  const std::string before = read_bytes(path);
  // The 256 KiB tensor stops at 64 KiB: the write fails in the middle of the data.
  with_file_size_limit(64 * 1024, [&] {
    expect_io_error<remat::io_error>(
        [&] {
          st::save(path, {{"w", large}});
        },
        {path, "write failed", "File too large", "previous file", "unchanged"});
  });
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.names(), std::vector<std::string>{"model.safetensors"}) << "the temporary file was removed";
}

TEST(SafetensorsAtomicSave, ARenameThatFailsLeavesTheTarget) {
  TemporaryDirectory dir;
  const std::string path = dir.file("taken");
  fs::create_directory(path);
  write_bytes(path + "/inside", "kept");
  Parameter<float> w(Matrix<float>::Constant(2, 2, 1.0f));
  expect_io_error<remat::io_error>([&] { st::save(path, {{"w", w}}); }, {path, "rename failed", "unchanged"});
  EXPECT_EQ(read_bytes(path + "/inside"), "kept");
  EXPECT_EQ(dir.names(), std::vector<std::string>{"taken"});
}

TEST(SafetensorsAtomicSave, AMissingOrReadOnlyDirectoryFailsBeforeWriting) {
  TemporaryDirectory dir;
  Parameter<float> w(Matrix<float>::Constant(2, 2, 1.0f));
  const std::string missing = dir.file("no/such/model.safetensors");
  expect_io_error<remat::io_error>(
      [&] {
        st::save(missing, {{"w", w}});
      },
      {missing, "cannot create a temporary file", "No such file"});

  const std::string path = dir.file("ro/model.safetensors");
  fs::create_directory(dir.file("ro"));
  st::save(path, {{"w", w}});
  const std::string before = read_bytes(path);
  fs::permissions(dir.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
  if (::geteuid() == 0) {
    fs::permissions(dir.file("ro"), fs::perms::owner_all);
    GTEST_SKIP() << "root writes into read-only directories (the write and rename failures are tested above)";
  }
  w.mutable_value().setConstant(2.0f);
  expect_io_error<remat::io_error>([&] { st::save(path, {{"w", w}}); }, {path, "cannot create a temporary file"});
  fs::permissions(dir.file("ro"), fs::perms::owner_all);
  EXPECT_EQ(read_bytes(path), before);
}

}  // namespace safetensors_test
