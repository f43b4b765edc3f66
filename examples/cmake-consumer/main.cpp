// Trains nothing: checks that an installed remat compiles, links and differentiates.
#include <remat/remat.hpp>

#include <cmath>
#include <iostream>

int main() {
  remat::Tape<double> tape;
  remat::Matrix<double> w(1, 1);
  w << 0.5;
  auto x = tape.variable(w);
  auto loss = remat::sum(remat::tanh(x));
  tape.backward(loss);
  const double expected = 1 - std::tanh(0.5) * std::tanh(0.5);
  const double got = x.grad()(0, 0);
  std::cout << "d tanh(0.5) / dx = " << got << " (expected " << expected << ")\n";
  return std::abs(got - expected) < 1e-12 ? 0 : 1;
}
