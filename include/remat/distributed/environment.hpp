// What remat's MPI layer shares: the MPI environment (Environment), mpi_error, ending every rank when one
// fails (abort_all, run_or_abort), and the MPI datatype of a scalar. The core headers never include MPI.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace remat::distributed {

/// An MPI call returned an error code (with an error handler that returns instead of aborting).
class mpi_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// This process's rank in `comm` (0 … size − 1). Throws mpi_error.
int rank(MPI_Comm comm = MPI_COMM_WORLD);
/// The number of ranks in `comm`. Throws mpi_error.
int size(MPI_Comm comm = MPI_COMM_WORLD);

namespace detail {

/// Throws mpi_error "<what>: <MPI's message>" unless `code` is MPI_SUCCESS.
inline void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw mpi_error(std::string(what) + ": " + std::string(text, static_cast<std::size_t>(length)));
}

/// MPI_FLOAT or MPI_DOUBLE.
template <class T>
MPI_Datatype datatype() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "remat::distributed: T must be float or double");
  return std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
}

}  // namespace detail

inline int rank(MPI_Comm comm) {
  int r = 0;
  detail::check(MPI_Comm_rank(comm, &r), "remat::distributed::rank: MPI_Comm_rank");
  return r;
}
inline int size(MPI_Comm comm) {
  int n = 0;
  detail::check(MPI_Comm_size(comm, &n), "remat::distributed::size: MPI_Comm_size");
  return n;
}

/// MPI_Init on construction (unless MPI is already initialised) and MPI_Finalize on destruction (if it
/// called MPI_Init), like boost::mpi::environment. One per process, in main(). Throws mpi_error.
class Environment {
 public:
  /// Calls MPI_Init with main()'s arguments unless MPI is already initialised. Throws mpi_error.
  Environment(int& argc, char**& argv) {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) return;
    detail::check(MPI_Init(&argc, &argv), "remat::distributed::Environment: MPI_Init");
    owner_ = true;
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  ~Environment() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (owner_ && !finalised) MPI_Finalize();
  }

 private:
  bool owner_ = false;
};

/// Ends every rank of `comm` because this one failed: prints "<program>: rank r of n: error: <message>" to
/// stderr, then MPI_Abort(comm, exit_code), which makes mpirun end the other ranks (instead of leaving them
/// waiting forever in a collective this rank will never join) and exit non-zero. Does not return.
[[noreturn]] inline void abort_all(const char* program, const std::string& message, int exit_code = 2,
                                   MPI_Comm comm = MPI_COMM_WORLD) noexcept {
  int r = -1, n = -1;
  MPI_Comm_rank(comm, &r);
  MPI_Comm_size(comm, &n);
  std::fflush(stdout);
  std::fprintf(stderr, "%s: rank %d of %d: error: %s\n", program, r, n, message.c_str());
  std::fflush(stderr);
  MPI_Abort(comm, exit_code);
  std::terminate();  // MPI_Abort does not return
}

/// Runs `f` (returning the exit code); if it throws, abort_all() with the exception's message. For main()
/// of a data-parallel program: a rank that fails (a bad data file, a mismatched model) ends all of them.
template <class F>
int run_or_abort(const char* program, F&& f, int exit_code = 2, MPI_Comm comm = MPI_COMM_WORLD) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    abort_all(program, "out of memory", exit_code, comm);
  } catch (const std::exception& e) {
    abort_all(program, e.what(), exit_code, comm);
  } catch (...) {
    abort_all(program, "unknown exception", exit_code, comm);
  }
}

}  // namespace remat::distributed
