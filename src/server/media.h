// Turns an image reference from a request into the image's bytes, under the server's media
// policy. Three sources, each opt-in beyond the first:
//   data:<mediatype>;base64,<data>   always allowed; strict base64 (RFC 4648, whitespace skipped)
//   file:///abs/path                 only with --allowed-media-dir, and only for regular files
//                                    whose real path (symlinks and .. resolved) lies inside it
//   http://, https://                only with --allow-url-fetch; libcurl with a byte cap, a total
//                                    time limit, at most 3 redirects and http/https only
// Every source is capped at max_image_bytes before anything is decoded. Errors are Status values
// (kInvalidArgument for a refused or malformed reference, kOutOfRange for a size limit,
// kNotFound for a missing file or an HTTP error) whose messages name the reference and the limit.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace qvl::server {

struct MediaPolicy {
  std::string allowed_media_dir;  // "" -> file:// refused
  bool allow_url_fetch = false;
  int64_t max_image_bytes = 20ll << 20;
  int url_timeout_ms = 10000;  // whole transfer, connection included
};

// Strict base64 decoding (standard alphabet, '=' padding optional at the very end, ASCII
// whitespace ignored). Errors name the offset of the first bad character.
Result<std::string> base64_decode(const std::string& text);

// Fetches the bytes behind `url` according to `policy`. Thread-safe.
Result<std::string> load_image_bytes(const std::string& url, const MediaPolicy& policy);

// Shortens long references (data URIs) for error messages: the first 48 characters and a count.
std::string describe_url(const std::string& url);

}  // namespace qvl::server
