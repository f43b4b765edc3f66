# Installs remat into a temporary prefix and builds examples/cmake-consumer against it with find_package.
add_test(NAME install_and_consume
         COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR} -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_work
                 -DCMAKE_COMMAND_PATH=${CMAKE_COMMAND}
                 -DEXPECT_SAFETENSORS=${REMAT_WITH_SAFETENSORS} -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer_test.cmake)
set_tests_properties(install_and_consume PROPERTIES TIMEOUT 300)
