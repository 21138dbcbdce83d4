// The MODEL argument every command takes (check-model, run, serve, plan, bench, ...): a local
// directory, a built-in name (tiny, tiny-untied, tiny-fp8) or a hub id, plus --revision.
// This is the CLI half of io/hub.h: it reads the environment ($HF_HOME, $XDG_CACHE_HOME,
// $HOME, QVL_TOKENIZER_DIR) and passes plain paths down.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "core/status.h"
#include "io/hub.h"

namespace qvl::cli {

struct ModelArgs {
  std::string name;
  std::string revision = "main";
};

// Adds the positional MODEL (required) and --revision to `app`.
void add_model_args(CLI::App& app, ModelArgs* args);

// $XDG_CACHE_HOME, or ~/.cache.
std::string default_cache_dir();
// The search paths for this process's environment.
ModelSearch default_model_search(const std::string& revision);
// Resolves args.name to a model directory (generating a built-in on first use).
Result<std::string> resolve_model_dir(const ModelArgs& args);

}  // namespace qvl::cli
