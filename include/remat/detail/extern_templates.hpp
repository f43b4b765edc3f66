// The tape's class templates for float and double, compiled once with the built-in ops' kernels
// (remat/detail/op_kernels.hpp): under REMAT_EXTERN_OP_KERNELS a translation unit leaves them to the one
// that includes remat/instantiate_op_kernels.hpp. They were a fifth of each test program's code (the
// sweep, the recorder, the tape state, the buffers); compiling them once took 22-25 % off the compile
// time of those programs (docs/design.md §5). Included at the end of remat/remat.hpp, after every definition it names;
// a translation unit that includes only some headers instantiates what it uses, as before.
#pragma once

#define REMAT_DETAIL_CLASS_TEMPLATES(declaration, T)       \
  declaration class ::remat::detail::Sweep<T>;             \
  declaration class ::remat::detail::NodeBackward<T>;      \
  declaration class ::remat::detail::DryRunCache<T>;       \
  declaration class ::remat::detail::ChainSchedule<T>;     \
  declaration class ::remat::detail::Replays<T>;           \
  declaration class ::remat::detail::GradientDelivery<T>;  \
  declaration class ::remat::detail::SweepState<T>;        \
  declaration class ::remat::detail::TapeState<T>;         \
  declaration class ::remat::detail::TapeFigures<T>;       \
  declaration class ::remat::detail::TapeSweeps<T>;        \
  declaration class ::remat::detail::TapeCore<T>;          \
  declaration class ::remat::detail::Reports<T>;           \
  declaration class ::remat::detail::Recorder<T>;          \
  declaration class ::remat::detail::PolicyDecisions<T>;   \
  declaration class ::remat::detail::RegionRecorder<T>;    \
  declaration class ::remat::detail::Evictor<T>;           \
  declaration class ::remat::detail::EvictorBudget<T>;     \
  declaration class ::remat::detail::EvictorChoice<T>;     \
  declaration class ::remat::detail::Buffers<T>;           \
  declaration class ::remat::detail::Pool<T>;              \
  declaration class ::remat::detail::Lifetime<T>;          \
  declaration class ::remat::detail::CompressedValues<T>;  \
  declaration class ::remat::detail::LifetimeRule<T>;      \
  declaration struct ::remat::detail::Graph<T>;            \
  declaration struct ::remat::detail::ParameterStorage<T>; \
  declaration class ::remat::Parameter<T>;                 \
  declaration class ::remat::Tape<T>;

#if defined(REMAT_INSTANTIATE_OP_KERNELS)
REMAT_DETAIL_CLASS_TEMPLATES(template, float)
#if !defined(REMAT_OP_KERNELS_FLOAT_ONLY)
REMAT_DETAIL_CLASS_TEMPLATES(template, double)
#endif
#elif defined(REMAT_EXTERN_OP_KERNELS)
REMAT_DETAIL_CLASS_TEMPLATES(extern template, float)
#if !defined(REMAT_OP_KERNELS_FLOAT_ONLY)
REMAT_DETAIL_CLASS_TEMPLATES(extern template, double)
#endif
#endif
