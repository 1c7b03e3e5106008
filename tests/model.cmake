# Tests of common/model and common/sampling.
baton_add_test(NAME test_sampling SOURCES unit/test_sampling.c LIBS baton_sampling LABELS unit TIMEOUT 60)
# Tiny random GGUF models vs the NumPy reference (tests/data/tiny_*).
baton_add_test(NAME test_model_tiny SOURCES model/test_model_tiny.c LIBS baton_model LABELS unit TIMEOUT 120)
# Default model vs llama.cpp (tests/data/model_ref.bin) and batching invariance.
baton_add_test(NAME test_model_ref SOURCES model/test_model_ref.c LIBS baton_model LABELS model TIMEOUT 180 ARGS reference)
add_test(NAME test_model_batching COMMAND test_model_ref batching)
set_tests_properties(test_model_batching PROPERTIES LABELS model TIMEOUT 180
  ENVIRONMENT "BATON_SOURCE_DIR=${CMAKE_SOURCE_DIR};BATON_BINARY_DIR=${CMAKE_BINARY_DIR}")
# `baton generate` bad inputs and determinism on the tiny models, and the
# default model's chat answer.
if(TARGET baton)
  add_test(NAME test_cli_bad_input COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/model/test_cli.sh $<TARGET_FILE:baton> ${CMAKE_SOURCE_DIR} bad-input)
  set_tests_properties(test_cli_bad_input PROPERTIES LABELS unit TIMEOUT 120)
  add_test(NAME test_cli_chat COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/model/test_cli.sh $<TARGET_FILE:baton> ${CMAKE_SOURCE_DIR} chat)
  set_tests_properties(test_cli_chat PROPERTIES LABELS model TIMEOUT 120)
endif()
