# The server's request parser (see chat_request_fuzz.cpp): JSON body -> ChatRequest, and the
# data: URI / base64 decoder that follows it; 20 s per test run.
find_package(CURL REQUIRED)  # media.cpp also holds the URL fetcher (not reached: fetching is off)
qvl_add_fuzz(chat_request 20
             ${CMAKE_SOURCE_DIR}/src/server/chat_request.cpp ${CMAKE_SOURCE_DIR}/src/server/api_error.cpp
             ${CMAKE_SOURCE_DIR}/src/server/media.cpp ${QVL_CORE_SOURCES})
target_link_libraries(chat_request_fuzz PRIVATE CURL::libcurl)
