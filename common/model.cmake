# Sampling is its own small library (decode workers and the CLI use it
# without caring about the forward).
add_library(baton_sampling STATIC sampling.c)
target_link_libraries(baton_sampling PUBLIC baton_util m)

# Model load + forward over a mixed prefill/decode batch.
if(TARGET baton_gguf AND TARGET baton_kv AND TARGET baton_kernels)
  add_library(baton_model STATIC model.c)
  target_link_libraries(baton_model PUBLIC baton_sampling baton_gguf baton_kv baton_kernels baton_util m)
endif()
