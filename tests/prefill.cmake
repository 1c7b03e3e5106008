# Prefill scheduler tests on the tiny random llama model (tests/data).
baton_add_test(NAME test_prefill_sched SOURCES unit/test_prefill_sched.c
  LIBS baton_prefill_sched LABELS unit TIMEOUT 120)
