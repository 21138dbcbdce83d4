#include "cli/model_args.h"

#include "cli/command.h"

namespace qvl::cli {

void add_model_args(CLI::App& app, ModelArgs* args) {
  app.add_option("model", args->name,
                 "Model directory, built-in name (tiny, tiny-untied, tiny-fp8) or hub id (Qwen/Qwen3-VL-2B-Instruct)")
      ->required();
  app.add_option("--revision", args->revision, "Hub revision: branch, tag or snapshot hash (default main)");
}

std::string default_cache_dir() {
  std::string xdg = env_or("XDG_CACHE_HOME", "");
  if (!xdg.empty()) return xdg;
  return env_or("HOME", ".") + "/.cache";
}

ModelSearch default_model_search(const std::string& revision) {
  ModelSearch s;
  s.hub_dir = default_hub_dir();
  s.revision = revision.empty() ? "main" : revision;
  s.cache_dir = default_cache_dir();
  s.tokenizer_dir = default_tokenizer_dir();
  s.chat_template_path = std::string(QVL_SOURCE_DIR) + "/assets/chat_template.json";
  return s;
}

Result<std::string> resolve_model_dir(const ModelArgs& args) {
  QVL_ASSIGN_OR_RETURN(ResolvedModel m, resolve_model(args.name, default_model_search(args.revision)));
  return m.dir;
}

}  // namespace qvl::cli
