// A fixed number of training steps of one workload and implementation, for instruction counts that a busy
// machine does not distort (bench/probes/instructions.sh): run it under `valgrind --tool=callgrind` at two step
// counts; the difference divided by the difference in steps is the instructions of one steady step.
// bench/step_pairs.py times builds of it against each other (bench/probes/README.md).
//   step_count <W0|W1-small|W1|W2> <remat|captured|hand> <steps> [threads]
// (captured: the plain step run by remat::CapturedStep::replay(), MLP workloads only)
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../hand_written.hpp"
#include "../remat_model.hpp"
#include "../workloads.hpp"

namespace {

template <class W>
int run(const std::string& impl, long steps) {
  const auto data = bench::make_data(W::shape);
  float loss = 0;
  if (impl == "remat") {
    bench::RematModel<W, bench::Plain> model(data);
    for (long s = 0; s < steps + 1; ++s) loss = model.step();  // one warm-up step fills the pools
  } else if (impl == "captured") {
    if constexpr (bench::is_mlp<W>) {
      bench::RematCapturedMlp<W> model(data);
      for (long s = 0; s < steps + 1; ++s) loss = model.step();
    } else {
      std::fprintf(stderr, "step_count: captured runs the MLP workloads (W0, W1-small, W1)\n");
      return 2;
    }
  } else if (impl == "hand") {
    bench::HandChain<std::conditional_t<bench::is_mlp<W>, bench::HandMlp, bench::HandBlocks>> chain(data, W::shape, 1);
    for (long s = 0; s < steps + 1; ++s) loss = chain.step();
  } else {
    std::fprintf(stderr, "step_count: implementation must be remat, captured or hand, got %s\n", impl.c_str());
    return 2;
  }
  std::printf("%s %s %ld steps: loss %.6f\n", W::name, impl.c_str(), steps, double(loss));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: step_count <W0|W1-small|W1|W2> <remat|captured|hand> <steps> [threads]\n");
    return 2;
  }
  const std::string workload = argv[1], impl = argv[2];
  const long steps = std::atol(argv[3]);
  remat::set_num_threads(argc > 4 ? std::atoi(argv[4]) : 1);
  if (workload == "W0") return run<bench::W0>(impl, steps);
  if (workload == "W1-small") return run<bench::W1Small>(impl, steps);
  if (workload == "W1") return run<bench::W1>(impl, steps);
  if (workload == "W2") return run<bench::W2>(impl, steps);
  std::fprintf(stderr, "step_count: workload must be W0, W1-small, W1 or W2, got %s\n", workload.c_str());
  return 2;
}
