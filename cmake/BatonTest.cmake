# baton_add_test(NAME name SOURCES a.c b.c LIBS lib1 lib2 LABELS unit [TIMEOUT s] [ARGS ...])
# Builds one test executable and registers it with ctest under the given labels
# (unit, model, integration, cuda, fuzz). The test binary gets the environment
# BATON_SOURCE_DIR and BATON_BINARY_DIR.
function(baton_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS})
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
endfunction()

# baton_add_fuzz_test(NAME name SOURCES fuzz.c LIBS ... CORPUS dir SECONDS n)
# Builds a libFuzzer target (clang only) and registers a bounded run of it as a
# ctest test labelled "fuzz;unit". Without clang nothing is built.
function(baton_add_fuzz_test)
  cmake_parse_arguments(T "" "NAME;CORPUS;SECONDS" "SOURCES;LIBS" ${ARGN})
  if(NOT BATON_FUZZ)
    return()
  endif()
  if(NOT T_SECONDS)
    set(T_SECONDS 30)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_compile_options(${T_NAME} PRIVATE -fsanitize=fuzzer)
  target_link_options(${T_NAME} PRIVATE -fsanitize=fuzzer)
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS})
  set(work ${CMAKE_BINARY_DIR}/fuzz-corpus/${T_NAME})
  add_test(NAME ${T_NAME}
    COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
      sh -c "mkdir -p '${work}' && exec '$<TARGET_FILE:${T_NAME}>' -max_total_time=${T_SECONDS} -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 '${work}' ${T_CORPUS}")
  set_tests_properties(${T_NAME} PROPERTIES LABELS "fuzz;unit" TIMEOUT ${T_SECONDS}0)
endfunction()
