# Paged KV block manager.
baton_add_test(NAME test_kv_pool SOURCES unit/test_kv_pool.c
  LIBS baton_kv LABELS unit TIMEOUT 60)
