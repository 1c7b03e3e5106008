# CUDA backend tests (label "cuda"). They are built in every configuration
# (with CUDA they link the real backend, without it the absent one) and exit
# 77 -- reported by ctest as skipped -- when baton was built without CUDA or
# the machine has no GPU. The CPU backend is the reference.
foreach(t test_cuda_kernels test_cuda_sampling)
  baton_add_test(NAME ${t} SOURCES cuda/${t}.c LIBS baton_kernels baton_kernels_cuda m
                 LABELS cuda TIMEOUT 300)
  set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()

# Benchmark program (Llama-3-8B shapes, random bf16 weights); run by
# scripts/gpu-check, not by ctest.
if(BATON_CUDA_ENABLED)
  add_executable(bench_cuda cuda/bench_cuda.c)
  target_link_libraries(bench_cuda PRIVATE baton_kernels baton_kernels_cuda m)
endif()
