# Finds oneDNN 2.x (Debian: libdnnl-dev), on which conv2d's float kernels run (REMAT_USE_ONEDNN), and defines the
# imported target remat::dnnl for it. remat's CMakeLists.txt and the installed package's rematConfig.cmake both
# use it, so that a consumer's machine finds its oneDNN by the same rule. It looks for the header and the library
# itself rather than calling find_package(dnnl): Debian's dnnl-config.cmake requires OpenCL's development files
# for a GPU runtime remat does not use. remat's code is written against oneDNN 2's API (operation descriptors,
# removed in oneDNN 3), so 2.x is required. The cache variables REMAT_DNNL_INCLUDE_DIR and REMAT_DNNL_LIBRARY
# name what was found (set them to use another); remat::dnnl is not defined when no usable oneDNN is found.
function(remat_find_onednn)
  find_path(REMAT_DNNL_INCLUDE_DIR NAMES oneapi/dnnl/dnnl.hpp)
  find_library(REMAT_DNNL_LIBRARY NAMES dnnl)
  if(NOT REMAT_DNNL_INCLUDE_DIR OR NOT REMAT_DNNL_LIBRARY OR TARGET remat::dnnl)
    return()
  endif()
  file(STRINGS "${REMAT_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _major REGEX "#define DNNL_VERSION_MAJOR ")
  file(STRINGS "${REMAT_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h" _runtime REGEX "#define DNNL_CPU_RUNTIME ")
  if(NOT _major MATCHES " 2$")
    message(STATUS "remat: oneDNN at ${REMAT_DNNL_INCLUDE_DIR} is not version 2.x; conv2d stays on im2col")
    return()
  endif()
  if(NOT _runtime MATCHES "DNNL_RUNTIME_OMP")
    message(STATUS "remat: oneDNN at ${REMAT_DNNL_INCLUDE_DIR} is not built on OpenMP; conv2d stays on im2col")
    return()
  endif()
  add_library(remat::dnnl UNKNOWN IMPORTED)
  set_target_properties(remat::dnnl PROPERTIES IMPORTED_LOCATION "${REMAT_DNNL_LIBRARY}"
                                               INTERFACE_INCLUDE_DIRECTORIES "${REMAT_DNNL_INCLUDE_DIR}")
endfunction()
