# The safetensors header parser's fuzz target (see safetensors_fuzz.cpp); 60 s per test run.
qvl_add_fuzz(safetensors 60 ${CMAKE_SOURCE_DIR}/src/io/safetensors.cpp ${QVL_CORE_SOURCES})
