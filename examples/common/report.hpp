// What the examples print and how they seed dropout: CPU time, byte counts, --estimate's report, exact numbers
// in JSON, the parameters' CRC-32, and the per-step dropout stream (examples/mlp and examples/gpt share these).
#pragma once

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include <remat/estimate.hpp>
#include <remat/nn/linear.hpp>  // remat::nn::Generator
#include <remat/parameter.hpp>

namespace examples {

/// CPU time of this process (all threads), seconds. On a shared machine the wall time depends on the other
/// processes; the CPU time of a 1-thread run is what the training costs.
inline double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

/// "12.35 MB" (10⁶ bytes).
inline std::string megabytes(std::size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return s;
}

/// --estimate's report: the step's saved, peak and replayed bytes, in MB and exactly; with `json`, then one
/// JSON line {"estimate":true, the figures, `settings`} whose saved and peak keys are `saved_key` and
/// `peak_key` (the names of the example's training JSON, so that the two compare key by key).
inline void print_estimate(const remat::MemoryEstimate& e, bool json, const char* saved_key, const char* peak_key,
                           const std::string& settings) {
  std::printf("saved after the forward pass: %s (%zu bytes)\n", megabytes(e.saved_bytes).c_str(), e.saved_bytes);
  std::printf("peak of forward + backward:   %s (%zu bytes)\n", megabytes(e.peak_bytes).c_str(), e.peak_bytes);
  std::printf("replayed by checkpoints:      %s (%zu bytes, %zu ops)\n", megabytes(e.replayed_bytes).c_str(),
              e.replayed_bytes, e.replayed_ops);
  if (json)
    std::printf(
        "{\"estimate\":true,\"%s\":%zu,\"%s\":%zu,\"forward_peak_bytes\":%zu,\"replayed_bytes\":%zu,\"replayed_ops\":%"
        "zu,"
        "%s}\n",
        saved_key, e.saved_bytes, peak_key, e.peak_bytes, e.forward_peak_bytes, e.replayed_bytes, e.replayed_ops,
        settings.c_str());
}

/// %.17g: doubles round-trip exactly, so equal text means bitwise equal values.
inline std::string number(double v) {
  char buffer[40];
  std::snprintf(buffer, sizeof buffer, "%.17g", v);
  return buffer;
}

/// A JSON string: valid UTF-8 sequences as they are, any other byte as U+FFFD, controls escaped.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7f) {
        char e[8];
        std::snprintf(e, sizeof e, "\\u%04x", c);
        out += e;
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const std::size_t n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    bool valid = n > 0 && i + n <= s.size();
    for (std::size_t k = 1; valid && k < n; ++k) valid = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (valid && n == 3) {  // no overlong forms, no surrogates
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      valid = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
    }
    if (valid && n == 4) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      valid = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
    }
    if (valid) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xef\xbf\xbd";
      ++i;
    }
  }
  return out + "\"";
}

/// The dropout stream of training step `step`: a pure function of the seed and the step, so a resumed run
/// (and every checkpoint mode, whose replays redraw the same masks) sees the same masks.
inline std::uint64_t dropout_seed(std::uint64_t seed, std::uint64_t step) {
  remat::nn::Generator g(seed ^ 0xd1b54a32d192ed03ULL);
  g.set_state(g.state() + step * 0x9e3779b97f4a7c15ULL);
  return g.next();
}

/// CRC-32 of the bytes of every parameter's value, in order: equal runs have bitwise equal parameters.
inline std::uint32_t parameters_crc32(const std::vector<remat::Parameter<float>*>& parameters) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const remat::Parameter<float>* p : parameters)
    crc = crc32(crc, reinterpret_cast<const Bytef*>(p->value().data()),
                static_cast<uInt>(static_cast<std::size_t>(p->value().size()) * sizeof(float)));
  return static_cast<std::uint32_t>(crc);
}

}  // namespace examples
