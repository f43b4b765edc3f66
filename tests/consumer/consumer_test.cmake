# Installs remat into a temporary prefix and builds examples/cmake-consumer against it with find_package; the
# consumer fails unless its products reach OpenBLAS exactly when remat was installed with REMAT_USE_BLAS.
# Twice when this build uses OpenBLAS: as configured, and without it (REMAT_USE_BLAS=OFF, Eigen's own GEMM),
# so that the package without OpenBLAS stays tested too; the second builds only the consumer whose products
# that changes (consumer_safetensors and consumer_mpi are the same programs either way).
set(REMAT_CONSUMER_TEST_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/run_consumer_test.cmake)
function(remat_consumer_test name use_blas all_programs)
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/${name}_work
                   -DCMAKE_COMMAND_PATH=${CMAKE_COMMAND} -DUSE_BLAS=${use_blas}
                   -DEXPECT_SAFETENSORS=${REMAT_WITH_SAFETENSORS} -DALL_PROGRAMS=${all_programs}
                   -P ${REMAT_CONSUMER_TEST_SCRIPT})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300)
endfunction()
if(REMAT_USE_BLAS)
  remat_consumer_test(install_and_consume ON ON)
  remat_consumer_test(install_and_consume_without_blas OFF OFF)
else()
  remat_consumer_test(install_and_consume OFF ON)
endif()
