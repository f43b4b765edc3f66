#!/usr/bin/env bash
# Installs what is missing (the fortunes corpus among it), builds the GPT example (Release, in build/), and
# trains it on /usr/share/games/fortunes with the default flags. Extra arguments go to the example, e.g.
#   scripts/train-gpt.sh --checkpoint block --steps 300 --json
# See docs/gpt.md §Training for the flags and the measured default run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target gpt -j"$(nproc)"
exec build/examples/gpt/gpt "$@"
