// broadcast_buffers: the batch norms' running statistics and counters made rank 0's on every rank, as
// DistributedDataParallel's broadcast_buffers=True does at each forward.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/distributed/environment.hpp"
#include "remat/distributed/parameters.hpp"
#include "remat/errors.hpp"
#include "remat/nn/batch_norm2d.hpp"
#include "remat/parameter.hpp"

namespace remat::distributed {

/// Collective over `comm`: copies every layer's buffers (running_mean, running_var and num_batches_tracked) from
/// rank `root` to every other rank, in one MPI_Bcast of the statistics and one of the counters.
///
/// The GradientReducer averages gradients only: a buffer has none, so each rank's running statistics follow its
/// own shards' batch statistics and drift apart from the other ranks'. PyTorch's DistributedDataParallel, by
/// default (broadcast_buffers=True), broadcasts rank 0's buffers to every rank at the start of each forward;
/// calling this before each training forward (or once per step, before the first micro-batch's forward) does the
/// same, so every rank's buffers are rank 0's, which only rank 0's shards move. Call it before evaluating or
/// saving on a rank other than 0 too.
///
/// Every rank must pass as many layers, of the same channels, in the same order (checked first, as
/// check_same_parameters checks the list of their statistics, two per layer). The statistics change on the other
/// ranks as by Parameter::mutable_value() (their version moves on); the root's are only read. Throws, on every
/// rank alike, shape_error for mismatched lists, domain_error for a null layer or a root outside [0, size),
/// tape_error if a rank other than the root would change a statistic a backward still reads (a call from a
/// gradient-ready callback of a tape that recorded it as a variable), with nothing changed on any rank; mpi_error.
template <class T>
void broadcast_buffers(const std::vector<nn::BatchNorm2d<T>*>& layers, int root = 0, MPI_Comm comm = MPI_COMM_WORLD) {
  const int ranks = size(comm);
  if (root < 0 || root >= ranks)
    throw domain_error("broadcast_buffers: root " + std::to_string(root) + " is not a rank of the " +
                       std::to_string(ranks) + "-rank communicator");
  std::vector<Parameter<T>*> statistics;  // a null layer gives two null pointers, which the check names
  for (nn::BatchNorm2d<T>* layer : layers) {
    statistics.push_back(layer ? &layer->running_mean : nullptr);
    statistics.push_back(layer ? &layer->running_var : nullptr);
  }
  check_same_parameters(statistics, comm, "broadcast_buffers");
  const bool is_root = rank(comm) == root;
  detail::check_not_read_anywhere(statistics, is_root, comm, "broadcast_buffers");
  std::vector<T> values;
  std::vector<std::int64_t> counters;
  for (nn::BatchNorm2d<T>* layer : layers) counters.push_back(is_root ? layer->num_batches_tracked() : 0);
  if (is_root)
    for (Parameter<T>* p : statistics)
      values.insert(values.end(), p->value().data(), p->value().data() + p->value().size());
  else {
    std::size_t total = 0;
    for (Parameter<T>* p : statistics) total += static_cast<std::size_t>(p->value().size());
    values.resize(total);
  }
  detail::check(MPI_Bcast(values.data(), static_cast<int>(values.size()), detail::datatype<T>(), root, comm),
                "broadcast_buffers: MPI_Bcast");
  detail::check(MPI_Bcast(counters.data(), static_cast<int>(counters.size()), MPI_INT64_T, root, comm),
                "broadcast_buffers: MPI_Bcast");
  if (is_root) return;
  std::size_t at = 0;
  for (Parameter<T>* p : statistics) {
    T* data = p->mutable_value().data();
    std::copy(values.begin() + static_cast<std::ptrdiff_t>(at),
              values.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(p->value().size())), data);
    at += static_cast<std::size_t>(p->value().size());
  }
  for (std::size_t k = 0; k < layers.size(); ++k) layers[k]->num_batches_tracked() = counters[k];
}

}  // namespace remat::distributed
