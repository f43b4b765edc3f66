// The examples' default thread count (--threads 0).
#pragma once

#include <algorithm>
#include <cstdlib>
#include <string>

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

/// ", OpenBLAS <kernels>" for the run's header line ("" without OpenBLAS); when OpenBLAS runs its generic
/// fallback kernels on a CPU with AVX2 or AVX-512, followed by a line naming the OPENBLAS_CORETYPE that
/// selects the fast ones (scripts/train.sh sets it by itself). On stdout, so rank 0 alone prints it.
inline std::string blas_kernels_text() {
  const std::string kernels = remat::openblas_corename();
  if (kernels.empty()) return {};
  std::string text = ", OpenBLAS " + kernels + " kernels";
  const std::string suggested = remat::suggested_openblas_coretype();
  if (!suggested.empty())
    text += "\nnote: OpenBLAS does not recognise this CPU and runs its generic " + kernels +
            " kernels; training steps ran 2-5x faster on such a machine with OPENBLAS_CORETYPE=" + suggested +
            " in the environment (docs/design.md §6)";
  return text;
}

}  // namespace examples
