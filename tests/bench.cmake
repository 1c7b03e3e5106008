# baton bench (scripts/baton-bench, scripts/bench_serving/): unit tests of
# the trace loader, metric arithmetic, client and report (Python, .venv), and
# the 50-request end-to-end run against a real cluster (integration).
set(BATON_BENCH_PY ${CMAKE_SOURCE_DIR}/.venv/bin/python)
foreach(t test_bench_trace test_bench_metrics test_bench_report)
  add_test(NAME ${t} COMMAND ${BATON_BENCH_PY} ${CMAKE_CURRENT_SOURCE_DIR}/unit/${t}.py)
  set_tests_properties(${t} PROPERTIES LABELS unit TIMEOUT 60
    ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
endforeach()
add_test(NAME test_bench_e2e
  COMMAND ${BATON_BENCH_PY} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_bench_e2e.py)
set_tests_properties(test_bench_e2e PROPERTIES LABELS integration TIMEOUT 600
  ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
