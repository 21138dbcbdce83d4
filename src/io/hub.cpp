#include "io/hub.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <filesystem>
#include <regex>

#include "core/log.h"
#include "core/mmap.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/gen_model.h"
#include "model/presets.h"

namespace qvl {
namespace {

namespace fs = std::filesystem;

// Bump when gen-model's output for a built-in changes, so stale caches are not reused.
constexpr const char* kBuiltinVersion = "v1";
constexpr uint64_t kBuiltinSeed = 0;

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

bool looks_complete(const fs::path& dir) {
  return path_exists(dir / kConfigFileName) &&
         (path_exists(dir / kSafetensorsIndexName) || path_exists(dir / kSingleSafetensorsName));
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

Result<ResolvedModel> resolve_builtin(const std::string& name, const ModelSearch& search) {
  if (search.cache_dir.empty()) return invalid_argument("built-in model '" + name + "': no cache directory given");
  const fs::path dir = builtin_model_dir(search.cache_dir, name);
  if (looks_complete(dir)) return ResolvedModel{dir.string(), ModelOrigin::kBuiltin};

  QVL_ASSIGN_OR_RETURN(ModelConfig config, preset_config(name));
  GenModelOptions options;
  options.seed = kBuiltinSeed;
  options.max_shard_bytes = kTinyMaxShardBytes;
  if (!search.tokenizer_dir.empty() && path_exists(fs::path(search.tokenizer_dir) / "tokenizer.json") &&
      path_exists(fs::path(search.tokenizer_dir) / "tokenizer_config.json")) {
    options.tokenizer_dir = search.tokenizer_dir;
  } else {
    log_warn("built-in model '" + name + "': no tokenizer files in '" + search.tokenizer_dir +
             "'; generating it without them");
  }
  options.chat_template_path = search.chat_template_path;
  // Generate beside the final place and rename, so a concurrent user never sees half a model.
  static std::atomic<int> counter{0};
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  log_info("generating built-in model '" + name + "' in " + dir.string());
  Status s = generate_model(config, options, tmp.string());
  if (!s.is_ok()) {
    fs::remove_all(tmp, ec);
    return s.with_context("built-in model '" + name + "'");
  }
  fs::rename(tmp, dir, ec);
  if (ec) {
    // Someone else finished first (the target exists), or the rename failed outright.
    fs::remove_all(tmp, ec);
    if (!looks_complete(dir))
      return invalid_argument("built-in model '" + name + "': cannot move the generated model to " + dir.string());
  }
  return ResolvedModel{dir.string(), ModelOrigin::kBuiltin};
}

}  // namespace

bool is_builtin_model(const std::string& name) {
  return is_tiny_preset(name);
}

std::string builtin_model_dir(const std::string& cache_dir, const std::string& name) {
  return (fs::path(cache_dir) / "qvl" / "builtin" / (name + "-" + kBuiltinVersion)).string();
}

Result<std::string> resolve_hub_snapshot(const std::string& hub_dir, const std::string& repo_id,
                                         const std::string& revision) {
  const std::string slug =
      "models--" + repo_id.substr(0, repo_id.find('/')) + "--" + repo_id.substr(repo_id.find('/') + 1);
  const fs::path repo = fs::path(hub_dir) / slug;
  const std::string how =
      "download it with `qvl pull " + repo_id + "` (or `huggingface-cli download " + repo_id + "`), or set HF_HOME to the cache that holds it";
  if (!path_exists(repo))
    return not_found("model '" + repo_id + "' not found: no local directory '" + repo_id + "' and no " + repo.string() +
                     " in the hub cache; " + how);
  if (revision.empty() || revision.find("..") != std::string::npos)
    return invalid_argument("--revision '" + revision + "' is not a branch, tag or snapshot name");
  const fs::path ref = repo / "refs" / revision;
  std::string commit = revision;
  if (path_exists(ref)) {
    QVL_ASSIGN_OR_RETURN(std::string text, read_file(ref.string()));
    commit = trim(text);
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  if (commit.empty() || !fs::is_directory(snapshot))
    return not_found("model '" + repo_id + "' revision '" + revision + "' not found: looked for " + ref.string() +
                     " and " + snapshot.string() + "; " + how);
  return snapshot.string();
}

Result<ResolvedModel> resolve_model(const std::string& name, const ModelSearch& search) {
  if (name.empty()) return invalid_argument("no model given");
  std::error_code ec;
  if (path_exists(name)) {
    if (!fs::is_directory(name, ec))
      return invalid_argument("model '" + name + "' is a file; a model is a directory (config.json + safetensors)");
    return ResolvedModel{fs::absolute(name, ec).lexically_normal().string(), ModelOrigin::kLocal};
  }
  if (is_builtin_model(name)) return resolve_builtin(name, search);
  static const std::regex kHubId("[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*");
  if (std::regex_match(name, kHubId)) {
    if (search.hub_dir.empty()) return invalid_argument("model '" + name + "': no hub cache directory given");
    QVL_ASSIGN_OR_RETURN(std::string dir, resolve_hub_snapshot(search.hub_dir, name, search.revision));
    return ResolvedModel{dir, ModelOrigin::kHub};
  }
  return not_found("model '" + name +
                   "' not found: not a local directory, not a built-in (tiny, tiny-untied, tiny-fp8) and not a hub "
                   "id (org/name)");
}

}  // namespace qvl
