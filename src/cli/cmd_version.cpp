// qvl version: prints the version and which backends this binary was built with.
#include <cstdio>

#include "cli/command.h"

namespace {
[[maybe_unused]] std::function<int()> setup_version(CLI::App&) {
  return [] {
#ifdef QVL_HAVE_CUDA
    std::printf("qvl 0.1.0 (backends: cpu, cuda)\n");
#else
    std::printf("qvl 0.1.0 (backends: cpu)\n");
#endif
    return 0;
  };
}
}  // namespace

QVL_REGISTER_COMMAND("version", "Print the version and the compiled backends", setup_version);
