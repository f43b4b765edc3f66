// What the safetensors tests share (tests/io/safetensors_test.cpp, safetensors_errors_test.cpp): a temporary
// directory per test, whole-file bytes, hand-built files (header length, header text, data), values that a careless
// copy or conversion changes, a snapshot of Parameters that a failed load must leave unchanged, and the check of an
// I/O error's type, words and tensor.
#pragma once

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

namespace safetensors_support {

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

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string u64_le(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

/// A file of the given header text (padded with spaces to a multiple of 8 bytes unless `pad` is false) and data.
inline std::string file_of(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return u64_le(header.size()) + header + data;
}

template <class T>
std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

inline float float_bits(std::uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline double double_bits(std::uint64_t bits) {
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

/// f() must throw E whose what() names every one of `words` (remat_test::expect_error_naming) and whose tensor()
/// is `tensor`.
template <class E, class F>
void expect_io_error(F f, const std::vector<std::string>& words, const std::string& tensor = {}) {
  remat_test::expect_error_naming<E>(
      [&] {
        try {
          f();
        } catch (const E& e) {
          EXPECT_EQ(e.tensor(), tensor) << e.what();
          throw;
        }
      },
      words);
}

}  // namespace safetensors_support
