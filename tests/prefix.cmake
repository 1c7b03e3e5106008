# Block hashes, the worker radix cache and the router's global radix index.
if(TARGET baton_prefix)
  baton_add_test(NAME test_block_hash SOURCES unit/test_block_hash.c
    LIBS baton_prefix LABELS unit TIMEOUT 60)
  baton_add_test(NAME test_radix_cache SOURCES unit/test_radix_cache.c
    LIBS baton_prefix LABELS unit TIMEOUT 60)
endif()
if(TARGET baton_router_index)
  baton_add_test(NAME test_radix_index SOURCES unit/test_radix_index.c
    LIBS baton_router_index LABELS unit TIMEOUT 60)
endif()
if(TARGET baton_prefix AND TARGET baton_kv)
  baton_add_test(NAME test_radix_cache_pool SOURCES unit/test_radix_cache_pool.c
    LIBS baton_prefix baton_kv LABELS unit TIMEOUT 60)
endif()
