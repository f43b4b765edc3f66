// check_same_parameters and broadcast_parameters: every rank of a data-parallel run must train the same
// parameter list, starting from the same values.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "remat/distributed/environment.hpp"
#include "remat/errors.hpp"
#include "remat/matrix.hpp"
#include "remat/parameter.hpp"

namespace remat::distributed {

/// Collective over `comm`: checks that every rank passes as many parameters, of the same shapes in the same
/// order (ranks built with different model flags would otherwise exchange mismatched buffers, or wait in a
/// collective forever). `who` names the caller in the message. Throws, on every rank alike, shape_error
/// "<who>: rank 0 has 6 parameters but rank 1 has 4 …" or "<who>: parameter 2 is [64,10] on rank 0 but
/// [32,10] on rank 1 …"; domain_error "<who>: parameter 3 is a null pointer on rank 1" for a null pointer in
/// any rank's list (on every rank too: a rank that threw alone would leave the others waiting).
template <class T>
void check_same_parameters(const std::vector<Parameter<T>*>& parameters, MPI_Comm comm = MPI_COMM_WORLD,
                           const char* who = "check_same_parameters") {
  const int ranks = size(comm);
  long long mine[2] = {static_cast<long long>(parameters.size()), -1};  // the count, the first null's index
  for (std::size_t k = 0; k < parameters.size() && mine[1] < 0; ++k)
    if (!parameters[k]) mine[1] = static_cast<long long>(k);
  std::vector<long long> all_ranks(2 * static_cast<std::size_t>(ranks));
  detail::check(MPI_Allgather(mine, 2, MPI_LONG_LONG, all_ranks.data(), 2, MPI_LONG_LONG, comm),
                "check_same_parameters: MPI_Allgather");
  for (int r = 0; r < ranks; ++r)
    if (const long long null = all_ranks[2 * static_cast<std::size_t>(r) + 1]; null >= 0)
      throw domain_error(std::string(who) + ": parameter " + std::to_string(null) + " is a null pointer on rank " +
                         std::to_string(r));
  const long long first_count = all_ranks[0];
  for (int r = 1; r < ranks; ++r)
    if (const long long count = all_ranks[2 * static_cast<std::size_t>(r)]; count != first_count)
      throw shape_error(std::string(who) + ": rank 0 has " + std::to_string(first_count) + " parameters but rank " +
                        std::to_string(r) + " has " + std::to_string(count) +
                        "; every rank must build the same model (same model flags)");
  // Every parameter's full shape, its rank then its dims: N-D shapes with the same matrix view ([2,3,4] and
  // [3,2,4]) are different models.
  constexpr std::size_t per = 1 + Shape::max_rank;
  std::vector<long long> shapes(per * parameters.size(), 0), all(shapes.size() * static_cast<std::size_t>(ranks));
  for (std::size_t k = 0; k < parameters.size(); ++k) {
    const Shape s = parameters[k]->shape();
    shapes[per * k] = s.rank();
    for (int d = 0; d < s.rank(); ++d) shapes[per * k + 1 + static_cast<std::size_t>(d)] = s[d];
  }
  detail::check(MPI_Allgather(shapes.data(), static_cast<int>(shapes.size()), MPI_LONG_LONG, all.data(),
                              static_cast<int>(shapes.size()), MPI_LONG_LONG, comm),
                "check_same_parameters: MPI_Allgather");
  auto shape_at = [](const long long* x) { return Shape(std::vector<Index>(x + 1, x + 1 + x[0])); };
  for (int r = 1; r < ranks; ++r)
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      const long long* mine = &all[static_cast<std::size_t>(r) * shapes.size() + per * k];
      const Shape first = shape_at(&all[per * k]), other = shape_at(mine);
      if (first != other)
        throw shape_error(std::string(who) + ": parameter " + std::to_string(k) + " is " + to_string(first) +
                          " on rank 0 but " + to_string(other) + " on rank " + std::to_string(r) +
                          "; every rank must build the same model (same model flags)");
    }
}

namespace detail {
/// Collective over `comm`: throws tape_error on every rank alike if, on a rank that would write them (not the
/// root of a broadcast), some Parameter's value is still read by a backward in progress (ParameterStorage::
/// check_not_read): that rank's mutable_value() would throw before its MPI_Bcast and leave the others waiting.
template <class T>
void check_not_read_anywhere(const std::vector<Parameter<T>*>& parameters, bool only_read_here, MPI_Comm comm,
                             const char* who = "broadcast_parameters") {
  long long mine = -1;  // the first parameter this rank cannot write
  for (std::size_t k = 0; k < parameters.size() && mine < 0 && !only_read_here; ++k)
    if (remat::detail::ParameterAccess::storage(*parameters[k])->being_read()) mine = static_cast<long long>(k);
  std::vector<long long> all(static_cast<std::size_t>(size(comm)));
  check(MPI_Allgather(&mine, 1, MPI_LONG_LONG, all.data(), 1, MPI_LONG_LONG, comm),
        (std::string(who) + ": MPI_Allgather").c_str());
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] >= 0)
      throw tape_error(std::string(who) + ": parameter " + std::to_string(all[r]) + " on rank " + std::to_string(r) +
                       ": a backward still reads its value (called from a gradient-ready callback before that "
                       "Parameter's gradient was ready); nothing was changed on any rank");
}
}  // namespace detail

/// Collective over `comm`: copies every parameter's value from rank `root` to every other rank (MPI_Bcast),
/// so that data-parallel training starts from the same weights everywhere (as DistributedDataParallel does
/// when it is constructed; Li et al., VLDB 2020). First checks the parameter lists (check_same_parameters).
/// The values change on the other ranks as by Parameter::mutable_value() (their version moves on); the
/// gradients are left as they were. Throws shape_error (mismatched lists, on every rank), domain_error (root
/// outside [0, size)), tape_error on every rank if a rank other than the root would change a Parameter whose
/// value a backward still reads (a call from a gradient-ready callback; Tape::on_gradient_ready), with
/// nothing changed on any rank, mpi_error.
template <class T>
void broadcast_parameters(const std::vector<Parameter<T>*>& parameters, int root = 0, MPI_Comm comm = MPI_COMM_WORLD) {
  const int ranks = size(comm);
  if (root < 0 || root >= ranks)
    throw domain_error("broadcast_parameters: root " + std::to_string(root) + " is not a rank of the " +
                       std::to_string(ranks) + "-rank communicator");
  check_same_parameters(parameters, comm, "broadcast_parameters");
  const bool is_root = rank(comm) == root;
  detail::check_not_read_anywhere(parameters, is_root, comm);
  for (Parameter<T>* p : parameters) {
    T* data = is_root ? const_cast<T*>(p->value().data()) : p->mutable_value().data();  // root's is only read
    detail::check(MPI_Bcast(data, static_cast<int>(p->value().size()), detail::datatype<T>(), root, comm),
                  "broadcast_parameters: MPI_Bcast");
  }
}

}  // namespace remat::distributed
