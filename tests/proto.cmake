# proto/ tests: codec unit test, bounded libFuzzer run, ZeroMQ + libevent
# integration test, Python (msgpack) cross-check of the C encoder.
baton_add_test(NAME test_proto_messages SOURCES unit/test_proto_messages.c
  LIBS baton_proto LABELS unit TIMEOUT 120)

# The codec's source is compiled into the fuzz target itself (not linked from
# baton_proto) so that it gets libFuzzer's coverage instrumentation.
baton_add_fuzz_test(NAME fuzz_proto
  SOURCES fuzz/fuzz_proto.c ${CMAKE_SOURCE_DIR}/proto/messages.c
  LIBS baton_util ${MSGPACK_LIBRARY} m
  CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/corpus_proto SECONDS 30)
if(TARGET fuzz_proto)
  target_include_directories(fuzz_proto PRIVATE ${MSGPACK_INCLUDE_DIR})
endif()

baton_add_test(NAME test_proto_zmq SOURCES integration/test_proto_zmq.c
  LIBS baton_proto PkgConfig::LIBEVENT LABELS integration TIMEOUT 120)

# Cross-check with Python's msgpack (.venv, scripts/requirements.txt).
add_executable(proto_emit unit/proto_emit.c)
target_link_libraries(proto_emit PRIVATE baton_proto)
set(BATON_PROTO_PY ${CMAKE_SOURCE_DIR}/.venv/bin/python)
add_test(NAME test_proto_py
  COMMAND ${BATON_PROTO_PY} ${CMAKE_CURRENT_SOURCE_DIR}/unit/test_proto_py.py $<TARGET_FILE:proto_emit>)
set_tests_properties(test_proto_py PROPERTIES LABELS unit TIMEOUT 60)
