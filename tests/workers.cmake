# Worker integration tests (issue 4 "Show it works"): real baton-worker,
# baton-prefill and baton-decode processes on loopback with the default model
# (~/.cache/baton, scripts/fetch-model), driven by
# tests/integration/fake_router.py. One ctest test per scenario of
# tests/integration/test_workers.py; label `integration`.
set(BATON_WORKERS_PY ${CMAKE_SOURCE_DIR}/.venv/bin/python)
set(BATON_WORKERS_TEST ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_workers.py)
set(workers_scenarios colocated_generate colocated_prefix colocated_abort)
if(TARGET baton-prefill AND TARGET baton-decode)
  list(APPEND workers_scenarios disagg_generate disagg_prefix disagg_pairing disagg_abort
    disagg_kill_decode)
  if(TARGET baton-router)
    list(APPEND workers_scenarios disagg_pairing_router)
  endif()
endif()
if(TARGET baton-worker AND TARGET baton)
  foreach(s ${workers_scenarios})
    add_test(NAME test_workers_${s} COMMAND ${BATON_WORKERS_PY} ${BATON_WORKERS_TEST} ${s})
    set_tests_properties(test_workers_${s} PROPERTIES LABELS integration TIMEOUT 900
      ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
  endforeach()
endif()
