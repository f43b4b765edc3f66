"""Thread settings shared by the PyTorch peers: torch's intra-op threads and every OpenBLAS mapped into
the process (Debian's torch calls the generic libblas.so.3, which the alternatives system points at
OpenBLAS; OpenBLAS's own thread count is separate from torch's)."""
import ctypes


def loaded_blas():
    """Paths of the BLAS libraries mapped into this process."""
    paths = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if ("blas" in path or "mkl" in path) and ".so" in path:
                paths.add(path)
    return sorted(paths)


def set_threads(n):
    """torch.set_num_threads(n) and openblas_set_num_threads(n) in every OpenBLAS mapped in."""
    import torch  # here, not at the top: a peer may import torch only after setting its environment

    torch.set_num_threads(n)
    for path in loaded_blas():
        try:
            lib = ctypes.CDLL(path)
            if hasattr(lib, "openblas_set_num_threads"):
                lib.openblas_set_num_threads(n)
        except OSError:
            pass
