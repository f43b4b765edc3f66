# Sourced by scripts/train.sh, scripts/train-gpt.sh (which call openblas_coretype_apply) and bench/common.sh
# (which calls openblas_coretype_choice). When OpenBLAS falls back to its generic Prescott (SSE3) kernels
# because it does not recognise the CPU (Debian 12's OpenBLAS 0.3.21 on Intel Xeon family 6 model 207),
# the choice is the newest kernel set the CPU's instructions allow: the same as
# remat::suggested_openblas_coretype() (include/remat/blas.hpp; tests/ops/blas_test.cpp compares the two).
# The W0-W2 steps run 2-5x faster with it there (bench/probes/README.md). Defines functions only.

# Prints the kernel set to choose, or nothing when OpenBLAS (without OPENBLAS_CORETYPE) recognises the CPU.
openblas_coretype_choice() {
  # The OpenMP build remat's CMake prefers, else the one the dynamic linker finds (both pick kernels alike).
  local library=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
  [[ -r $library ]] || library=libopenblas.so.0
  local kernels
  # The core name of a DYNAMIC_ARCH build (only there does OPENBLAS_CORETYPE choose the kernels).
  kernels=$(env -u OPENBLAS_CORETYPE python3 -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.openblas_get_corename.restype = lib.openblas_get_config.restype = ctypes.c_char_p
if b"DYNAMIC_ARCH" in lib.openblas_get_config(): print(lib.openblas_get_corename().decode())' "$library" 2>/dev/null) ||
    return 0
  [[ $kernels == Prescott ]] || return 0
  local flags
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2 || true) "
  local choice=
  if [[ $flags == *" avx512f "* && $flags == *" avx512bw "* && $flags == *" avx512dq "* && $flags == *" avx512vl "* ]]; then
    choice=SkylakeX
    [[ $flags == *" avx512_bf16 "* ]] && choice=Cooperlake
  elif [[ $flags == *" avx2 "* && $flags == *" fma "* ]]; then
    choice=Haswell
  fi
  echo "$choice"
}

# Exports OPENBLAS_CORETYPE=<the choice> (and says so on stderr) unless the user set it.
openblas_coretype_apply() {
  [[ -z ${OPENBLAS_CORETYPE:-} ]] || return 0
  local choice
  choice=$(openblas_coretype_choice)
  [[ -n $choice ]] || return 0
  echo "OpenBLAS does not recognise this CPU (it would run its generic Prescott kernels): OPENBLAS_CORETYPE=$choice" >&2
  export OPENBLAS_CORETYPE=$choice
}
