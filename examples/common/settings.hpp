// What the examples' command-line flags and the settings their state files give are checked against, in one
// place, so that a flag and the same setting read back from a file cannot be checked differently.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>

#include <remat/detail/number_text.hpp>

#include "state_file.hpp"

namespace examples {

/// A flag's inclusive range: given to CLI::Range for the flag, and to check_setting for the setting a state
/// file gives.
template <typename T>
struct Limits {
  T min, max;
};

/// CLI::PositiveNumber's range (a learning rate's).
constexpr Limits<double> positive_limits{std::numeric_limits<double>::min(), std::numeric_limits<double>::max()};

/// Refuses NaN and ±inf, parsed as CLI11 parses a double (strtold of the whole text, then narrowed). Put before
/// the range check of every floating-point flag: CLI::Range tests `v < min || v > max`, false for NaN, so
/// `--dropout nan` would pass it (and train without dropout).
inline const CLI::Validator finite_number(
    [](std::string& input) {
      char* end = nullptr;
      const auto v = static_cast<double>(std::strtold(input.c_str(), &end));
      if (!input.empty() && end == input.c_str() + input.size() && std::isfinite(v)) return std::string();
      return "Value " + input + " is not a finite number";
    },
    "", "FINITE");

/// A setting as a message shows it: integers exactly, floating-point values by remat's number_text (all the
/// digits that tell it apart: a dropout of 0.9900001 is not shown as the bound 0.99).
template <typename V>
std::string setting_text(V v) {
  if constexpr (std::is_floating_point_v<V>) {
    return remat::detail::number_text(static_cast<double>(v));
  } else {
    std::ostringstream s;
    s << v;
    return s.str();
  }
}

/// Throws state_error unless `value` is in the range of `flag` (NaN is in none). A file with a valid checksum
/// may still be hand-edited, fuzzed or of another program version: its settings get the flags' checks before
/// anything uses them (a batch or a head count of 0 would divide by zero), and the message names the file.
template <typename V, typename T>
void check_setting(const StateReader& r, const char* flag, V value, Limits<T> limits) {
  const auto v = static_cast<double>(value);  // exact: the limits are below 2^53, and a larger u64 is out anyway
  if (v >= static_cast<double>(limits.min) && v <= static_cast<double>(limits.max)) return;
  throw state_error(r.path(), std::string("was written with ") + flag + " " + setting_text(value) +
                                  ", outside the flag's range " + setting_text(limits.min) + " to " +
                                  setting_text(limits.max));
}

}  // namespace examples
