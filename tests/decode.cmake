# Decode scheduler (decode_worker/decode_sched.h) on the tiny random model.
baton_add_test(NAME test_decode_sched SOURCES unit/test_decode_sched.c
  LIBS baton_decode_sched LABELS unit TIMEOUT 120)
# The same scenarios (those independent of the tiny model's sizes) on the
# default model.
add_test(NAME test_decode_sched_model COMMAND test_decode_sched model)
set_tests_properties(test_decode_sched_model PROPERTIES LABELS model TIMEOUT 600
  ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
# baton-decode as a real process; the test plays the router and the prefill
# worker (ZeroMQ + real UCX puts from its own pool).
baton_add_test(NAME test_decode_sched_proc SOURCES unit/test_decode_sched_proc.c
  LIBS baton_proto baton_transfer baton_model baton_kv ${XXHASH_LIBRARY} LABELS integration TIMEOUT 120)
add_dependencies(test_decode_sched_proc baton-decode)
