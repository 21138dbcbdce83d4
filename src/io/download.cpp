#include "io/download.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>

#include "core/log.h"
#include "core/mmap.h"
#include "io/checkpoint.h"
#include "io/config.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxListingBytes = 64ull << 20;

// nlohmann's non-throwing parse still throws out_of_range for a number beyond a double: any
// failure is a discarded value here.
nlohmann::json parse_json(const std::string& text) {
  try {
    return nlohmann::json::parse(text, nullptr, false);
  } catch (const nlohmann::json::exception&) {
    return nlohmann::json::value_t::discarded;
  }
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// A path inside the repository that cannot leave the snapshot directory.
bool safe_relative_path(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.back() == '/') return false;
  for (unsigned char c : p)
    if (c < 0x20 || c == 0x7f || c == '\\') return false;
  size_t begin = 0;
  while (begin <= p.size()) {
    size_t end = p.find('/', begin);
    if (end == std::string::npos) end = p.size();
    const std::string_view part(p.data() + begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    begin = end + 1;
  }
  return true;
}

std::string human_bytes(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull)
    std::snprintf(buf, sizeof(buf), "%.2f GB", static_cast<double>(n) / 1e9);
  else
    std::snprintf(buf, sizeof(buf), "%.1f MB", static_cast<double>(n) / 1e6);
  return buf;
}

// The size of the regular file at `p` (following symlinks), or -1.
int64_t file_size_or_minus_one(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return -1;
  const uintmax_t n = fs::file_size(p, ec);
  return ec ? -1 : static_cast<int64_t>(n);
}

// The message the Hub attached to an error answer: X-Error-Message, else {"error": "..."}.
std::string hub_error_message(const HttpReply& r) {
  auto h = r.headers.find("x-error-message");
  if (h != r.headers.end()) return h->second;
  auto j = parse_json(r.body);
  if (j.is_object() && j.contains("error") && j["error"].is_string())
    return j["error"].get<std::string>().substr(0, 200);
  return "";
}

// Explains an HTTP error answer to the user: `what` is "the file listing" or "file 'x'".
Status hub_http_error(const HttpReply& r, const std::string& url, const PullOptions& o, const std::string& what) {
  const std::string& repo = o.repo_id;
  auto c = r.headers.find("x-error-code");
  const std::string code = c == r.headers.end() ? "" : c->second;
  const std::string message = hub_error_message(r);
  const std::string base = "GET " + url + " (" + what + "): HTTP " + std::to_string(r.status) +
                           (message.empty() ? "" : " '" + message + "'");
  const std::string model_page = o.endpoint + "/" + repo;
  if (code == "GatedRepo")
    return unauthenticated(base + ": '" + repo + "' is a gated model: accept its terms at " + model_page +
                           " while logged in, then pass a token of that account (--token or HF_TOKEN)");
  if (r.status == 401)
    return unauthenticated(
        base + ": '" + repo + "' does not exist or needs a token" +
        (o.http.token.empty()
             ? "; no token was sent: pass --token or set HF_TOKEN (gated and private models need one)"
             : "; the token was refused or has no access to it (check it at " + o.endpoint + "/settings/tokens)"));
  if (r.status == 403)
    return unauthenticated(base + ": the token has no access to '" + repo +
                           "' (a gated model needs its terms accepted at " + model_page +
                           "; a fine-grained token needs read access to it)");
  if (r.status == 404) {
    if (code == "RevisionNotFound")
      return not_found(base + ": revision '" + o.revision + "' does not exist in '" + repo + "'");
    if (code == "EntryNotFound") return not_found(base + ": " + what + " is missing from '" + repo + "'");
    return not_found(base + ": repository '" + repo + "' not found (names are org/name, as on " + o.endpoint + ")");
  }
  return unavailable(base);
}

