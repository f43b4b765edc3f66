// remat's data parallelism on MPI (docs/distributed.md): link the CMake target remat::mpi. The core headers
// (remat/remat.hpp) never include MPI.
#pragma once

#include "remat/distributed/buffers.hpp"
#include "remat/distributed/environment.hpp"
#include "remat/distributed/gradient_reducer.hpp"
#include "remat/distributed/parameters.hpp"
#include "remat/distributed/step_timing.hpp"
