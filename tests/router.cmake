# router/ tests: unit (parsing, stream/stop strings, worker table, routing)
# and integration (real baton-router + workers on loopback, official openai
# client, curl).
if(TARGET baton_router)
  baton_add_test(NAME test_router SOURCES unit/test_router.c
    LIBS baton_router LABELS unit TIMEOUT 60)
  baton_add_test(NAME test_router_observe SOURCES unit/test_router_observe.c
    LIBS baton_router LABELS unit TIMEOUT 60)

  set(BATON_ROUTER_PY ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  # Against the fake worker pair (proto-exact, canned tokens): wiring, errors,
  # streaming shapes, cancellation, KV-event routing.
  add_test(NAME test_router_fake
    COMMAND ${BATON_ROUTER_PY} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_openai_router.py
      --build ${CMAKE_BINARY_DIR} --workers fake)
  set_tests_properties(test_router_fake PROPERTIES LABELS integration TIMEOUT 120
    ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()

# Against the real workers, as soon as their binaries are part of the build.
if(TARGET baton_router AND TARGET baton-worker AND TARGET baton)
  add_test(NAME test_router_colocated
    COMMAND ${BATON_ROUTER_PY} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_openai_router.py
      --build ${CMAKE_BINARY_DIR} --workers real --colocated --baton-cli $<TARGET_FILE:baton>)
  set_tests_properties(test_router_colocated PROPERTIES LABELS integration TIMEOUT 600
    ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()
if(TARGET baton_router AND TARGET baton-prefill AND TARGET baton-decode AND TARGET baton)
  # errors and UTF-8 are router-side and covered above; here the
  # disaggregated path: OpenAI client, greedy == baton generate,
  # cancellation on both workers, routing over two prefill workers.
  add_test(NAME test_router_disaggregated
    COMMAND ${BATON_ROUTER_PY} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_openai_router.py
      --build ${CMAKE_BINARY_DIR} --workers real --skip errors,utf8
      --baton-cli $<TARGET_FILE:baton>)
  set_tests_properties(test_router_disaggregated PROPERTIES LABELS integration TIMEOUT 600
    ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
endif()

# scripts/baton-up itself: bring-up, the printed curl, Ctrl-C leaves no orphans.
if(TARGET baton-router AND TARGET baton-worker)
  add_test(NAME test_router_baton_up
    COMMAND ${BATON_ROUTER_PY} ${CMAKE_CURRENT_SOURCE_DIR}/integration/test_router_baton_up.py
      --build ${CMAKE_BINARY_DIR} --colocated)
  set_tests_properties(test_router_baton_up PROPERTIES LABELS integration TIMEOUT 240)
endif()
