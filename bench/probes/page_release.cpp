// What releasing a large buffer costs the next pass over other memory (docs/mlp.md, "Loading the data"):
// writes `data` MiB (default 188, the Fashion-MNIST training images as floats), then maps, writes and
// unmaps a buffer of `release` KiB, then times two passes over the data that copy its 3136-byte rows
// (784 floats) in a random order, 128 at a time, as the MLP example gathers its batches.
//   page_release <release KiB> [data MiB]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: page_release <release KiB> [data MiB]\n");
    return 2;
  }
  const std::size_t release = std::strtoull(argv[1], nullptr, 10) << 10;
  const std::size_t row = 784,
                    rows = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) << 20 : 188'160'000) / (row * sizeof(float));
  std::vector<float> data(rows * row);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 255) / 255.0f;
  const auto t0 = std::chrono::steady_clock::now();
  if (release > 0) {
    void* p = mmap(nullptr, release, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    std::memset(p, 1, release);
    munmap(p, release);
  }
  const double release_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::vector<float> batch(128 * row);
  std::vector<std::size_t> order(rows);
  std::mt19937_64 random(1);
  double sink = 0, pass_ms[2];
  for (double& ms : pass_ms) {
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), random);
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t first = 0; first < rows; first += 128) {
      const std::size_t m = std::min<std::size_t>(128, rows - first);
      for (std::size_t i = 0; i < m; ++i)
        std::memcpy(batch.data() + i * row, data.data() + order[first + i] * row, row * sizeof(float));
      sink += batch[0];
    }
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("release %zu KiB (%.1f ms): pass 1 %.1f ms, pass 2 %.1f ms  (%g)\n", release >> 10, release_ms,
              pass_ms[0], pass_ms[1], sink > 0 ? 0.0 : 1.0);
  return 0;
}
