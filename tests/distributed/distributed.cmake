# Data-parallel training on MPI (include/remat/distributed/): tests_distributed runs under mpiexec with 2 and 3
# ranks (--oversubscribe: more ranks than cores; --allow-run-as-root: CI runs as root). Without MPI, one test
# says why it is skipped. Not a *_test.cpp: the per-directory GoogleTest glob must not pick it up, since it
# needs mpiexec and its own main().
if(NOT TARGET remat::mpi)
  add_test(NAME distributed_skipped
           COMMAND sh -c "echo 'remat::mpi not built: MPI (libopenmpi-dev, openmpi-bin) was not found; the distributed tests are skipped'; exit 77")
  set_tests_properties(distributed_skipped PROPERTIES SKIP_RETURN_CODE 77 LABELS distributed)
  return()
endif()

add_executable(tests_distributed ${CMAKE_CURRENT_LIST_DIR}/distributed_main.cpp ${CMAKE_CURRENT_LIST_DIR}/reducer_edge_cases.cpp)
# One translation unit, as the other test programs (tests/CMakeLists.txt): the library's templates compiled once.
set_target_properties(tests_distributed PROPERTIES UNITY_BUILD ${REMAT_TESTS_UNITY_BUILD} UNITY_BUILD_BATCH_SIZE 0)
target_include_directories(tests_distributed PRIVATE ${CMAKE_CURRENT_LIST_DIR}/../support)
target_link_libraries(tests_distributed PRIVATE remat_test_support remat::mpi)

set(_mpiexec ${REMAT_MPI_SESSION} ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root ${MPIEXEC_PREFLAGS})
# Under LeakSanitizer (REMAT_SANITIZE), Open MPI's own allocations that it never frees (state of its
# components and of PMIx/hwloc kept until exit) are reported as leaks: these tests only suppress leaks whose
# allocation stack passes through Open MPI's libraries (lsan.supp). Its components are dlclose()d at
# MPI_Finalize, so the default fast unwinder stops at an "<unknown module>" frame: fast_unwind_on_malloc=0
# unwinds on into libmpi / libopen-pal, where the suppressions match. remat's own leaks are still reported.
set(_mpi_env ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0
             LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_LIST_DIR}/lsan.supp)
foreach(_ranks 2 3)
  add_test(NAME distributed_np${_ranks}
           COMMAND ${_mpiexec} ${MPIEXEC_NUMPROC_FLAG} ${_ranks} $<TARGET_FILE:tests_distributed> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(distributed_np${_ranks} PROPERTIES TIMEOUT 120 LABELS distributed ENVIRONMENT "${_mpi_env}")
endforeach()

# Faults: one rank throws in its second step, or builds one parameter more; every rank must end, non-zero,
# with the failing rank's message, within the checker's timeout (a hang fails).
find_package(Python3 REQUIRED COMPONENTS Interpreter)
set(_check ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/expect_failure.py --timeout 60)
add_test(NAME distributed_rank_throws
         COMMAND ${_check} --expect "rank 1 of 3: error: data/train-1.bin: truncated" --
                 ${_mpiexec} ${MPIEXEC_NUMPROC_FLAG} 3 $<TARGET_FILE:tests_distributed> --fail-on-rank 1)
add_test(NAME distributed_mismatched_parameters
         COMMAND ${_check} --expect "broadcast_parameters: rank 0 has 6 parameters but rank 1 has 7"
                 --expect "every rank must build the same model" --
                 ${_mpiexec} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:tests_distributed> --mismatch-on-rank 1)
set_tests_properties(distributed_rank_throws distributed_mismatched_parameters
                     PROPERTIES TIMEOUT 120 LABELS distributed ENVIRONMENT "${_mpi_env}")
