#!/usr/bin/env bash
# Installs what is missing, then builds and runs the whole test suite twice: an optimised build, and an
# AddressSanitizer + UndefinedBehaviorSanitizer build with assertions on (-g1: line tables only, which keep
# sanitizer reports readable at a fraction of the compile time of full debug information).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DREMAT_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build -j"$jobs"
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
  -DREMAT_SANITIZE=ON -DREMAT_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-sanitize -j"$jobs"
echo "== optimised build =="
(cd build && ctest --output-on-failure -j"$jobs")
echo "== AddressSanitizer + UndefinedBehaviorSanitizer build =="
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$jobs")
