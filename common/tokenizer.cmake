# Tokenizer, incremental detokenizer and chat templates. Depends only on the
# GGUF reader, status/log and PCRE2 (the router links it without the forward).
add_library(baton_tokenizer STATIC tokenizer.c chat_template.c)
target_link_libraries(baton_tokenizer PUBLIC baton_gguf baton_util PkgConfig::PCRE2)
