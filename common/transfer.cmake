# KV data plane over UCX (common/kv_transfer.h), used by both workers.
add_library(baton_transfer STATIC kv_transfer.c)
target_include_directories(baton_transfer PRIVATE ${XXHASH_INCLUDE_DIR})
target_link_libraries(baton_transfer PUBLIC baton_util PkgConfig::UCX ${XXHASH_LIBRARY})