Status validate_options(const PullOptions& o) {
  static const std::regex kRepoId("[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*");
  if (!std::regex_match(o.repo_id, kRepoId))
    return invalid_argument("'" + o.repo_id + "' is not a hub model id (org/name, e.g. Qwen/Qwen3-VL-2B-Instruct)");
  if (!safe_relative_path(o.revision) || o.revision.find('%') != std::string::npos)
    return invalid_argument("--revision '" + o.revision + "' is not a branch, tag or commit name");
  if (o.endpoint.rfind("http://", 0) != 0 && o.endpoint.rfind("https://", 0) != 0)
    return invalid_argument("--endpoint '" + o.endpoint + "' is not an http:// or https:// URL");
  if (o.hub_dir.empty()) return invalid_argument("no hub cache directory given");
  return Status::ok();
}

// Writes `text` to `path` through a temporary file and a rename.
Status write_atomically(const fs::path& path, const std::string& text) {
  static std::atomic<int> counter{0};
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return failed_precondition("cannot create " + tmp.string() + ": " + std::strerror(errno));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(ok ? errno : err);
    fs::remove(tmp, ec);
    return failed_precondition("cannot write " + path.string() + ": " + why);
  }
  return Status::ok();
}

// An exclusive flock() on <hub>/.locks/<repo folder>/<blob>.lock (huggingface_hub's lock file,
// so a concurrent Python download of the same blob waits too); released on destruction.
class BlobLock {
 public:
  static Result<BlobLock> acquire(const fs::path& path, const std::string& file) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    BlobLock lock;
    lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock.fd_ < 0) return failed_precondition("cannot open lock " + path.string() + ": " + std::strerror(errno));
    if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
      log_info(file + ": another process is downloading it (" + path.string() + "); waiting");
      while (::flock(lock.fd_, LOCK_EX) != 0)
        if (errno != EINTR) return failed_precondition("cannot lock " + path.string() + ": " + std::strerror(errno));
    }
    return lock;
  }
  BlobLock(BlobLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  BlobLock& operator=(BlobLock&&) = delete;
  ~BlobLock() {
    if (fd_ >= 0) ::close(fd_);  // closing drops the flock
  }

 private:
  BlobLock() = default;
  int fd_ = -1;
};

struct Puller {
  explicit Puller(const PullOptions& options) : o(options) {}

  const PullOptions& o;
  HubListing listing;
  fs::path repo_dir, blobs_dir, snapshot_dir, locks_dir;
  PullResult result;
  uint64_t done = 0, total = 0;

  void report(PullProgress::Event event, const HubFile& f, uint64_t file_done) {
    if (!o.on_progress) return;
    PullProgress p;
    p.event = event;
    p.file = f.path;
    p.file_done = file_done;
    p.file_total = f.size;
    p.done = done + (event == PullProgress::Event::kBytes || event == PullProgress::Event::kStart ? file_done : 0);
    p.total = total;
    p.fetched = result.bytes_fetched;
    o.on_progress(p);
  }

  std::string file_url(const HubFile& f) const {
    return o.endpoint + "/" + o.repo_id + "/resolve/" + listing.commit + "/" + url_quote(f.path, true);
  }

