// A Hugging Face Hub stand-in for the `qvl pull` tests, on 127.0.0.1 (cpp-httplib): the API
// listing (GET /api/models/{org}/{name}/revision/{rev}, as huggingface.co answers it with
// ?blobs=true) and the files (GET /{org}/{name}/resolve/{commit}/{path}, Range requests served
// by httplib). Repositories and their files are plain data the test fills in, with knobs for
// the failures to provoke: a file cut off half way the first time it is asked for, a 503 on
// the first request, a server that ignores Range, a listing that lies about a size or a sha256, a token requirement
// (401) or a gated file (403), an unknown revision (404). Every request is logged (path, Range, Authorization) so a
// test can check what was asked for.
#pragma once

#include <httplib.h>

#include <chrono>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace qvl::test {

struct FakeHubFile {
  std::string bytes;
  std::string sha256;         // "" = a git (non-LFS) file
  std::string blob_id;        // 40 hex digits
  int64_t listed_size = -1;   // -1: the real size
  std::string listed_sha256;  // "": the real one
  bool cut_first = false;     // first request without Range: send half, then drop the connection
  bool fail_first = false;    // first request: HTTP 503
  bool ignore_range = false;  // answer a Range request with 200 and the whole file (chunked)
};

// A git (non-LFS) file with blob id `id`.
inline FakeHubFile git_file(std::string bytes, std::string id) {
  FakeHubFile f;
  f.bytes = std::move(bytes);
  f.blob_id = std::move(id);
  return f;
}

struct FakeHubRepo {
  std::string commit;                        // 40 hex digits; also served under revision "main"
  std::map<std::string, FakeHubFile> files;  // by repository path
  std::string token;                         // required on every request when set (else 401)
  std::string gated_token;                   // files need this token when set (else 403 GatedRepo)
};

struct FakeHubRequest {
  std::string path;
  std::string range;  // the Range header, "" if none
  std::string authorization;
  int status = 0;
};

class FakeHub {
 public:
  FakeHub() {
    server_.Get(R"(/api/models/([^/]+)/([^/]+)/revision/([^/]+))",
                [this](const httplib::Request& req, httplib::Response& res) { listing(req, res); });
    server_.Get(R"(/([^/]+)/([^/]+)/resolve/([^/]+)/(.+))",
                [this](const httplib::Request& req, httplib::Response& res) { file(req, res); });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() before the accept loop runs would hang: wait for it.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeHub() {
    server_.stop();
    thread_.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  void add(const std::string& repo_id, FakeHubRepo repo) {
    std::lock_guard<std::mutex> lock(mu_);
    repos_[repo_id] = std::move(repo);
  }
  std::vector<FakeHubRequest> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  // The requests whose path ends with `suffix`.
  std::vector<FakeHubRequest> requests_for(const std::string& suffix) {
    std::vector<FakeHubRequest> out;
    for (auto& r : requests())
      if (r.path.size() >= suffix.size() && r.path.compare(r.path.size() - suffix.size(), suffix.size(), suffix) == 0)
        out.push_back(r);
    return out;
  }

 private:
  // Logs the request, finds the repository and checks its token; false = answered already.
  bool admit(const httplib::Request& req, httplib::Response& res, const std::string& repo_id, FakeHubRepo** repo) {
    FakeHubRequest r{req.path, req.get_header_value("Range"), req.get_header_value("Authorization"), 200};
    auto it = repos_.find(repo_id);
    if (it == repos_.end()) {
      r.status = 404;
      error(res, 404, "RepoNotFound", "Repository not found");
    } else if (!it->second.token.empty() && r.authorization != "Bearer " + it->second.token) {
      r.status = 401;
      error(res, 401, "RepoNotFound", "Invalid username or password.");
    }
    log_.push_back(r);
    *repo = it == repos_.end() ? nullptr : &it->second;
    return r.status == 200;
  }

  static void error(httplib::Response& res, int status, const std::string& code, const std::string& message) {
    res.status = status;
    res.set_header("X-Error-Code", code);
    res.set_header("X-Error-Message", message);
    res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
  }

  void listing(const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    FakeHubRepo* repo = nullptr;
    if (!admit(req, res, req.matches[1].str() + "/" + req.matches[2].str(), &repo)) return;
    const std::string rev = req.matches[3];
    if (rev != "main" && rev != repo->commit) {
      log_.back().status = 404;
      return error(res, 404, "RevisionNotFound", "Invalid rev id: " + rev);
    }
    nlohmann::json siblings = nlohmann::json::array();
    for (const auto& [path, f] : repo->files) {
      nlohmann::json s = {{"rfilename", path},
                          {"size", f.listed_size >= 0 ? static_cast<uint64_t>(f.listed_size) : f.bytes.size()},
                          {"blobId", f.blob_id}};
      if (!f.sha256.empty())
        s["lfs"] = {{"sha256", f.listed_sha256.empty() ? f.sha256 : f.listed_sha256},
                    {"size", s["size"]},
                    {"pointerSize", 134}};
      siblings.push_back(s);
    }
    res.set_content(
        nlohmann::json{
            {"id", req.matches[1].str() + "/" + req.matches[2].str()}, {"sha", repo->commit}, {"siblings", siblings}}
            .dump(),
        "application/json");
  }

  void file(const httplib::Request& req, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    FakeHubRepo* repo = nullptr;
    if (!admit(req, res, req.matches[1].str() + "/" + req.matches[2].str(), &repo)) return;
    auto it = repo->files.find(req.matches[4]);
    if (req.matches[3] != repo->commit || it == repo->files.end()) {
      log_.back().status = 404;
      return error(res, 404, "EntryNotFound", "Entry not found");
    }
    if (!repo->gated_token.empty() && log_.back().authorization != "Bearer " + repo->gated_token) {
      log_.back().status = 403;
      return error(res, 403, "GatedRepo", "Access to this model is restricted");
    }
    FakeHubFile& f = it->second;
    if (f.fail_first) {
      f.fail_first = false;
      log_.back().status = 503;
      res.status = 503;
      return;
    }
    res.set_header("ETag", "\"" + (f.sha256.empty() ? f.blob_id : f.sha256) + "\"");
    if (f.cut_first && !req.has_header("Range")) {
      f.cut_first = false;
      const std::string bytes = f.bytes;
      const size_t half = bytes.size() / 2;
      res.set_content_provider(bytes.size(), "application/octet-stream",
                               [bytes, half](size_t offset, size_t length, httplib::DataSink& sink) {
                                 if (offset >= half) return false;  // drops the connection
                                 sink.write(bytes.data() + offset, std::min(length, half - offset));
                                 return true;
                               });
      return;
    }
    if (f.ignore_range && req.has_header("Range")) {
      // httplib slices every response with a length to the requested range; a chunked one it
      // cannot, so this is a 200 with the whole file and no Content-Length.
      res.status = 200;
      const std::string bytes = f.bytes;
      res.set_chunked_content_provider("application/octet-stream", [bytes](size_t offset, httplib::DataSink& sink) {
        if (offset < bytes.size()) sink.write(bytes.data() + offset, std::min<size_t>(bytes.size() - offset, 65536));
        if (offset + 65536 >= bytes.size()) sink.done();
        return true;
      });
      return;
    }
    res.set_content(f.bytes, "application/octet-stream");
  }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::map<std::string, FakeHubRepo> repos_;
  std::vector<FakeHubRequest> log_;
};

}  // namespace qvl::test
