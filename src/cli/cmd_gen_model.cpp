// qvl gen-model: writes a random-weight checkpoint in the official layout (io/gen_model.h).
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "io/checkpoint.h"
#include "io/gen_model.h"
#include "model/presets.h"
#include "model/tensor_specs.h"

namespace qvl::cli {
namespace {

namespace fs = std::filesystem;

// "5000000000", "5GB", "16MiB", "512KB" -> bytes (decimal units as Hugging Face spells them).
Result<uint64_t> parse_size(const std::string& text) {
  size_t pos = 0;
  uint64_t n = 0;
  try {
    n = std::stoull(text, &pos);
  } catch (const std::exception&) {
    return invalid_argument("--max-shard-size '" + text + "': expected a byte count such as 5000000000 or 5GB");
  }
  const std::string unit = text.substr(pos);
  const std::pair<const char*, uint64_t> units[] = {{"", 1},
                                                    {"B", 1},
                                                    {"KB", 1000},
                                                    {"MB", 1000000},
                                                    {"GB", 1000000000},
                                                    {"KiB", 1ull << 10},
                                                    {"MiB", 1ull << 20},
                                                    {"GiB", 1ull << 30}};
  for (const auto& [u, mult] : units)
    if (unit == u && n > 0) return n * mult;
  return invalid_argument("--max-shard-size '" + text + "': expected a positive byte count such as 5000000000 or 5GB");
}

bool has_tokenizer(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / "tokenizer.json", ec) && fs::exists(fs::path(dir) / "tokenizer_config.json", ec);
}

struct Options {
  std::string preset;
  bool fp8 = false;
  uint64_t seed = 0;
  std::string out;
  std::string tokenizer_dir;
  std::string max_shard_size;
  int threads = 0;
};

int run(const Options& o) {
  auto config = preset_config(o.preset, o.fp8);
  if (!config.is_ok()) {
    std::fprintf(stderr, "qvl gen-model: %s\n", config.status().message().c_str());
    return 2;
  }
  GenModelOptions g;
  g.seed = o.seed;
  g.num_threads = o.threads;
  g.max_shard_bytes = is_tiny_preset(o.preset) ? kTinyMaxShardBytes : GenModelOptions{}.max_shard_bytes;
  if (!o.max_shard_size.empty()) {
    auto size = parse_size(o.max_shard_size);
    if (!size.is_ok()) {
      std::fprintf(stderr, "qvl gen-model: %s\n", size.status().message().c_str());
      return 2;
    }
    g.max_shard_bytes = *size;
  }
  if (!o.tokenizer_dir.empty()) {
    g.tokenizer_dir = o.tokenizer_dir;  // asked for explicitly: missing files are an error
  } else if (has_tokenizer(default_tokenizer_dir())) {
    g.tokenizer_dir = default_tokenizer_dir();
  } else {
    std::fprintf(stderr,
                 "qvl gen-model: warning: no tokenizer files in %s (run scripts/fetch_npm.sh); "
                 "writing the checkpoint without them\n",
                 default_tokenizer_dir().c_str());
  }
  g.chat_template_path = std::string(QVL_SOURCE_DIR) + "/assets/chat_template.json";

  const auto t0 = std::chrono::steady_clock::now();
  Status s = generate_model(*config, g, o.out);
  if (!s.is_ok()) {
    std::fprintf(stderr, "qvl gen-model: %s\n", s.message().c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  auto specs = checkpoint_tensor_specs(*config);
  for (const auto& t : specs) bytes += t.nbytes();
  std::printf("wrote %s: preset %s%s, seed %llu, %zu tensors, %llu bytes in %.1f s (%.2f GB/s)\n", o.out.c_str(),
              o.preset.c_str(), config->quant.fp8 ? " (block-FP8)" : "", static_cast<unsigned long long>(o.seed),
              specs.size(), static_cast<unsigned long long>(bytes), secs, secs > 0 ? bytes / secs / 1e9 : 0.0);
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto o = std::make_shared<Options>();
  app.add_option("--preset", o->preset, "tiny | tiny-untied | tiny-fp8 | 2b | 4b | 8b")->required();
  app.add_flag("--fp8", o->fp8, "Block-FP8 text Linears as the official -FP8 checkpoints");
  app.add_option("--seed", o->seed, "Random seed (default 0)");
  app.add_option("--out", o->out, "Output directory")->required();
  app.add_option("--tokenizer-dir", o->tokenizer_dir, "Copy tokenizer.json + tokenizer_config.json from here");
  app.add_option("--max-shard-size", o->max_shard_size, "Shard size limit in bytes (5GB; tiny presets 16MiB)");
  app.add_option("--threads", o->threads, "Worker threads (default: all cores)");
  return [o] { return run(*o); };
}

}  // namespace
}  // namespace qvl::cli

QVL_REGISTER_COMMAND("gen-model", "Write a random-weight checkpoint in the official Qwen3-VL layout", qvl::cli::setup);