  // Points snapshots/<commit>/<f.path> at its blob: a relative symlink, renamed into place.
  Status link(const HubFile& f) {
    const fs::path pointer = snapshot_dir / f.path;
    std::error_code ec;
    fs::create_directories(pointer.parent_path(), ec);
    std::string target;
    for (size_t i = 0, n = std::count(f.path.begin(), f.path.end(), '/') + 2; i < n; ++i) target += "../";
    target += "blobs/" + f.blob_name();
    const fs::path tmp = pointer.string() + ".tmp-" + std::to_string(::getpid());
    fs::remove(tmp, ec);
    if (::symlink(target.c_str(), tmp.c_str()) != 0 || std::rename(tmp.c_str(), pointer.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      fs::remove(tmp, ec);
      return failed_precondition("cannot link " + pointer.string() + " -> " + target + ": " + why);
    }
    return Status::ok();
  }

  // Downloads f into blobs/<id>.incomplete (resuming it), verifies it and renames it whole.
  Status fetch_blob(const HubFile& f, const fs::path& blob) {
    const fs::path incomplete = blob.string() + ".incomplete";
    const std::string url = file_url(f);
    for (int attempt = 0;; ++attempt) {
      const int64_t present = std::max<int64_t>(file_size_or_minus_one(incomplete), 0);
      FileTransfer t;
      t.url = url;
      t.path = incomplete.string();
      t.expected_size = f.size;
      t.hash = !f.sha256.empty();
      uint64_t last = static_cast<uint64_t>(present);
      t.on_bytes = [&](uint64_t now, uint64_t) {
        // A restart from zero (the server ignored the range) shows as `now` going down.
        if (now > last) result.bytes_fetched += now - last;
        last = now;
        report(PullProgress::Event::kBytes, f, now);
      };
      if (present > 0)
        log_info(f.path + ": resuming at byte " + std::to_string(present) + " of " + std::to_string(f.size));
      report(PullProgress::Event::kStart, f, static_cast<uint64_t>(present));
      auto reply = http_download(o.http, t);
      std::error_code ec;
      if (!reply.is_ok()) {
        // A wrong size or range cannot be resumed into anything right: start over next time.
        if (reply.status().code() == StatusCode::kDataLoss) fs::remove(incomplete, ec);
        return reply.status().with_context("'" + o.repo_id + "' file '" + f.path + "'");
      }
      if (reply->status < 200 || reply->status > 299) return hub_http_error(*reply, url, o, "file '" + f.path + "'");
      if (reply->bytes != f.size) {
        fs::remove(incomplete, ec);
        return data_loss("'" + o.repo_id + "' file '" + f.path + "': received " + std::to_string(reply->bytes) +
                         " bytes, the listing says " + std::to_string(f.size) + " (" + url + ")");
      }
      if (!f.sha256.empty() && reply->sha256 != f.sha256) {
        fs::remove(incomplete, ec);
        // A prefix from an earlier run may be what is wrong: one fresh try before giving up.
        if (present > 0 && attempt == 0) {
          log_warn(f.path + ": sha256 mismatch after resuming at byte " + std::to_string(present) +
                   "; downloading it again from the start");
          continue;
        }
        return data_loss("'" + o.repo_id + "' file '" + f.path + "': sha256 " + reply->sha256 +
                         " does not match the listed " + f.sha256 + " (" + url + "); the download was discarded");
      }
      if (std::rename(incomplete.c_str(), blob.c_str()) != 0)
        return failed_precondition("cannot rename " + incomplete.string() + " to " + blob.string() + ": " +
                                   std::strerror(errno));
      return Status::ok();
    }
  }

  Status place(const HubFile& f) {
    const fs::path pointer = snapshot_dir / f.path;
    if (file_size_or_minus_one(pointer) == static_cast<int64_t>(f.size)) {
      result.files_cached++;
      done += f.size;
      report(PullProgress::Event::kCached, f, f.size);
      result.files.push_back(f.path);
      return Status::ok();
    }
    const fs::path blob = blobs_dir / f.blob_name();
    QVL_ASSIGN_OR_RETURN(BlobLock lock, BlobLock::acquire(locks_dir / (f.blob_name() + ".lock"), f.path));
    const int64_t blob_size = file_size_or_minus_one(blob);
    bool cached = blob_size == static_cast<int64_t>(f.size);
    if (!cached) {
      std::error_code ec;
      if (blob_size >= 0) {
        log_warn(blob.string() + " has " + std::to_string(blob_size) + " bytes, the listing says " +
                 std::to_string(f.size) + "; downloading it again");
        fs::remove(blob, ec);
      }
      QVL_RETURN_IF_ERROR(fetch_blob(f, blob));
    }
    QVL_RETURN_IF_ERROR(link(f));
    done += f.size;
    (cached ? result.files_cached : result.files_fetched)++;
    report(cached ? PullProgress::Event::kCached : PullProgress::Event::kDone, f, f.size);
    result.files.push_back(f.path);
    return Status::ok();
  }

  // Fails before any weight is fetched when the disk cannot hold what is still missing.
  Status check_free_space(const std::vector<const HubFile*>& files) {
    uint64_t need = 0;
    for (const HubFile* f : files) {
      if (file_size_or_minus_one(snapshot_dir / f->path) == static_cast<int64_t>(f->size)) continue;
      const fs::path blob = blobs_dir / f->blob_name();
      if (file_size_or_minus_one(blob) == static_cast<int64_t>(f->size)) continue;
      const int64_t partial = file_size_or_minus_one(blob.string() + ".incomplete");
      need += f->size - std::min<uint64_t>(f->size, partial > 0 ? static_cast<uint64_t>(partial) : 0);
    }
    struct statvfs st;
    if (need == 0 || ::statvfs(blobs_dir.c_str(), &st) != 0) return Status::ok();
    const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    if (need > free_bytes)
      return resource_exhausted("not enough disk space for '" + o.repo_id + "': the files still to download need " +
                                human_bytes(need) + " (" + std::to_string(need) + " bytes), " + blobs_dir.string() +
                                " has " + human_bytes(free_bytes) + " free; free space or pull into another --hub-dir");
    return Status::ok();
  }

  Result<PullResult> run() {
    QVL_RETURN_IF_ERROR(validate_options(o));
    const std::string listing_url =
        o.endpoint + "/api/models/" + o.repo_id + "/revision/" + url_quote(o.revision, false) + "?blobs=true";
    QVL_ASSIGN_OR_RETURN(HttpReply reply, http_get_text(o.http, listing_url, kMaxListingBytes));
    if (reply.status != 200) return hub_http_error(reply, listing_url, o, "the file listing");
    QVL_ASSIGN_OR_RETURN(listing, parse_hub_listing(reply.body, listing_url));

    repo_dir = fs::path(o.hub_dir) / hub_repo_folder(o.repo_id);
    blobs_dir = repo_dir / "blobs";
    snapshot_dir = repo_dir / "snapshots" / listing.commit;
    locks_dir = fs::path(o.hub_dir) / ".locks" / hub_repo_folder(o.repo_id);
    std::error_code ec;
    fs::create_directories(blobs_dir, ec);
    fs::create_directories(snapshot_dir, ec);
    if (ec) return failed_precondition("cannot create " + snapshot_dir.string() + ": " + ec.message());
    result.commit = listing.commit;
    result.snapshot_dir = snapshot_dir.string();
    log_debug("pulling '" + o.repo_id + "' revision '" + o.revision + "' = commit " + listing.commit + " into " +
              repo_dir.string());

    const std::string at = "'" + o.repo_id + "' at commit " + listing.commit;
    if (!listing.find(kConfigFileName)) {
      std::string names;
      for (size_t i = 0; i < listing.files.size() && i < 12; ++i) names += (i ? ", " : "") + listing.files[i].path;
      return failed_precondition(at + " has no config.json: not a transformers model repository (it holds: " + names +
                                 ")");
    }
    // The small files first: the index says which shards there are.
    std::vector<const HubFile*> metadata;
    for (const std::string& name : pull_metadata_files())
      if (const HubFile* f = listing.find(name)) metadata.push_back(f);
    for (const HubFile* f : metadata) total += f->size;
    for (const HubFile* f : metadata) QVL_RETURN_IF_ERROR(place(*f));

    std::vector<std::string> shards;
    if (listing.find(kSafetensorsIndexName)) {
      QVL_ASSIGN_OR_RETURN(std::string index, read_file((snapshot_dir / kSafetensorsIndexName).string()));
      QVL_ASSIGN_OR_RETURN(shards, index_shards(index, at + " " + kSafetensorsIndexName));
    } else if (listing.find(kSingleSafetensorsName)) {
      shards.push_back(kSingleSafetensorsName);
    } else {
      return failed_precondition(at + " has neither " + kSafetensorsIndexName + " nor " + kSingleSafetensorsName +
                                 ": qvl reads safetensors checkpoints only");
    }
    std::vector<const HubFile*> rest;
    for (const std::string& s : shards) {
      const HubFile* f = listing.find(s);
      if (!f)
        return data_loss(at + ": " + kSafetensorsIndexName + " maps tensors to '" + s +
                         "', which the repository does not have");
      rest.push_back(f);
    }
    // As huggingface_hub's allow_patterns: "dir/" means everything under dir/.
    std::vector<std::string> include = o.include;
    for (std::string& g : include)
      if (!g.empty() && g.back() == '/') g += '*';
    for (const HubFile& f : listing.files) {
      const bool taken = std::find(rest.begin(), rest.end(), &f) != rest.end() ||
                         std::find(metadata.begin(), metadata.end(), &f) != metadata.end();
      if (!taken &&
          std::any_of(include.begin(), include.end(), [&](const std::string& g) { return glob_match(g, f.path); }))
        rest.push_back(&f);
    }
    for (const HubFile* f : rest) total += f->size;
    QVL_RETURN_IF_ERROR(check_free_space(rest));
    for (const HubFile* f : rest) QVL_RETURN_IF_ERROR(place(*f));
    for (const HubFile* f : metadata) result.bytes_total += f->size;
    for (const HubFile* f : rest) result.bytes_total += f->size;

    // Last: only now does the revision resolve to this snapshot.
    if (o.revision != listing.commit)
      QVL_RETURN_IF_ERROR(write_atomically(repo_dir / "refs" / o.revision, listing.commit));
    return std::move(result);
  }
};

}  // namespace

