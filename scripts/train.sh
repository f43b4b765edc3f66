#!/usr/bin/env bash
# The README's first command: installs what is missing, builds the MLP example (Release, in build/), and
# trains it on Fashion-MNIST with the default flags. Extra arguments go to the example, e.g.
#   scripts/train.sh --checkpoint sqrt --hidden 1024,1024,1024,1024 --json
# See docs/mlp.md for the flags and the measured numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target mlp -j"$(nproc)"
exec build/examples/mlp/mlp "$@"
