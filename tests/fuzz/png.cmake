# The PNG decoder's fuzz target (see png_fuzz.cpp); 20 s per test run.
set(QVL_IMAGE_FUZZ_SOURCES
    ${CMAKE_SOURCE_DIR}/src/image/decode.cpp ${CMAKE_SOURCE_DIR}/src/image/decode_jpeg.cpp
    ${CMAKE_SOURCE_DIR}/src/image/decode_png.cpp ${CMAKE_SOURCE_DIR}/src/image/decode_webp.cpp
    ${CMAKE_SOURCE_DIR}/src/image/preprocess.cpp ${CMAKE_SOURCE_DIR}/src/image/resize.cpp
    ${CMAKE_SOURCE_DIR}/src/image/buffer.cpp)
qvl_add_fuzz(png 20 ${QVL_IMAGE_FUZZ_SOURCES} ${QVL_CORE_SOURCES})
target_link_libraries(png_fuzz PRIVATE JPEG::JPEG PNG::PNG PkgConfig::WEBP)
