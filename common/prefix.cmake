# Block hashes and the worker's radix prefix cache (common/block_hash.h,
# common/radix_cache.h). No dependency on the KV pool: the cache takes the
# pool's ref/unref/refcount as function pointers.
add_library(baton_prefix STATIC block_hash.c radix_cache.c)
target_include_directories(baton_prefix PUBLIC ${XXHASH_INCLUDE_DIR})
target_link_libraries(baton_prefix PUBLIC baton_util ${XXHASH_LIBRARY})
