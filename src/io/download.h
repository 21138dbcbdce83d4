// `qvl pull`: downloads a checkpoint from a Hugging Face Hub endpoint into the Hugging Face
// cache layout, so that a hub id then resolves through io/hub.h exactly as it would after
// `huggingface-cli download`:
//
//   <hub_dir>/models--<org>--<name>/
//     blobs/<sha256 for LFS files, git blob id otherwise>   the bytes, one file per content
//     blobs/<id>.incomplete                                 a download in progress (resumed)
//     snapshots/<commit>/<path>  ->  ../../blobs/<id>       relative symlinks
//     refs/<revision>                                       the commit, no newline
//   <hub_dir>/.locks/models--<org>--<name>/<id>.lock      flock()ed while <id> downloads
//
// Steps: the listing (GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true gives the
// commit and, per file, size, blob id and LFS sha256); the files qvl needs (config, generation
// and preprocessor configs, chat template, tokenizer, safetensors index) plus any --include
// matches; then the shards the index maps tensors to (or model.safetensors); every URL names
// the commit, so a branch that moves during the pull cannot mix two snapshots.
//
// Invariants: a file appears in snapshots/ only once its blob has the listed size (and LFS
// sha256) and was renamed into blobs/ whole; the symlink itself is renamed into place; the ref
// is written after every file, so an interrupted pull leaves the revision unresolved (or at
// its previous commit), never pointing at half a snapshot. Files already in the cache are
// reused without a download. Nothing here reads the environment or prints: the token, endpoint
// and directories come from src/cli, progress goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/download_http.h"

namespace qvl {

// One file of a repository at one commit, as the Hub lists it.
struct HubFile {
  std::string path;  // relative to the repository root ("model-00001-of-00002.safetensors")
  uint64_t size = 0;
  std::string blob_id;  // git object id
  std::string sha256;   // LFS files only ("" otherwise)
  // The name of its blob in the cache: the sha256 for LFS files, the git id otherwise.
  const std::string& blob_name() const { return sha256.empty() ? blob_id : sha256; }
};

struct HubListing {
  std::string commit;
  std::vector<HubFile> files;
  const HubFile* find(std::string_view path) const;
};

// Parses the body of GET /api/models/{repo}/revision/{rev}?blobs=true. Every field used is
// validated (hex ids, relative paths without ".." or empty parts); `url` names the source in
// messages.
Result<HubListing> parse_hub_listing(const std::string& body, const std::string& url);

// fnmatch-style match as huggingface_hub's allow_patterns: '*' matches any run of characters
// (also '/'), '?' one character, [abc] / [a-z] / [!abc] a set.
bool glob_match(std::string_view pattern, std::string_view path);

// The non-weight files qvl reads, in the order they are pulled (each only when listed).
const std::vector<std::string>& pull_metadata_files();

// The shards `index_json` (a model.safetensors.index.json) maps tensors to, sorted.
Result<std::vector<std::string>> index_shards(const std::string& index_json, const std::string& what);

// "models--org--name"
std::string hub_repo_folder(const std::string& repo_id);

struct PullProgress {
  enum class Event { kStart, kBytes, kDone, kCached };
  Event event = Event::kStart;
  std::string file;
  uint64_t file_done = 0, file_total = 0;  // bytes of this file present / listed
  uint64_t done = 0, total = 0;            // over every file selected so far
  uint64_t fetched = 0;                    // bytes received from the network in this pull
};

struct PullOptions {
  std::string endpoint = "https://huggingface.co";  // no trailing '/'
  std::string repo_id;                              // "org/name"
  std::string revision = "main";                    // branch, tag or commit
  std::string hub_dir;                              // the cache root ($HF_HOME/hub)
  std::vector<std::string> include;                 // extra files, by glob ("dir/" = all under dir/)
  HttpOptions http;
  std::function<void(const PullProgress&)> on_progress;
};

struct PullResult {
  std::string commit;
  std::string snapshot_dir;
  std::vector<std::string> files;  // placed in the snapshot, in pull order
  int files_fetched = 0, files_cached = 0;
  uint64_t bytes_fetched = 0;  // received from the network
  uint64_t bytes_total = 0;    // size of every file of the snapshot
};

// Pulls `options.repo_id` at `options.revision` into `options.hub_dir` (see the top).
// Errors name the repository, the file, the URL and the numbers: 401/403 (token, gated
// repository), 404 (repository, revision or file), the network after retries, a size or
// sha256 mismatch (the partial file is discarded), a full disk (checked before the weights
// and on every write).
Result<PullResult> pull_model(const PullOptions& options);

}  // namespace qvl
