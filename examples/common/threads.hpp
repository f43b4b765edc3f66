// The examples' default thread count (--threads 0).
#pragma once

#include <algorithm>
#include <cstdlib>

#include <remat/threads.hpp>

namespace examples {

/// Processes of this job on this machine: Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE when set, else `ranks`
/// (every rank on this machine), 1 without MPI.
inline int ranks_on_this_machine(int ranks) {
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) {
    const int n = std::atoi(local);
    if (n > 0) return n;
  }
  return std::max(ranks, 1);
}

/// --threads 0: remat's default thread count (omp_get_max_threads(): OMP_NUM_THREADS when set, else the CPUs
/// this process may run on) shared among the job's processes on this machine, at least 1, so that
/// `mpirun -np 2` on two cores runs two one-thread ranks instead of four threads on two cores.
inline int default_threads(int ranks) {
  return std::max(1, remat::num_threads() / ranks_on_this_machine(ranks));
}

}  // namespace examples
