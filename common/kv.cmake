# Paged KV block manager (common/kv_pool.h).
add_library(baton_kv STATIC kv_pool.c)
target_link_libraries(baton_kv PUBLIC baton_kernels baton_util Threads::Threads)
