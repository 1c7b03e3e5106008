# Tests of common/model and common/sampling.
baton_add_test(NAME test_sampling SOURCES unit/test_sampling.c LIBS baton_sampling LABELS unit TIMEOUT 60)
