// HTTP GETs for `qvl pull`, over libcurl: a small body into memory (the Hub's API listing) or
// a file onto disk, resumed from what an earlier try left (Range requests) and hashed as it
// arrives.
//
// Retries: a network failure (connection refused or reset, timeout, transfer cut short, no
// byte for stall_timeout_s) and HTTP 408, 429 and 5xx are retried up to max_retries times with
// exponential backoff (Retry-After honoured up to backoff_max_ms); a try that received bytes
// resets the count, so a long download on a flaky line keeps going. A file transfer resumes
// each retry at the current end of the file.
//
// Outcomes: a Status error for what no HTTP status describes (the network after the retries,
// a disk that is full or unwritable, a server that sends more bytes than expected or ignores
// the requested range); otherwise an HttpReply with the final status, so that the caller can
// explain 401/403/404 in its own terms. Redirects are followed (the Hub sends large files to a
// CDN); curl does not forward the Authorization header to another host.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/status.h"

namespace qvl {

struct HttpOptions {
  std::string token;  // sent as "Authorization: Bearer <token>" when non-empty
  std::string user_agent = "qvl/0.1.0";
  int max_retries = 5;            // further tries after the first
  int backoff_initial_ms = 1000;  // wait before the first retry, doubled for each next one
  int backoff_max_ms = 30000;
  int connect_timeout_ms = 15000;
  int stall_timeout_s = 60;  // a transfer with no byte for this long has failed
};

struct HttpReply {
  long status = 0;                             // the final response's HTTP status
  std::map<std::string, std::string> headers;  // its headers, names lowercased
  std::string body;                            // the body (for a file download: an error body only)
  uint64_t bytes = 0;                          // file download: the file's size when done
  std::string sha256;                          // file download: hex digest of the file, when asked
};

// GET `url` into memory; a body over `max_bytes` fails (out_of_range).
Result<HttpReply> http_get_text(const HttpOptions& options, const std::string& url, uint64_t max_bytes);

inline constexpr uint64_t kUnknownSize = ~uint64_t{0};

struct FileTransfer {
  std::string url;
  std::string path;                       // appended to: the transfer resumes from its current size
  uint64_t expected_size = kUnknownSize;  // a server announcing another size fails (data_loss)
  bool hash = false;                      // compute HttpReply::sha256 (over the whole file)
  // Called after each chunk written: bytes in the file now, and its expected size.
  std::function<void(uint64_t done, uint64_t total)> on_bytes;
};

// GET `t.url` onto the end of `t.path`. A 200 answer to a Range request restarts the file from
// zero. On success (HTTP 200/206) the file holds exactly the expected bytes; on an HTTP error
// status the file is left as it was and the reply carries the status.
Result<HttpReply> http_download(const HttpOptions& options, const FileTransfer& t);

// Percent-encodes `s` for a URL path: everything except A-Z a-z 0-9 - . _ ~ (and '/' when
// `keep_slash`), as Python's urllib.parse.quote does for the Hub's URLs.
std::string url_quote(const std::string& s, bool keep_slash);

}  // namespace qvl
