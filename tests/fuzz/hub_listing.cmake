# `qvl pull`'s parsers of remote input (see hub_listing_fuzz.cpp): the Hub listing, a
# safetensors index, glob patterns and URL quoting; 20 s per test run. download*.cpp also hold
# the transfers (libcurl), which the target never reaches.
find_package(CURL REQUIRED)
qvl_add_fuzz(hub_listing 20
             ${CMAKE_SOURCE_DIR}/src/io/download.cpp ${CMAKE_SOURCE_DIR}/src/io/download_http.cpp
             ${CMAKE_SOURCE_DIR}/src/io/download_sha256.cpp ${QVL_CORE_SOURCES})
target_link_libraries(hub_listing_fuzz PRIVATE CURL::libcurl)
