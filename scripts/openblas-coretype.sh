# Sourced by scripts/train.sh, scripts/train-gpt.sh and bench/common.sh: when OPENBLAS_CORETYPE is unset and
# OpenBLAS falls back to its generic Prescott (SSE3) kernels because it does not recognise the CPU (Debian
# 12's OpenBLAS 0.3.21 on Intel Xeon family 6 model 207, 2026), exports the newest kernel set the CPU's
# instructions allow: the same choice as remat::suggested_openblas_coretype() (include/remat/blas.hpp).
# The W0-W2 steps ran 2-5x faster with it there (bench/RESULTS.md §9). Set OPENBLAS_CORETYPE to choose.

# Prints the kernel set to choose, or nothing when OpenBLAS (without OPENBLAS_CORETYPE) recognises the CPU.
openblas_coretype_choice() {
  # The OpenMP build remat's CMake prefers, else the one the dynamic linker finds (both pick kernels alike).
  local library=/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0
  [[ -r $library ]] || library=libopenblas.so.0
  local kernels
  kernels=$(env -u OPENBLAS_CORETYPE python3 -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' "$library" 2>/dev/null) || return 0
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

if [[ -z ${OPENBLAS_CORETYPE:-} ]]; then
  openblas_coretype=$(openblas_coretype_choice)
  if [[ -n $openblas_coretype ]]; then
    echo "OpenBLAS does not recognise this CPU (it would run its generic Prescott kernels): OPENBLAS_CORETYPE=$openblas_coretype" >&2
    export OPENBLAS_CORETYPE=$openblas_coretype
  fi
fi
