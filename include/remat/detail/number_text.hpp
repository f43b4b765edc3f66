// detail::number_text: a double in error messages, in its shortest exact form ("1e-09", not "0.000000").
#pragma once

#include <charconv>
#include <string>

namespace remat::detail {

/// The shortest decimal text that reads back as `x` (std::to_chars): "0.001", "1e-09", "inf", "nan".
inline std::string number_text(double x) {
  char text[32];
  const auto end = std::to_chars(text, text + sizeof text, x).ptr;
  return std::string(text, end);
}

}  // namespace remat::detail
