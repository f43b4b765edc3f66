// REMAT_OP_KERNELS(Op): where a built-in op's kernels are compiled. Header-only use compiles an op's
// forward and backward (float and double) in every translation unit that records it, which is most of
// the compile time of a program using many ops. A program may instead compile them once:
//
//   - define REMAT_EXTERN_OP_KERNELS in every translation unit (e.g. target_compile_definitions), and
//   - compile one more translation unit whose first remat include is <remat/instantiate_op_kernels.hpp>:
//     it defines REMAT_INSTANTIATE_OP_KERNELS and holds every built-in op's kernels for float and double.
//
// Nothing else changes: the same tables, the same code, the same results (remat/detail/extern_templates.hpp
// does the same for the tape's class templates). All translation units must share one -march level: Eigen's
// vector types and alignment depend on it. Ops defined outside the
// library (remat/op.hpp) are compiled where they are used, as before. Every op header ends with
// REMAT_OP_KERNELS(its op struct); a new built-in op adds that line too.
#pragma once
#define REMAT_DETAIL_OP_KERNELS_INCLUDED

#define REMAT_DETAIL_OP_TABLE(declaration, Op, T) \
  declaration const ::remat::detail::OpTable<T>* ::remat::detail::op_table_of<Op, T>();

// REMAT_OP_KERNELS_FLOAT_ONLY (with either of the two above, in every translation unit): only the float kernels
// and class templates are compiled once; the double ones are compiled where they are used, as header-only. For a
// program that records in double rarely or not at all (scripts/test.sh's optimised build: half the kernels'
// compile time).
#if defined(REMAT_OP_KERNELS_FLOAT_ONLY)
#define REMAT_DETAIL_OP_TABLE_DOUBLE(declaration, Op)
#else
#define REMAT_DETAIL_OP_TABLE_DOUBLE(declaration, Op) REMAT_DETAIL_OP_TABLE(declaration, Op, double)
#endif

#if defined(REMAT_INSTANTIATE_OP_KERNELS)
#define REMAT_OP_KERNELS(Op)                 \
  REMAT_DETAIL_OP_TABLE(template, Op, float) \
  REMAT_DETAIL_OP_TABLE_DOUBLE(template, Op)
#elif defined(REMAT_EXTERN_OP_KERNELS)
#define REMAT_OP_KERNELS(Op)                        \
  REMAT_DETAIL_OP_TABLE(extern template, Op, float) \
  REMAT_DETAIL_OP_TABLE_DOUBLE(extern template, Op)
#else
#define REMAT_OP_KERNELS(Op)
#endif
