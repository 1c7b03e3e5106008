# Sampling is its own small library (decode workers and the CLI use it
# without caring about the forward).
add_library(baton_sampling STATIC sampling.c)
target_link_libraries(baton_sampling PUBLIC baton_util m)

# Model load + forward over a mixed prefill/decode batch. The forward takes
# KV pools and block tables as plain views (model_kv_t), so it needs the
# GGUF reader and the backend; the block manager (baton_kv) is the caller's.
add_library(baton_model STATIC model.c)
target_link_libraries(baton_model PUBLIC baton_sampling baton_gguf baton_kernels baton_util m)
