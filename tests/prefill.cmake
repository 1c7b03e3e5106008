# Prefill scheduler tests on the tiny random llama model (tests/data).
baton_add_test(NAME test_prefill_sched SOURCES unit/test_prefill_sched.c
  LIBS baton_prefill_sched LABELS unit TIMEOUT 120)
# Optional proto fields the prefill worker relies on (cluster.md wiring).
baton_add_test(NAME test_proto_wiring SOURCES unit/test_proto_wiring.c
  LIBS baton_proto LABELS unit TIMEOUT 60)
