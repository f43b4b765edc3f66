#!/usr/bin/env bash
# Installs what is missing (the fortunes corpus among it), builds the GPT example (Release, in build/), and
# trains it on /usr/share/games/fortunes with the default flags. Extra arguments go to the example, e.g.
#   scripts/train-gpt.sh --checkpoint block --steps 300 --json
# See docs/gpt.md §Training for the flags and the measured default run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" \
  -DREMAT_EXAMPLES_EXTERN_OP_KERNELS=OFF >/dev/null
cmake --build build --target gpt -j"$(nproc)"
# libgomp's default wait spins: when other programs keep the cores busy (a build, another job), each thread
# of the team spins on a core the others need, and an epoch can take many times longer. Passive waits avoid
# that; on an idle machine they cost time instead, the more so where the CPU is slow to wake a sleeping thread
# (docs/design.md §6). Set OMP_WAIT_POLICY (or GOMP_SPINCOUNT) to choose otherwise: OMP_WAIT_POLICY=ACTIVE is
# the fast choice on an idle machine.
if [[ -z ${OMP_WAIT_POLICY:-} && -z ${GOMP_SPINCOUNT:-} ]]; then
  export OMP_WAIT_POLICY=PASSIVE
fi
# OpenBLAS falls back to slow generic kernels on a CPU it does not recognise: choose its fast ones then.
source scripts/openblas-coretype.sh
openblas_coretype_apply
exec build/examples/gpt/gpt "$@"
