#!/usr/bin/env bash
# Installs what is missing, then builds and runs the whole test suite twice: an optimised build, and an
# AddressSanitizer + UndefinedBehaviorSanitizer build with assertions on. The sanitizer build is compiled at
# -O0 with line tables (-g1): ASan and UBSan check every access and operation at -O0 as well (none is
# optimised away), reports keep file and line, and it compiles in well under half the time of -O1 -g1.
# The two builds share one pool of $(nproc) compile jobs (one make jobserver), so that neither build's last,
# largest translation unit leaves a core idle.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DREMAT_BUILD_BENCHMARKS=OFF >/dev/null
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1" \
  -DREMAT_SANITIZE=ON -DREMAT_BUILD_BENCHMARKS=OFF >/dev/null
make --no-print-directory -j"$jobs" -f - both <<'EOF'
both: optimised sanitized
optimised: ; +cmake --build build
sanitized: ; +cmake --build build-sanitize
.PHONY: both optimised sanitized
EOF
echo "== optimised build =="
(cd build && ctest --output-on-failure -j"$jobs")
echo "== AddressSanitizer + UndefinedBehaviorSanitizer build =="
(cd build-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j"$jobs")
