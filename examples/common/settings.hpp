// What the examples' command-line flags and the settings their state files give are checked against, in one
// place, so that a flag and the same setting read back from a file cannot be checked differently.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include <remat/errors.hpp>

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

/// The integer `text` spells in decimal, or nullopt unless it is decimal digits (after a '-' for a signed T)
/// whose value fits in T. Leading zeros are decimal too: "010" is 10.
template <typename T>
std::optional<T> parse_decimal(const std::string& text) {
  static_assert(std::is_integral_v<T>);
  T value{};
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value, 10);
  if (text.empty() || error != std::errc{} || stop != end) return std::nullopt;
  return value;
}

/// Why parse_decimal<T> refused `text`: digits (after an optional '-') out of T's range, or not decimal digits.
/// (A value in T's range but out of the flag's is the range check's to name.)
template <typename T>
std::string not_decimal_message(const std::string& text) {
  const std::size_t digits = !text.empty() && text[0] == '-' ? 1 : 0;
  if (text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos)
    return "Value " + text + " is out of range " + std::to_string(std::numeric_limits<T>::min()) + " to " +
           std::to_string(std::numeric_limits<T>::max());
  return "Value \"" + text + "\" is not a decimal integer (digits only: no spaces, '+', exponent or 0x prefix)";
}

/// CLI11 2.1 converts integers with base 0 (`--epochs 010` is octal 8, `--epochs 0x10` is 16) and narrows an
/// unsigned value out of range to the type's largest (`--seed -1` and `--seed 18446744073709551616` both
/// become 2^64 − 1) without a word. This transform runs first among an integer flag's validators (CLI11 puts
/// transforms before checks): it refuses anything but decimal digits ('-' only for a signed T) of a value in
/// T's range, and rewrites the text as plain decimal for the conversion and the range check after it.
template <typename T>
CLI::Validator decimal_integer() {
  return CLI::Validator(
      [](std::string& input) {
        const std::optional<T> value = parse_decimal<T>(input);
        if (!value) return not_decimal_message<T>(input);
        input = std::to_string(*value);
        return std::string();
      },
      "", "DECIMAL");
}

/// A comma-separated list of decimal integers in [limits.min, limits.max] (--hidden): every field must be
/// one, so "8,,8" or "8," is refused rather than read as two layers or one. Throws CLI::ValidationError
/// naming `flag`.
template <typename T>
std::vector<T> parse_decimal_list(const char* flag, const std::string& text, Limits<T> limits) {
  std::vector<T> values;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = text.find(',', begin);
    const std::string field = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const std::string where = "field " + std::to_string(values.size() + 1) + " of " + text;
    if (field.empty()) throw CLI::ValidationError(flag, where + " is empty");
    const std::optional<T> value = parse_decimal<T>(field);
    if (!value) throw CLI::ValidationError(flag, where + ": " + not_decimal_message<T>(field));
    if (*value < limits.min || *value > limits.max)
      throw CLI::ValidationError(flag, where + ": Value " + field + " not in range " + std::to_string(limits.min) +
                                           " to " + std::to_string(limits.max));
    values.push_back(*value);
    if (comma == std::string::npos) return values;
    begin = comma + 1;
  }
}

/// A setting as a message shows it: integers exactly, floating-point values by remat's number_text (all the
/// digits that tell it apart: a dropout of 0.9900001 is not shown as the bound 0.99).
template <typename V>
std::string setting_text(V v) {
  if constexpr (std::is_floating_point_v<V>) {
    return remat::number_text(static_cast<double>(v));
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
