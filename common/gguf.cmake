# GGUF reader and ggml dequantization (common/gguf.h, common/dequant.h).
add_library(baton_gguf STATIC gguf.c dequant.c)
target_link_libraries(baton_gguf PUBLIC baton_util)
