# CPU backend ops against plain double-precision references.
baton_add_test(NAME test_kernels_cpu SOURCES unit/test_kernels_cpu.c
  LIBS baton_kernels m LABELS unit TIMEOUT 120)
