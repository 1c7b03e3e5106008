# Tests of common/model and common/sampling.
baton_add_test(NAME test_sampling SOURCES unit/test_sampling.c LIBS baton_sampling LABELS unit TIMEOUT 60)
# Tiny random GGUF models vs the NumPy reference (tests/data/tiny_*).
baton_add_test(NAME test_model_tiny SOURCES model/test_model_tiny.c LIBS baton_model LABELS unit TIMEOUT 120)
# Default model vs llama.cpp (tests/data/model_ref.bin) and batching invariance.
baton_add_test(NAME test_model_ref SOURCES model/test_model_ref.c LIBS baton_model LABELS model TIMEOUT 180 ARGS reference)
add_test(NAME test_model_batching COMMAND test_model_ref batching)
set_tests_properties(test_model_batching PROPERTIES LABELS model TIMEOUT 180
  ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
