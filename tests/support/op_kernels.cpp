// Every built-in op's kernels, compiled once for all test programs (they define REMAT_EXTERN_OP_KERNELS;
// see remat/detail/op_kernels.hpp). Without this, each test directory's translation unit compiled them
// again: most of the suite's compile time.
#include <remat/instantiate_op_kernels.hpp>
