# The router's global radix index (router/radix_index.h).
add_library(baton_router_index STATIC radix_index.c)
target_link_libraries(baton_router_index PUBLIC baton_prefix baton_util)
