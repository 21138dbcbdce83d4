# The chat-message parser and chat template's fuzz target (see chat_template_fuzz.cpp); 20 s per run.
# chat_template.cpp also builds token prompts, so the tokenizer sources link in too.
file(GLOB QVL_CHAT_FUZZ_SOURCES ${CMAKE_SOURCE_DIR}/src/tokenizer/*.cpp)
qvl_add_fuzz(chat_template 20 ${QVL_CHAT_FUZZ_SOURCES} ${QVL_CORE_SOURCES})
target_link_libraries(chat_template_fuzz PRIVATE PkgConfig::PCRE2 PkgConfig::UTF8PROC)