const HubFile* HubListing::find(std::string_view path) const {
  for (const HubFile& f : files)
    if (f.path == path) return &f;
  return nullptr;
}

Result<HubListing> parse_hub_listing(const std::string& body, const std::string& url) {
  auto j = parse_json(body);
  if (!j.is_object()) return data_loss(url + ": the listing is not a JSON object");
  HubListing out;
  if (!j.contains("sha") || !j["sha"].is_string()) return data_loss(url + ": the listing has no commit ('sha')");
  out.commit = j["sha"].get<std::string>();
  if (out.commit.size() < 40 || out.commit.size() > 64 || !is_hex(out.commit))
    return data_loss(url + ": the listing's commit '" + out.commit + "' is not a lowercase hex hash");
  if (!j.contains("siblings") || !j["siblings"].is_array())
    return data_loss(url + ": the listing has no file list ('siblings')");
  std::set<std::string> seen;
  for (const auto& s : j["siblings"]) {
    if (!s.is_object() || !s.contains("rfilename") || !s["rfilename"].is_string())
      return data_loss(url + ": a listing entry has no 'rfilename'");
    HubFile f;
    f.path = s["rfilename"].get<std::string>();
    const std::string where = url + ": file '" + f.path + "'";
    if (!safe_relative_path(f.path)) return data_loss(where + " is not a plain relative path");
    if (!seen.insert(f.path).second) return data_loss(where + " is listed twice");
    // Without ?blobs=true support there are no sizes or ids, and nothing to check a file by.
    if (!s.contains("size") || !s["size"].is_number_unsigned() || !s.contains("blobId") || !s["blobId"].is_string())
      return data_loss(where + " has no 'size' and 'blobId' (does the endpoint support ?blobs=true?)");
    f.size = s["size"].get<uint64_t>();
    f.blob_id = s["blobId"].get<std::string>();
    if (f.blob_id.size() < 40 || f.blob_id.size() > 64 || !is_hex(f.blob_id))
      return data_loss(where + ": blobId '" + f.blob_id + "' is not a lowercase hex hash");
    if (s.contains("lfs") && !s["lfs"].is_null()) {
      const auto& lfs = s["lfs"];
      if (!lfs.is_object() || !lfs.contains("sha256") || !lfs["sha256"].is_string())
        return data_loss(where + ": 'lfs' has no 'sha256'");
      f.sha256 = lfs["sha256"].get<std::string>();
      if (f.sha256.size() != 64 || !is_hex(f.sha256))
        return data_loss(where + ": lfs sha256 '" + f.sha256 + "' is not 64 lowercase hex digits");
      if (lfs.contains("size") && lfs["size"].is_number_unsigned() && lfs["size"].get<uint64_t>() != f.size)
        return data_loss(where + ": size " + std::to_string(f.size) + " and lfs size " +
                         std::to_string(lfs["size"].get<uint64_t>()) + " differ");
    }
    out.files.push_back(std::move(f));
  }
  return out;
}

