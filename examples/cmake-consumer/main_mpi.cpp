// Built (not run) by the install test when remat was installed with MPI: the installed remat::mpi target
// finds <remat/distributed/...> and links MPI.
#include <remat/distributed/environment.hpp>

int main(int argc, char** argv) {
  remat::distributed::Environment environment(argc, argv);
  return remat::distributed::rank() >= 0 ? 0 : 1;
}
