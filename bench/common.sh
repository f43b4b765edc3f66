# Shared by the suites of bench/run.sh and the probes (source it): waiting for an idle machine, and the
# environment every timed command runs in (bench/README.md, Environment).

# Waits until the 1-minute load average is below 0.5 (a compile on one of two cores doubles wall-clock
# medians).
wait_for_idle() {
  while awk '{exit !($1 >= 0.5)}' /proc/loadavg; do
    echo "waiting for an idle machine: load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    sleep 30
  done
}

# The C++ runs' environment: OpenBLAS's full-speed kernels (an earlier sandbox's OPENBLAS_CORETYPE halved its
# GEMM, so the user's setting is dropped; on a CPU OpenBLAS does not recognise, the kernels
# scripts/openblas-coretype.sh chooses; bench/RESULTS.md names them),
# glibc's malloc tuned for LibTorch (bench/README.md), libgomp's default wait policy. All implementations
# share one OpenBLAS there, its OpenMP build (CMake's choice with REMAT_USE_OPENMP), whose products run on the
# same libgomp team as remat's and ATen's kernels: with it OMP_WAIT_POLICY=PASSIVE, the tuning for the pthreads
# build, slows every implementation (bench/run.sh's `passive` run shows it).
source "$(dirname "${BASH_SOURCE[0]}")/../scripts/openblas-coretype.sh"
tuned=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
openblas_coretype=$(openblas_coretype_choice)
[[ -z $openblas_coretype ]] || tuned+=(OPENBLAS_CORETYPE="$openblas_coretype")
tuned+=(GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=68719476736)
