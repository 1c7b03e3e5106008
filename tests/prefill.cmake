# Prefill scheduler tests on the tiny random llama model (tests/data).
baton_add_test(NAME test_prefill_sched SOURCES unit/test_prefill_sched.c
  LIBS baton_prefill_sched LABELS unit TIMEOUT 120)
# Optional proto fields the prefill worker relies on (cluster.md wiring).
baton_add_test(NAME test_proto_wiring SOURCES unit/test_proto_wiring.c
  LIBS baton_proto LABELS unit TIMEOUT 60)
# baton-prefill as a process on loopback (fake router + fake decode worker
# with a real UCX pool), tiny model.
baton_add_test(NAME test_prefill_sched_process SOURCES unit/test_prefill_sched_process.c
  LIBS baton_model baton_transfer baton_proto baton_prefix ${XXHASH_LIBRARY}
  LABELS integration TIMEOUT 120 ARGS $<TARGET_FILE:baton-prefill>)
add_dependencies(test_prefill_sched_process baton-prefill)
# The scheduler on the default model (k*B-1, k*B, k*B+1 prompts, cold/warm).
baton_add_test(NAME test_prefill_sched_model SOURCES unit/test_prefill_sched_model.c
  LIBS baton_prefill_sched LABELS model TIMEOUT 600)
