// remat/io/safetensors.hpp's refusals: every rule of the format a file can break, every way a file can fail to fit
// its Parameters (each leaving them unchanged), a load while a backward reads a Parameter, and atomic saves that
// fail at each step. The round trips are in safetensors_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "safetensors_support.hpp"

namespace safetensors_errors_test {

namespace st = remat::safetensors;
namespace fs = std::filesystem;
using remat::Matrix;
using remat::Parameter;
using st::Layout;
using namespace safetensors_support;

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

}  // namespace safetensors_errors_test
