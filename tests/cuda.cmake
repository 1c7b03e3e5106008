# CUDA backend tests (label "cuda"). They are built in every configuration
# (with CUDA they link the real backend, without it the absent one) and exit
# 77 -- reported by ctest as skipped -- when baton was built without CUDA or
# the machine has no GPU. The CPU backend is the reference.
foreach(t test_cuda_kernels test_cuda_sampling)
  baton_add_test(NAME ${t} SOURCES cuda/${t}.c LIBS baton_kernels baton_kernels_cuda m
                 LABELS cuda TIMEOUT 300)
  set_tests_properties(${t} PROPERTIES SKIP_RETURN_CODE 77)
endforeach()

# Whole forward (default model + random Llama-3-8B-shape model) vs the CPU
# backend, and greedy generation of the default model.
if(TARGET baton_model AND TARGET baton_tokenizer)
  baton_add_test(NAME test_cuda_forward SOURCES cuda/test_cuda_forward.c
                 LIBS baton_model baton_tokenizer baton_gguf baton_kernels baton_kernels_cuda m
                 LABELS cuda TIMEOUT 400)
  set_tests_properties(test_cuda_forward PROPERTIES SKIP_RETURN_CODE 77)
endif()

# Benchmark program (Llama-3-8B shapes, random bf16 weights); run by
# scripts/gpu-check, not by ctest.
if(BATON_CUDA_ENABLED)
  add_executable(bench_cuda cuda/bench_cuda.c)
  target_link_libraries(bench_cuda PRIVATE baton_kernels baton_kernels_cuda m)
endif()
