# Finds the OpenBLAS that remat routes Eigen's matrix products to (REMAT_USE_BLAS) and defines the imported
# target remat::openblas for it. Both remat's CMakeLists.txt and the installed package's rematConfig.cmake
# use it, so that a consumer's machine finds its OpenBLAS by the same rule that found the build's, instead of
# the package naming a path of the machine it was built on. The library found is the cache variable
# REMAT_OPENBLAS_LIBRARY (set it to use another); remat::openblas is not defined when none is found.
#
# remat_find_openblas(<prefer_openmp>): with remat's kernels on an OpenMP team (REMAT_USE_OPENMP), OpenBLAS's
# OpenMP build comes first (Debian: libopenblas-openmp-dev), so that its products and remat's kernels share
# one thread team. The pthread build keeps a pool of its own whose idle threads spin in sched_yield after
# every product, on the cores the kernels' team then wants (docs/design.md §6, "Which OpenBLAS").
function(remat_find_openblas prefer_openmp)
  if(prefer_openmp AND CMAKE_LIBRARY_ARCHITECTURE)
    find_library(REMAT_OPENBLAS_LIBRARY NAMES openblas PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp
                 NO_DEFAULT_PATH)
  endif()
  find_library(REMAT_OPENBLAS_LIBRARY NAMES openblas)
  if(REMAT_OPENBLAS_LIBRARY AND NOT TARGET remat::openblas)
    add_library(remat::openblas UNKNOWN IMPORTED)
    set_target_properties(remat::openblas PROPERTIES IMPORTED_LOCATION "${REMAT_OPENBLAS_LIBRARY}")
  endif()
endfunction()
