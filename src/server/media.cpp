#include "server/media.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <mutex>

namespace qvl::server {
namespace {

bool starts_with_nocase(const std::string& s, const char* prefix) {
  size_t n = std::char_traits<char>::length(prefix);
  if (s.size() < n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

std::string human_bytes(int64_t n) {
  return std::to_string(n) + " bytes";
}

Result<std::string> load_data_uri(const std::string& url, const MediaPolicy& policy) {
  // data:[<mediatype>][;base64],<data>
  size_t comma = url.find(',');
  if (comma == std::string::npos)
    return invalid_argument("data URI " + describe_url(url) + " has no ',' before its data");
  std::string meta = url.substr(5, comma - 5);
  std::string lower;
  for (char c : meta) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const std::string suffix = ";base64";
  if (lower.size() < suffix.size() || lower.compare(lower.size() - suffix.size(), suffix.size(), suffix) != 0)
    return invalid_argument("data URI " + describe_url(url) + " must be base64-encoded (data:image/...;base64,...)");
  std::string media_type = lower.substr(0, lower.size() - suffix.size());
  if (auto semi = media_type.find(';'); semi != std::string::npos) media_type.resize(semi);
  // An empty type or application/octet-stream is tolerated: the bytes' magic decides later.
  if (!media_type.empty() && media_type.rfind("image/", 0) != 0 && media_type != "application/octet-stream")
    return invalid_argument("data URI has media type '" + media_type + "'; expected image/*");
  // base64 expands 3 bytes to 4 characters: refuse before decoding what cannot fit.
  const int64_t encoded = static_cast<int64_t>(url.size() - comma - 1);
  if (encoded / 4 * 3 > policy.max_image_bytes + 3)
    return out_of_range("image data is about " + human_bytes(encoded / 4 * 3) + "; the limit is " +
                        human_bytes(policy.max_image_bytes));
  auto decoded = base64_decode(url.substr(comma + 1));
  if (!decoded.is_ok()) return decoded.status().with_context("data URI");
  if (decoded->empty()) return invalid_argument("data URI contains no image data");
  if (static_cast<int64_t>(decoded->size()) > policy.max_image_bytes)
    return out_of_range("image data is " + human_bytes(static_cast<int64_t>(decoded->size())) + "; the limit is " +
                        human_bytes(policy.max_image_bytes));
  return decoded;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    int hi = i + 2 < s.size() ? hex_value(s[i + 1]) : -1;
    int lo = i + 2 < s.size() ? hex_value(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) return invalid_argument("bad percent-escape at offset " + std::to_string(i));
    char c = static_cast<char>(hi * 16 + lo);
    if (c == '\0') return invalid_argument("percent-escaped NUL in file path");
    out += c;
    i += 2;
  }
  return out;
}

Result<std::string> load_file_url(const std::string& url, const MediaPolicy& policy) {
  if (policy.allowed_media_dir.empty())
    return invalid_argument("file:// image URLs are disabled on this server (start it with --allowed-media-dir DIR)");
  // file:///abs/path or file://localhost/abs/path; any other host is refused.
  std::string rest = url.substr(7);
  if (starts_with_nocase(rest, "localhost/")) rest = rest.substr(9);
  if (rest.empty() || rest[0] != '/')
    return invalid_argument("file URL " + describe_url(url) + " must be file:///absolute/path");
  if (auto q = rest.find_first_of("?#"); q != std::string::npos) rest.resize(q);
  QVL_ASSIGN_OR_RETURN(std::string path, percent_decode(rest));

  char root_buf[PATH_MAX];
  if (!::realpath(policy.allowed_media_dir.c_str(), root_buf))
    return internal_error("--allowed-media-dir '" + policy.allowed_media_dir + "' cannot be resolved");
  std::string root = root_buf;
  if (root.back() != '/') root += '/';
  char real_buf[PATH_MAX];
  if (!::realpath(path.c_str(), real_buf)) {
    // Say "does not exist" only for paths that are lexically inside the directory, so the
    // answer does not reveal which files exist elsewhere.
    std::string lexical = std::filesystem::path(path).lexically_normal().string();
    if (lexical.rfind(root, 0) == 0) return not_found("image file '" + path + "' does not exist");
    return invalid_argument("image file '" + path + "' is outside the allowed media directory (--allowed-media-dir)");
  }
  std::string real = real_buf;
  if (real.rfind(root, 0) != 0)
    return invalid_argument("image file '" + path + "' is outside the allowed media directory (--allowed-media-dir)");

  // O_NOFOLLOW: the checked path held no symlink; should its last component be swapped for one
  // after the check, the open fails instead of following it out of the directory.
  int fd = ::open(real.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return not_found("image file '" + path + "' cannot be opened");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument("image file '" + path + "' is not a regular file");
  }
  if (st.st_size > policy.max_image_bytes) {
    ::close(fd);
    return out_of_range("image file '" + path + "' is " + human_bytes(st.st_size) + "; the limit is " +
                        human_bytes(policy.max_image_bytes));
  }
  std::string data(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  if (done != data.size()) return data_loss("image file '" + path + "' could not be read completely");
  return data;
}

struct FetchState {
  std::string data;
  int64_t limit = 0;
  bool over_limit = false;
};

size_t on_curl_data(char* ptr, size_t size, size_t nmemb, void* user) {
  auto* st = static_cast<FetchState*>(user);
  size_t n = size * nmemb;
  if (static_cast<int64_t>(st->data.size() + n) > st->limit) {
    st->over_limit = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  st->data.append(ptr, n);
  return n;
}

Result<std::string> load_http_url(const std::string& url, const MediaPolicy& policy) {
  if (!policy.allow_url_fetch)
    return invalid_argument("image URL " + describe_url(url) +
                            " refused: fetching http(s) image URLs is disabled on this server (start it with "
                            "--allow-url-fetch), send the image as a data: URI instead");
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURL* curl = curl_easy_init();
  if (!curl) return internal_error("libcurl could not create a handle");
  FetchState st;
  st.limit = policy.max_image_bytes;
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 3L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // worker threads: no SIGALRM-based timeouts
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(policy.url_timeout_ms));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(policy.url_timeout_ms));
  curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(policy.max_image_bytes));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_curl_data);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &st);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "qvl/0.1");
  CURLcode rc = curl_easy_perform(curl);
  long http_code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http_code);
  curl_easy_cleanup(curl);
  if (st.over_limit || rc == CURLE_FILESIZE_EXCEEDED)
    return out_of_range("image URL " + describe_url(url) + " is larger than the limit of " +
                        human_bytes(policy.max_image_bytes));
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return invalid_argument("image URL " + describe_url(url) + " timed out after " +
                            std::to_string(policy.url_timeout_ms) + " ms");
  if (rc != CURLE_OK)
    return invalid_argument("image URL " + describe_url(url) + " could not be fetched: " +
                            (errbuf[0] ? std::string(errbuf) : std::string(curl_easy_strerror(rc))));
  if (http_code < 200 || http_code >= 300)
    return not_found("image URL " + describe_url(url) + " answered HTTP " + std::to_string(http_code));
  if (st.data.empty()) return invalid_argument("image URL " + describe_url(url) + " returned no data");
  return std::move(st.data);
}

}  // namespace

