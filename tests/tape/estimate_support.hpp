// The oracle of the estimate tests: the same step run for real. expect_estimate_equals_real_run(build) runs
// build on a shapes-only tape (remat::estimate_memory) and on a tape that computes, twice (a fresh tape, then
// the same tape after clear(), as a training loop reuses it), estimates it again once the Parameters hold
// gradients, and compares every figure, byte for byte.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "memory.hpp"
#include "remat/remat.hpp"

namespace estimate_test {

/// One thread for remat's kernels and OpenBLAS while it lives (then the setting before): byte counts do not
/// depend on threads, and on a loaded 2-core machine the small multi-threaded products of the model tests wait
/// for each other (W1-small: 2.5 s instead of 0.2 s).
struct OneThread {
  const int before = remat::num_threads();
  OneThread() { remat::set_num_threads(1); }
  ~OneThread() { remat::set_num_threads(before); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;
};

/// tape.memory() of a step that computes: after the forward pass, after backward.
struct Measured {
  remat::MemoryStats forward, step;
};

template <class T>
const remat::Var<T>& loss_of(const remat::Var<T>& loss) {
  return loss;
}
template <class T, class... Held>
const remat::Var<T>& loss_of(const std::tuple<remat::Var<T>, Held...>& result) {
  return std::get<0>(result);
}

/// Records `build` on `tape` (which computes) and runs its backward, holding what build returned.
template <class T, class Build>
Measured real_run(Build& build, remat::Tape<T>& tape) {
  const auto result = build(tape);
  Measured m;
  m.forward = tape.memory();
  tape.backward(loss_of<T>(result));
  m.step = tape.memory();
  return m;
}

inline void expect_equal(const remat::MemoryEstimate& e, const Measured& m) {
  SCOPED_TRACE("real run: after forward " + remat_test::describe(m.forward) + "; after backward " +
               remat_test::describe(m.step));
  EXPECT_EQ(e.saved_bytes, m.forward.saved_bytes);
  EXPECT_EQ(e.forward_peak_bytes, m.forward.peak_bytes);
  EXPECT_EQ(e.peak_bytes, m.step.peak_bytes);
  EXPECT_EQ(e.replayed_bytes, m.step.replayed_bytes);
  EXPECT_EQ(e.replayed_ops, m.step.replayed_ops);
}

/// The estimate of `build` equals the real run on a fresh tape and on a reused one; returns the estimate.
template <class T, class Build>
remat::MemoryEstimate expect_estimate_equals_real_run(Build build, const std::string& what) {
  SCOPED_TRACE(what);
  const remat::MemoryEstimate e = remat::estimate_memory<T>(build);
  remat::Tape<T> tape;
  expect_equal(e, real_run<T>(build, tape));
  tape.clear();
  const Measured again = real_run<T>(build, tape);
  expect_equal(e, again);
  // Once the Parameters hold gradients (the real runs defined them), an estimate counts the same.
  expect_equal(remat::estimate_memory<T>(build), again);
  EXPECT_GT(e.peak_bytes, 0u);
  EXPECT_GE(e.peak_bytes, e.forward_peak_bytes);
  return e;
}

}  // namespace estimate_test
