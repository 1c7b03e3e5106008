# KV transfer over UCX (common/kv_transfer.h).
baton_add_test(NAME test_kv_transfer_unit SOURCES unit/test_kv_transfer.c
  LIBS baton_transfer LABELS unit TIMEOUT 60)

# Two real processes: the test re-executes itself as the receiver. With peer
# error handling (the default), UCX 1.13 uses TCP on loopback (RMA emulated
# over active messages); "bytes-shm" runs without it so that UCX puts
# through shared memory (sysv/posix) into a UCX-allocated pool.
add_library(kv_transfer_harness STATIC integration/kv_transfer_harness.c)
target_link_libraries(kv_transfer_harness PUBLIC baton_transfer)

baton_add_test(NAME test_kv_transfer SOURCES integration/test_kv_transfer.c
  LIBS kv_transfer_harness LABELS integration TIMEOUT 120 ARGS bytes default)
foreach(variant "bytes;tcp" "bytes-shm;sm,self" "kill;tcp" "kill;default" "stall;tcp")
  list(GET variant 0 scenario)
  list(GET variant 1 tls)
  string(REGEX REPLACE "[^a-z]+" "_" tname "test_kv_transfer_${scenario}_${tls}")
  add_test(NAME ${tname} COMMAND test_kv_transfer ${scenario} ${tls})
  set_tests_properties(${tname} PROPERTIES LABELS integration TIMEOUT 120
    ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
endforeach()

# Benchmark program driven by scripts/bench-kv-transfer (not a test).
add_executable(bench_kv_transfer integration/bench_kv_transfer.c)
target_link_libraries(bench_kv_transfer PRIVATE kv_transfer_harness)

# Descriptor framing under libFuzzer (clang only).
baton_add_fuzz_test(NAME fuzz_kv_transfer_descriptor SOURCES fuzz/fuzz_kv_transfer_descriptor.c
  LIBS baton_transfer SECONDS 10)
