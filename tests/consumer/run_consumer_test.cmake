# Script mode: configure remat alone with REMAT_USE_BLAS=${USE_BLAS}, install it to a prefix, then build and run
# the consumer, which fails unless its products reach OpenBLAS exactly when USE_BLAS is on.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}\n${out}\n${err}")
  endif()
  set(output "${out}" PARENT_SCOPE)
endfunction()
run(${CMAKE_COMMAND_PATH} -S ${SOURCE_DIR} -B ${WORK_DIR}/remat-build -DREMAT_BUILD_TESTS=OFF
    -DREMAT_BUILD_EXAMPLES=OFF -DREMAT_BUILD_BENCHMARKS=OFF -DREMAT_USE_BLAS=${USE_BLAS}
    -DCMAKE_INSTALL_PREFIX=${WORK_DIR}/prefix)
run(${CMAKE_COMMAND_PATH} --install ${WORK_DIR}/remat-build)
run(${CMAKE_COMMAND_PATH} -S ${SOURCE_DIR}/examples/cmake-consumer -B ${WORK_DIR}/consumer-build
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DREMAT_CONSUMER_EXPECT_BLAS=${USE_BLAS})
if(ALL_PROGRAMS)
  run(${CMAKE_COMMAND_PATH} --build ${WORK_DIR}/consumer-build)
else()
  run(${CMAKE_COMMAND_PATH} --build ${WORK_DIR}/consumer-build --target consumer)
endif()
run(${WORK_DIR}/consumer-build/consumer)
set(consumer_output "${output}")
# remat::safetensors: installed, found by find_package(remat) and usable, whenever nlohmann-json was found.
if(EXPECT_SAFETENSORS AND ALL_PROGRAMS)
  if(NOT EXISTS ${WORK_DIR}/consumer-build/consumer_safetensors)
    message(FATAL_ERROR "the consumer did not build consumer_safetensors against the installed remat::safetensors")
  endif()
  run(${WORK_DIR}/consumer-build/consumer_safetensors ${WORK_DIR}/consumer.safetensors)
endif()
message(STATUS "consumer built against ${WORK_DIR}/prefix (REMAT_USE_BLAS=${USE_BLAS}) and ran:\n${consumer_output}")
