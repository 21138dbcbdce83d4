// Model names -> model directories. A name is, in this order:
//   1. an existing local directory (also when it looks like "org/name" or "tiny");
//   2. a built-in name ("tiny", "tiny-untied", "tiny-fp8"): <cache_dir>/qvl/builtin/<name>-v1/,
//      generated on first use by the gen-model code (io/gen_model.h) with the tokenizer files
//      copied in; generation writes to a temporary directory and renames it into place, so
//      concurrent first uses never see a half-written model;
//   3. a hub id "org/name", looked up in the Hugging Face cache layout under hub_dir:
//      models--org--name/refs/<revision> holds a commit hash -> snapshots/<hash>/ (a revision
//      that is itself a snapshot directory name is used directly).
// Nothing here downloads; a miss says where it looked and how to fetch the model. The caller
// (src/cli) supplies hub_dir ($HF_HOME/hub or ~/.cache/huggingface/hub) and cache_dir
// ($XDG_CACHE_HOME or ~/.cache): library code never reads the environment.
#pragma once

#include <string>

#include "core/status.h"

namespace qvl {

struct ModelSearch {
  std::string hub_dir;             // the Hugging Face hub cache
  std::string revision = "main";   // branch/tag under refs/, or a snapshot hash
  std::string cache_dir;           // parent of qvl/builtin/
  std::string tokenizer_dir;       // tokenizer.json + tokenizer_config.json for built-ins ("" = none)
  std::string chat_template_path;  // chat_template.json for built-ins ("" or missing = none)
};

enum class ModelOrigin : uint8_t { kLocal, kBuiltin, kHub };

struct ResolvedModel {
  std::string dir;
  ModelOrigin origin = ModelOrigin::kLocal;
};

Result<ResolvedModel> resolve_model(const std::string& name, const ModelSearch& search);

// True for "tiny", "tiny-untied", "tiny-fp8".
bool is_builtin_model(const std::string& name);
// <cache_dir>/qvl/builtin/<name>-v1
std::string builtin_model_dir(const std::string& cache_dir, const std::string& name);
// The snapshot directory of hub id `repo_id` ("org/name") at `revision` under `hub_dir`.
Result<std::string> resolve_hub_snapshot(const std::string& hub_dir, const std::string& repo_id,
                                         const std::string& revision);

}  // namespace qvl
