# Tests of common/model and common/sampling.
baton_add_test(NAME test_sampling SOURCES unit/test_sampling.c LIBS baton_sampling LABELS unit TIMEOUT 60)
# Tiny random GGUF models vs the NumPy reference (tests/data/tiny_*).
baton_add_test(NAME test_model_tiny SOURCES model/test_model_tiny.c LIBS baton_model LABELS unit TIMEOUT 120)
