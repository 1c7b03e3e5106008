# Batch invariance of the CPU backend (kernels/cpu): a token's result is
# bit-identical alone or in any batch, at any thread count.
baton_add_test(NAME test_kernels_cpu_invariance SOURCES unit/test_kernels_cpu_invariance.c
  LIBS baton_kernels LABELS unit TIMEOUT 120)
# The same on the default model: decode logits alone vs with 7 other
# sequences (memcmp), greedy and seeded temperature-1 sampling.
baton_add_test(NAME test_model_batch_invariance SOURCES model/test_model_batch_invariance.c
  LIBS baton_model LABELS model TIMEOUT 180)
