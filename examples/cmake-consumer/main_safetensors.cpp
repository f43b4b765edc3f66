// Checks that an installed remat::safetensors compiles, links and round-trips a Parameter through a file.
#include <remat/io/safetensors.hpp>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer_safetensors FILE\n";
    return 2;
  }
  remat::Parameter<float> saved(remat::Matrix<float>::Random(2, 3)), loaded(remat::Matrix<float>::Zero(2, 3));
  remat::safetensors::save(argv[1], {{"w", saved}});
  remat::safetensors::load(argv[1], {{"w", loaded}});
  const bool same = loaded.value() == saved.value();
  std::cout << "safetensors round trip: " << (same ? "equal" : "DIFFERENT") << "\n";
  return same ? 0 : 1;
}
