# The fuzz corpora as ordinary tests: each fuzz target's harness linked with
# replay.c (no libFuzzer) and the normal static library, run over its
# checked-in corpus. Included from tests/CMakeLists.txt, so it runs under
# the sanitize build too.
foreach(name header index)
  set(target replay_${name})
  add_executable(${target} ${CMAKE_CURRENT_LIST_DIR}/replay.c
    ${CMAKE_CURRENT_LIST_DIR}/fuzz_${name}.c)
  target_compile_options(${target} PRIVATE ${FST_WARNINGS})
  target_link_libraries(${target} PRIVATE fst_static)
  add_test(NAME fuzz.replay_${name}
    COMMAND ${target} ${CMAKE_CURRENT_LIST_DIR}/corpus/${name})
  set_tests_properties(fuzz.replay_${name} PROPERTIES LABELS fuzz TIMEOUT 300
    ENVIRONMENT "TMPDIR=${CMAKE_BINARY_DIR}/test-tmp")
endforeach()
