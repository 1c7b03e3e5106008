# Tokenizer, streaming detokenizer and chat template tests (common/tokenizer.h,
# common/chat_template.h). Golden files come from tests/golden/gen_tokenizer*.py.
baton_add_test(NAME test_tokenizer SOURCES unit/test_tokenizer.c
  LIBS baton_tokenizer LABELS unit model TIMEOUT 120)
baton_add_test(NAME test_tokenizer_spm SOURCES unit/test_tokenizer_spm.c
  LIBS baton_tokenizer LABELS unit TIMEOUT 60)
baton_add_test(NAME test_chat_template SOURCES unit/test_chat_template.c
  LIBS baton_tokenizer LABELS unit model TIMEOUT 60)
# The tokenizer sources are compiled into the fuzz target itself so that
# libFuzzer's coverage instrumentation sees them.
baton_add_fuzz_test(NAME test_tokenizer_fuzz
  SOURCES unit/test_tokenizer_fuzz.c ../common/tokenizer.c ../common/chat_template.c
  LIBS baton_gguf baton_util PkgConfig::PCRE2 SECONDS 20)
if(TARGET test_tokenizer_fuzz)
  set_tests_properties(test_tokenizer_fuzz PROPERTIES
    ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()
baton_add_test(NAME test_tokenizer_llama3 SOURCES unit/test_tokenizer_llama3.c
  LIBS baton_tokenizer LABELS unit TIMEOUT 60)