bool glob_match(std::string_view pattern, std::string_view path) {
  size_t p = 0, s = 0, star_p = std::string_view::npos, star_s = 0;
  // One class at pattern[i] ('[' ...): whether it matches c, and where the pattern goes on.
  auto match_class = [&](size_t i, char c, size_t* next) {
    size_t j = i + 1;
    const bool negate = j < pattern.size() && pattern[j] == '!';
    if (negate) ++j;
    bool hit = false;
    for (bool first = true; j < pattern.size() && (first || pattern[j] != ']'); first = false) {
      if (j + 2 < pattern.size() && pattern[j + 1] == '-' && pattern[j + 2] != ']') {
        hit |= pattern[j] <= c && c <= pattern[j + 2];
        j += 3;
      } else {
        hit |= pattern[j] == c;
        j += 1;
      }
    }
    if (j >= pattern.size()) return std::optional<bool>();  // no ']': a literal '['
    *next = j + 1;
    return std::optional<bool>(hit != negate);
  };
  while (s < path.size()) {
    size_t next = 0;
    if (p < pattern.size() && pattern[p] == '*') {
      star_p = p++, star_s = s;
      continue;
    }
    if (p < pattern.size()) {
      if (pattern[p] == '?') {
        ++p, ++s;
        continue;
      }
      if (pattern[p] == '[') {
        if (auto m = match_class(p, path[s], &next)) {
          if (*m) {
            p = next, ++s;
            continue;
          }
        } else if (path[s] == '[') {
          ++p, ++s;
          continue;
        }
      } else if (pattern[p] == path[s]) {
        ++p, ++s;
        continue;
      }
    }
    if (star_p == std::string_view::npos) return false;
    p = star_p + 1, s = ++star_s;  // let the last '*' take one more character
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

const std::vector<std::string>& pull_metadata_files() {
  static const std::vector<std::string> kFiles = {
      kConfigFileName,       "generation_config.json", "preprocessor_config.json", "chat_template.json",
      "chat_template.jinja", "tokenizer.json",         "tokenizer_config.json",    kSafetensorsIndexName};
  return kFiles;
}

Result<std::vector<std::string>> index_shards(const std::string& index_json, const std::string& what) {
  auto j = parse_json(index_json);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return data_loss(what + ": no 'weight_map' object");
  std::set<std::string> shards;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) return data_loss(what + ": tensor '" + tensor + "' maps to a non-string");
    const std::string name = file.get<std::string>();
    if (!safe_relative_path(name)) return data_loss(what + ": tensor '" + tensor + "' maps to '" + name + "'");
    shards.insert(name);
  }
  if (shards.empty()) return data_loss(what + ": 'weight_map' is empty");
  return std::vector<std::string>(shards.begin(), shards.end());
}

std::string hub_repo_folder(const std::string& repo_id) {
  const size_t slash = repo_id.find('/');
  return "models--" + repo_id.substr(0, slash) + "--" + repo_id.substr(slash + 1);
}

Result<PullResult> pull_model(const PullOptions& options) {
  Puller puller(options);
  return puller.run();
}

}  // namespace qvl
