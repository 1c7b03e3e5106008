# GGUF reader and dequantization tests (common/gguf.h, common/dequant.h).
baton_add_test(NAME test_gguf_model SOURCES unit/test_gguf_model.c
  LIBS baton_gguf m LABELS unit model TIMEOUT 120)
baton_add_test(NAME test_gguf_dequant SOURCES unit/test_gguf_dequant.c
  LIBS baton_gguf m LABELS unit TIMEOUT 60)
baton_add_test(NAME test_gguf_bad SOURCES unit/test_gguf_bad.c
  LIBS baton_gguf m LABELS unit TIMEOUT 60)
baton_add_fuzz_test(NAME fuzz_gguf SOURCES fuzz/fuzz_gguf.c LIBS baton_gguf m
  CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus_gguf SECONDS 30)
