#!/usr/bin/env bash
# Installs what is missing, then builds and runs the test suite in two builds: an AddressSanitizer +
# UndefinedBehaviorSanitizer build at -Og with assertions on (the UBSan checks it leaves out, and why, are in
# CMakeLists.txt), which runs every GoogleTest program but tests/full_size and tests/examples, and builds no
# example; and an optimised build with assertions off (-O1 -DNDEBUG), which runs what needs full speed, the
# real malloc or the example binaries: the full-size workloads (tests/full_size), the allocation counts
# (tests/alloc), the examples' command lines (tests/examples) and end-to-end tests, the install test and the
# README example. Compiling every test program in both builds did not fit the suite's 10 minutes
# (REMAT_TEST_PROGRAMS in tests/CMakeLists.txt). Compiling is most of the time, so both use the cheapest
# level that serves: -O1 compiles in 80 % of -O2's time (60 % of -O3's) and still runs Eigen's vectorised
# kernels, which are written with intrinsics; -Og runs the sanitized tests four times faster than -O0, whose
# 30 % shorter compile does not pay for that. The sanitizer build has no debug information (-g1 costs 12 % of
# its compile): reports name functions, not lines; for lines, rebuild one test with -g. In both, the examples
# and tests use the op kernels compiled once (REMAT_EXAMPLES_EXTERN_OP_KERNELS, examples/CMakeLists.txt). The
# two builds share one pool of $(nproc) compile jobs (one make jobserver), and each runs its tests as soon as
# it is built.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
# The optimised build records in float: it compiles only the float op kernels
# once (REMAT_TESTS_OP_KERNELS_FLOAT_ONLY, tests/CMakeLists.txt).
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DREMAT_BUILD_BENCHMARKS=OFF -DREMAT_TEST_PROGRAMS="full_size;alloc;examples" -DREMAT_EXAMPLES_EXTERN_OP_KERNELS=ON \
  -DREMAT_TESTS_OP_KERNELS_FLOAT_ONLY=ON >/dev/null
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og" \
  -DREMAT_SANITIZE=ON -DREMAT_BUILD_BENCHMARKS=OFF -DREMAT_EXAMPLES_EXTERN_OP_KERNELS=ON >/dev/null
# Up to 2 × $(nproc) test programs run at once, each with a thread team of $(nproc) threads (remat's kernels
# and OpenBLAS's OpenMP build share it): with libgomp's default active wait, a team's idle threads spin
# for a while against the other programs' working threads. Passive waits make them sleep at once. No
# result depends on it (the kernels are bitwise equal at every thread count, docs/design.md §6).
export OMP_WAIT_POLICY=PASSIVE
# Each build runs its tests as soon as it is built, while the other still compiles (the optimised build, the
# smaller, finishes first), so that neither the last translation units of one build nor the last long tests of
# the other leave a core idle. -k: one build's failure does not stop the other.
echo "== building both builds and running their tests (optimised; AddressSanitizer + UndefinedBehaviorSanitizer) =="
logs=$(mktemp -d)
status=0
make -k --no-print-directory -j"$jobs" -f - both JOBS="$jobs" LOGS="$logs" <<'EOF' || status=1
both: optimised sanitized
optimised: ; +cmake --build build-test && cd build-test && ctest --output-on-failure -j$(JOBS) > $(LOGS)/optimised.log 2>&1
sanitized: ; +cmake --build build-sanitize && cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 \
  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS) > $(LOGS)/sanitized.log 2>&1
.PHONY: both optimised sanitized
EOF
echo "== optimised build =="
cat "$logs/optimised.log" 2>/dev/null || echo "(its tests did not run: see the build's output above)"
echo "== AddressSanitizer + UndefinedBehaviorSanitizer build =="
cat "$logs/sanitized.log" 2>/dev/null || echo "(its tests did not run: see the build's output above)"
rm -rf "$logs"
exit "$status"
