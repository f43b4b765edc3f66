// RestoreThreads: puts remat's thread setting back at the end of a test that changes it.
#pragma once

#include "remat/threads.hpp"

namespace remat_test {

/// Puts the thread setting back after a test (set_num_threads is process-wide).
struct RestoreThreads {
  int saved = remat::num_threads();
  ~RestoreThreads() { remat::set_num_threads(saved); }
};

}  // namespace remat_test
