#include "io/download_http.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "core/check.h"
#include "core/log.h"
#include "io/download_sha256.h"

namespace qvl {
namespace {

constexpr size_t kMaxErrorBody = 64 << 10;

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::optional<uint64_t> parse_u64(const std::string& s) {
  if (s.empty() || s.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  return v;
}

// "bytes START-END/TOTAL" -> (START, TOTAL); TOTAL may be "*" (unknown).
bool parse_content_range(const std::string& v, uint64_t* start, std::optional<uint64_t>* total) {
  if (v.rfind("bytes ", 0) != 0) return false;
  const size_t dash = v.find('-', 6), slash = v.find('/', 6);
  if (dash == std::string::npos || slash == std::string::npos || dash > slash) return false;
  auto s = parse_u64(v.substr(6, dash - 6));
  if (!s) return false;
  *start = *s;
  *total = parse_u64(v.substr(slash + 1));
  return true;
}

Status write_all(int fd, const char* p, size_t n, const std::string& path, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      const std::string where = "writing " + path + " at byte " + std::to_string(offset) + ": " + std::strerror(err);
      if (err == ENOSPC || err == EDQUOT)
        return resource_exhausted(where + " (the disk is full: free space there, or pull into another --hub-dir)");
      return failed_precondition(where);
    }
    p += w, n -= static_cast<size_t>(w), offset += static_cast<uint64_t>(w);
  }
  return Status::ok();
}

// One GET, possibly tried several times; the sink is memory (fd < 0) or the end of a file.
struct Transfer {
  // Fixed for all tries.
  std::string url;
  int fd = -1;
  std::string path;
  uint64_t max_bytes = 0;  // memory sink
  uint64_t expected = kUnknownSize;
  bool hash = false;
  const std::function<void(uint64_t, uint64_t)>* on_bytes = nullptr;
  // Carried across tries: what the sink holds.
  uint64_t offset = 0;
  Sha256 hasher;
  std::string memory;
  // One try.
  CURL* curl = nullptr;
  long status = 0;
  bool began = false;
  bool to_error_body = false;
  uint64_t received = 0;
  std::map<std::string, std::string> headers;
  std::string error_body;
  Status failure;

  void start_try() {
    status = 0, began = false, to_error_body = false, received = 0;
    headers.clear(), error_body.clear(), failure = Status::ok();
    if (fd < 0) memory.clear(), offset = 0;
  }

  Status restart_file() {
    if (::ftruncate(fd, 0) != 0) return failed_precondition("truncating " + path + ": " + std::strerror(errno));
    offset = 0;
    hasher = Sha256();
    return Status::ok();
  }

  // The first body bytes of the final response: decide where they go.
  Status begin_body() {
    began = true;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    if (status < 200 || status > 299) {
      to_error_body = true;
      return Status::ok();
    }
    std::optional<uint64_t> total;
    auto cl = headers.find("content-length");
    if (status == 206 && fd >= 0) {
      uint64_t start = 0;
      auto cr = headers.find("content-range");
      if (cr == headers.end() || !parse_content_range(cr->second, &start, &total))
        return data_loss(url + ": HTTP 206 without a usable Content-Range header");
      if (start != offset)
        return data_loss(url + ": asked for bytes from " + std::to_string(offset) + ", the server sent bytes from " +
                         std::to_string(start));
    } else {
      if (fd >= 0 && offset > 0) {
        log_info(url + ": the server ignored the range request; downloading from the start");
        QVL_RETURN_IF_ERROR(restart_file());
      }
      if (cl != headers.end()) total = parse_u64(cl->second);
    }
    if (fd >= 0 && total && expected != kUnknownSize && *total != expected)
      return data_loss(url + ": the server announces " + std::to_string(*total) + " bytes, the listing says " +
                       std::to_string(expected));
    if (fd < 0 && total && *total > max_bytes)
      return out_of_range(url + ": the answer has " + std::to_string(*total) + " bytes, more than the limit of " +
                          std::to_string(max_bytes));
    return Status::ok();
  }

  size_t on_data(const char* p, size_t n) {
    if (!began) failure = begin_body();
    if (!failure.is_ok()) return 0;
    if (to_error_body) {
      error_body.append(p, std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
      return n;
    }
    if (fd < 0) {
      if (memory.size() + n > max_bytes) {
        failure =
            out_of_range(url + ": the answer is larger than the limit of " + std::to_string(max_bytes) + " bytes");
        return 0;
      }
      memory.append(p, n);
    } else {
      if (expected != kUnknownSize && offset + n > expected) {
        failure =
            data_loss(url + ": the server sent more than the " + std::to_string(expected) + " bytes the listing gives");
        return 0;
      }
      failure = write_all(fd, p, n, path, offset);
      if (!failure.is_ok()) return 0;
      if (hash) hasher.update(p, n);
    }
    offset += n, received += n;
    if (on_bytes && *on_bytes) (*on_bytes)(offset, expected);
    return n;
  }

  void on_header(const char* p, size_t n) {
    std::string line(p, n);
    if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a redirect or a 100)
      headers.clear();
      return;
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return;
    headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
};

size_t data_callback(char* p, size_t size, size_t n, void* user) {
  return static_cast<Transfer*>(user)->on_data(p, size * n);
}

size_t header_callback(char* p, size_t size, size_t n, void* user) {
  static_cast<Transfer*>(user)->on_header(p, size * n);
  return size * n;
}

bool retryable_status(long status) {
  return status == 408 || status == 429 || (status >= 500 && status <= 599);
}

// Failures a later try can fix; the rest (bad URL, TLS certificate, too many redirects) cannot.
bool retryable_curl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_HTTP3:
      return true;
    default:
      return false;
  }
}

