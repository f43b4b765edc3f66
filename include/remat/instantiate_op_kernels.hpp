// Compiles every built-in op's kernels (forward and backward, float and double) and the tape's class
// templates for float and double (remat/detail/extern_templates.hpp) in this translation unit, for a
// program whose other translation units define REMAT_EXTERN_OP_KERNELS and so leave them out
// (remat/detail/op_kernels.hpp). Include it in exactly one translation unit, before any other remat
// header. A program that defines REMAT_EXTERN_OP_KERNELS without it fails to link (undefined
// remat::detail::op_table_of<…>).
#pragma once

#ifdef REMAT_DETAIL_OP_KERNELS_INCLUDED
#error "remat/instantiate_op_kernels.hpp must be the first remat header of its translation unit"
#endif
#define REMAT_INSTANTIATE_OP_KERNELS
#include "remat/remat.hpp"
