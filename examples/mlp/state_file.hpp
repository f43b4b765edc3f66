// The MLP example's training-state file: the examples' common format (examples/common/state_file.hpp)
// with the magic "REMATMLP", version 1. Kept as mlp:: names so main.cpp reads as before.
#pragma once

#include <string>
#include <vector>

#include "../common/state_file.hpp"

namespace mlp {

using examples::state_error;
using examples::StateReader;
using examples::StateWriter;

inline constexpr examples::StateFormat state_format{{'R', 'E', 'M', 'A', 'T', 'M', 'L', 'P'}, 1, "remat MLP"};

inline void write_state_file(const std::string& path, const std::vector<unsigned char>& payload) {
  examples::write_state_file(path, state_format, payload);
}
inline StateReader read_state_file(const std::string& path) {
  return examples::read_state_file(path, state_format);
}

}  // namespace mlp
