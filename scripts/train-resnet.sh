#!/usr/bin/env bash
# Installs what is missing, builds the ResNet example (Release, in build/), and trains it on Fashion-MNIST with
# the default flags. Extra arguments go to the example, e.g.
#   scripts/train-resnet.sh --checkpoint block --json
# See docs/resnet.md for the flags and the measured default run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O3 -DNDEBUG" \
  -DREMAT_EXAMPLES_EXTERN_OP_KERNELS=OFF >/dev/null
cmake --build build --target resnet -j"$(nproc)"
# Passive waits for OpenMP's threads, as scripts/train.sh explains: spinning threads slow everything down when
# another program shares the cores. OMP_WAIT_POLICY=ACTIVE is the fast choice on an idle machine.
if [[ -z ${OMP_WAIT_POLICY:-} && -z ${GOMP_SPINCOUNT:-} ]]; then
  export OMP_WAIT_POLICY=PASSIVE
fi
source scripts/openblas-coretype.sh
openblas_coretype_apply
exec build/examples/resnet/resnet "$@"