// Runs `t` until it succeeds, fails for good or runs out of retries.
Result<HttpReply> run_transfer(const HttpOptions& o, Transfer& t) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  int failed_tries = 0;
  while (true) {
    t.start_try();
    CURL* curl = curl_easy_init();
    QVL_CHECK(curl != nullptr);
    t.curl = curl;
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_slist* request_headers = nullptr;
    if (!o.token.empty())
      request_headers = curl_slist_append(request_headers, ("Authorization: Bearer " + o.token).c_str());
    const std::string range = std::to_string(t.offset) + "-";
    curl_easy_setopt(curl, CURLOPT_URL, t.url.c_str());
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout_ms));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(o.stall_timeout_s));
    curl_easy_setopt(curl, CURLOPT_USERAGENT, o.user_agent.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, request_headers);
    if (t.fd >= 0 && t.offset > 0) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, data_callback);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, header_callback);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    const CURLcode rc = curl_easy_perform(curl);
    if (!t.began) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &t.status);
    curl_easy_cleanup(curl);
    curl_slist_free_all(request_headers);
    t.curl = nullptr;
    if (!t.failure.is_ok()) return t.failure;

    std::string problem;
    if (rc == CURLE_OK) {
      const bool ok = t.status >= 200 && t.status <= 299;
      if (ok && t.fd >= 0 && t.expected != kUnknownSize && t.offset < t.expected) {
        problem =
            "the transfer ended after " + std::to_string(t.offset) + " of " + std::to_string(t.expected) + " bytes";
      } else if (t.status == 416 && t.fd >= 0 && t.offset > 0) {
        return data_loss(t.url + ": the server has no bytes past byte " + std::to_string(t.offset) +
                         " (HTTP 416), the listing says the file has " + std::to_string(t.expected));
      } else if (ok || !retryable_status(t.status)) {
        HttpReply reply;
        reply.status = t.status;
        reply.headers = std::move(t.headers);
        reply.body = ok && t.fd < 0 ? std::move(t.memory) : std::move(t.error_body);
        reply.bytes = t.offset;
        if (ok && t.hash) reply.sha256 = t.hasher.finish_hex();
        return reply;
      } else {
        problem = "HTTP " + std::to_string(t.status);
      }
    } else if (retryable_curl(rc)) {
      problem = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    } else {
      return unavailable("GET " + t.url + ": " + (errbuf[0] ? std::string(errbuf) : curl_easy_strerror(rc)));
    }

    if (t.received > 0) failed_tries = 0;  // it moved: a flaky line, not a dead one
    if (++failed_tries > o.max_retries)
      return unavailable("GET " + t.url + ": " + problem + " (gave up after " + std::to_string(failed_tries) +
                         " tries; check the network, a proxy (HTTPS_PROXY) or --endpoint)");
    int64_t wait_ms =
        std::min<int64_t>(int64_t{o.backoff_initial_ms} << std::min(failed_tries - 1, 20), o.backoff_max_ms);
    auto ra = t.headers.find("retry-after");
    if (ra != t.headers.end())
      if (auto s = parse_u64(ra->second))
        wait_ms = std::min<int64_t>(std::max<int64_t>(wait_ms, *s * 1000), o.backoff_max_ms);
    log_warn("GET " + t.url + ": " + problem + "; try " + std::to_string(failed_tries + 1) + " of " +
             std::to_string(o.max_retries + 1) + " in " + std::to_string(wait_ms) + " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
  }
}

}  // namespace

Result<HttpReply> http_get_text(const HttpOptions& options, const std::string& url, uint64_t max_bytes) {
  Transfer t;
  t.url = url;
  t.max_bytes = max_bytes;
  return run_transfer(options, t);
}

Result<HttpReply> http_download(const HttpOptions& options, const FileTransfer& ft) {
  Transfer t;
  t.url = ft.url;
  t.path = ft.path;
  t.expected = ft.expected_size;
  t.hash = ft.hash;
  t.on_bytes = &ft.on_bytes;
  t.fd = ::open(ft.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (t.fd < 0) return failed_precondition("cannot open " + ft.path + " for writing: " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{t.fd};
  const off_t size = ::lseek(t.fd, 0, SEEK_END);
  t.offset = size > 0 ? static_cast<uint64_t>(size) : 0;
  if (t.expected != kUnknownSize && t.offset > t.expected) {
    log_warn(ft.path + " holds " + std::to_string(t.offset) + " bytes, more than the expected " +
             std::to_string(t.expected) + "; downloading it again");
    QVL_RETURN_IF_ERROR(t.restart_file());
  }
  if (t.hash && t.offset > 0) QVL_RETURN_IF_ERROR(sha256_update_from_file(t.hasher, ft.path, t.offset));
  if (t.expected != kUnknownSize && t.offset == t.expected) {
    // Complete already (an earlier pull stopped after the last byte): nothing to ask for.
    HttpReply reply;
    reply.status = 200;
    reply.bytes = t.offset;
    if (t.hash) reply.sha256 = t.hasher.finish_hex();
    return reply;
  }
  QVL_ASSIGN_OR_RETURN(HttpReply reply, run_transfer(options, t));
  // On disk before the caller renames it into the cache: a crash must not leave a named blob
  // whose blocks never arrived.
  if (reply.status >= 200 && reply.status <= 299 && ::fdatasync(t.fd) != 0)
    return failed_precondition("flushing " + ft.path + ": " + std::strerror(errno));
  return reply;
}

std::string url_quote(const std::string& s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    const bool alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (alnum || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace qvl
