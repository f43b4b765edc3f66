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
# OpenMP's threads wait for the next parallel region by spinning 100,000 times, then sleep. The ResNet's kernels
# open many short regions (conv2d's im2col and col2im per sample), so waits that sleep at once (the MLP's
# OMP_WAIT_POLICY=PASSIVE) cost 2.2x at 2 threads (an epoch of 12,800 images took 39.7 s against 18.4 s with this
# spin count and 17.9 s with ACTIVE on an idle machine, docs/resnet.md), while a bounded spin leaves the cores to
# other programs soon after. Set OMP_WAIT_POLICY or GOMP_SPINCOUNT to choose otherwise.
if [[ -z ${OMP_WAIT_POLICY:-} && -z ${GOMP_SPINCOUNT:-} ]]; then
  export GOMP_SPINCOUNT=100000
fi
source scripts/openblas-coretype.sh
openblas_coretype_apply
exec build/examples/resnet/resnet "$@"
