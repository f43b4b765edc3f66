// Reads tests/ops/nd_reference.txt: PyTorch 1.13 float64 values and gradients of the N-D ops, written by
// tests/ops/make_nd_reference.py (its docstring defines the format). The tests read this file and never need torch.
#pragma once

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "remat/shape.hpp"

namespace remat_test {

/// A tensor of the file: its shape and its values, row-major.
struct ReferenceTensor {
  remat::Shape shape;
  std::vector<double> values;
};

/// One case: op `name` applied to `inputs` with `attributes`; `output` its value; the loss sum(output ⊙ weight)
/// has gradient grads.at(k) with respect to input k (for each differentiable input).
struct ReferenceCase {
  std::string name;
  std::vector<ReferenceTensor> inputs;
  std::map<std::string, std::vector<double>> attributes;
  ReferenceTensor output;
  std::vector<double> weight;
  std::map<int, ReferenceTensor> grads;
  int line = 0;  ///< where the case starts in the file

  bool has(const std::string& key) const { return attributes.count(key) > 0; }
  double number(const std::string& key) const { return attributes.at(key).at(0); }
  std::vector<int> ints(const std::string& key) const {
    std::vector<int> v;
    for (double x : attributes.at(key)) v.push_back(static_cast<int>(x));
    return v;
  }
  std::vector<remat::Index> dims(const std::string& key) const {
    std::vector<remat::Index> v;
    for (double x : attributes.at(key)) v.push_back(static_cast<remat::Index>(x));
    return v;
  }
};

namespace detail {
inline remat::Shape read_shape(std::istringstream& in) {
  int rank = 0;
  in >> rank;
  std::vector<remat::Index> dims(static_cast<std::size_t>(rank));
  for (auto& d : dims) in >> d;
  return remat::Shape(dims);
}
inline std::vector<double> read_values(std::istream& file) {
  std::string line;
  std::getline(file, line);
  std::istringstream in(line);
  std::vector<double> v;
  for (std::string token; in >> token;) v.push_back(std::stod(token));
  return v;
}
}  // namespace detail

/// Every case of the file at `path`. Throws std::runtime_error if it cannot be read or is malformed.
inline std::vector<ReferenceCase> read_reference_cases(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot open " + path);
  std::vector<ReferenceCase> cases;
  std::string line;
  int number = 0;
  while (std::getline(file, line)) {
    ++number;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    if (kind == "case") {
      cases.emplace_back();
      in >> cases.back().name;
      cases.back().line = number;
      continue;
    }
    if (cases.empty()) throw std::runtime_error(path + ":" + std::to_string(number) + ": record before a case");
    ReferenceCase& c = cases.back();
    if (kind == "attr") {
      std::string key;
      in >> key;
      auto& v = c.attributes[key];
      for (std::string token; in >> token;) v.push_back(std::stod(token));
    } else if (kind == "input") {
      c.inputs.push_back({detail::read_shape(in), detail::read_values(file)});
      ++number;
    } else if (kind == "output") {
      c.output = {detail::read_shape(in), detail::read_values(file)};
      ++number;
    } else if (kind == "weight") {
      c.weight = detail::read_values(file);
      ++number;
    } else if (kind == "grad") {
      int k = 0;
      in >> k;
      ReferenceTensor t{detail::read_shape(in), {}};
      t.values = detail::read_values(file);
      ++number;
      c.grads[k] = t;
    } else if (kind != "end") {
      throw std::runtime_error(path + ":" + std::to_string(number) + ": unknown record " + kind);
    }
  }
  return cases;
}

/// Whether `got` equals PyTorch's `want` element by element within 1e-12 relative (absolute below 1), the tolerance
/// of the reference tests; the failure names the first element that differs, or the counts.
inline ::testing::AssertionResult close_to_reference(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 1e-12 * std::max(1.0, std::abs(want[i]))))
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << ", PyTorch " << want[i];
  return ::testing::AssertionSuccess();
}
/// The same for an Eigen matrix or map (its elements in storage order: row-major for remat's values).
template <class Derived>
::testing::AssertionResult close_to_reference(const Eigen::DenseBase<Derived>& got, const std::vector<double>& want) {
  const auto& m = got.derived();
  return close_to_reference(std::vector<double>(m.data(), m.data() + m.size()), want);
}

}  // namespace remat_test
