# GGUF reader and dequantization tests (common/gguf.h, common/dequant.h).
baton_add_test(NAME test_gguf_model SOURCES unit/test_gguf_model.c
  LIBS baton_gguf m LABELS unit model TIMEOUT 120)
baton_add_test(NAME test_gguf_dequant SOURCES unit/test_gguf_dequant.c
  LIBS baton_gguf m LABELS unit TIMEOUT 60)
baton_add_test(NAME test_gguf_bad SOURCES unit/test_gguf_bad.c
  LIBS baton_gguf m LABELS unit TIMEOUT 60)