Result<std::string> base64_decode(const std::string& text) {
  static const std::array<int8_t, 256> kTable = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(alphabet[i])] = static_cast<int8_t>(i);
    return t;
  }();
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0, symbols = 0;
  size_t pad_at = std::string::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      if (pad_at == std::string::npos) pad_at = i;
      continue;
    }
    if (pad_at != std::string::npos)
      return invalid_argument("invalid base64: data after '=' padding at offset " + std::to_string(i));
    int v = kTable[c];
    if (v < 0) {
      std::string shown = std::isprint(c) ? std::string("'") + static_cast<char>(c) + "'" : "byte " + std::to_string(c);
      return invalid_argument("invalid base64: " + shown + " at offset " + std::to_string(i));
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    ++symbols;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xFF);
    }
  }
  // A final group of one symbol encodes fewer than 8 bits: the text was cut.
  if (symbols % 4 == 1)
    return invalid_argument("invalid base64: " + std::to_string(symbols) + " symbols is not a valid length");
  return out;
}

std::string describe_url(const std::string& url) {
  constexpr size_t kShown = 48;
  // Appended piecewise: GCC 12 warns (-Wrestrict, a known false positive) on "'" + url + "'".
  std::string out(1, '\'');
  out.append(url, 0, kShown);
  if (url.size() <= kShown) return out.append(1, '\'');
  return out.append("...' (").append(std::to_string(url.size())).append(" characters)");
}

Result<std::string> load_image_bytes(const std::string& url, const MediaPolicy& policy) {
  if (starts_with_nocase(url, "data:")) return load_data_uri(url, policy);
  if (starts_with_nocase(url, "file://")) return load_file_url(url, policy);
  if (starts_with_nocase(url, "http://") || starts_with_nocase(url, "https://")) return load_http_url(url, policy);
  return invalid_argument("image URL " + describe_url(url) +
                          " has an unsupported scheme (expected data:, file:// or http(s)://)");
}

}  // namespace qvl::server
