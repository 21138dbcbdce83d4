// Subcommand registry for the qvl binary. Each command lives in its own cmd_*.cpp and
// registers itself with QVL_REGISTER_COMMAND; main() builds the CLI11 app from the registry.
// The CLI is the only layer that reads argv and the environment: it turns them into typed
// options and passes those down explicitly.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"  // QVL_CONCAT

namespace qvl::cli {

// Adds the command's options to `app` and returns the function that runs it (exit code).
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandSpec {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandSpec>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string help, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

// Environment lookups, kept here so that library code never calls getenv.
std::string env_or(const char* name, const std::string& fallback);
// $HF_HOME/hub, or ~/.cache/huggingface/hub.
std::string default_hub_dir();
// Directory holding the pinned Qwen3 tokenizer.json fetched by scripts/fetch_deps (npm).
std::string default_tokenizer_dir();

}  // namespace qvl::cli

#define QVL_REGISTER_COMMAND(name, help, setup) \
  static ::qvl::cli::CommandRegistrar QVL_CONCAT(qvl_command_, __LINE__)(name, help, setup)
