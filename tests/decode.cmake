# Decode scheduler (decode_worker/decode_sched.h) on the tiny random model.
baton_add_test(NAME test_decode_sched SOURCES unit/test_decode_sched.c
  LIBS baton_decode_sched LABELS unit TIMEOUT 120)
