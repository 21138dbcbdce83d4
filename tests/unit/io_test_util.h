// Helpers for the io/model tests: generated tiny checkpoints (made once per test binary) and
// in-place edits of a safetensors shard's header (drop, rename or retype a tensor) that keep
// the data region, to build broken checkpoints from a good one. Every directory made here is
// removed when the test binary exits (tiny checkpoints are 20-80 MB each).
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "io/gen_model.h"
#include "model/presets.h"
#include "support/test_support.h"

namespace qvl::test {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// test::scratch_dir, removed again at exit.
inline std::string temp_dir(const std::string& name) {
  struct Cleaner {
    std::vector<std::string> dirs;
    ~Cleaner() {
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static Cleaner cleaner;
  cleaner.dirs.push_back(scratch_dir(name));
  return cleaner.dirs.back();
}

// A checkpoint of `preset` generated with `seed` into a fresh scratch directory.
inline std::string generate_preset(const std::string& preset, uint64_t seed = 0, bool fp8 = false,
                                   uint64_t max_shard_bytes = kTinyMaxShardBytes, int threads = 0) {
  std::string dir = temp_dir("gen_" + preset);
  GenModelOptions o;
  o.seed = seed;
  o.max_shard_bytes = max_shard_bytes;
  o.num_threads = threads;
  auto config = preset_config(preset, fp8);
  if (!config.is_ok()) return "";
  Status s = generate_model(*config, o, dir);
  return s.is_ok() ? dir : "";
}

// Generated once per process (seed 0); callers copy it before breaking it.
inline const std::string& shared_preset(const std::string& preset) {
  static std::map<std::string, std::string> dirs;
  auto it = dirs.find(preset);
  if (it == dirs.end()) it = dirs.emplace(preset, generate_preset(preset)).first;
  return it->second;
}

inline std::string copy_of(const std::string& dir, const std::string& name) {
  std::string out = temp_dir(name);
  std::filesystem::copy(dir, out,
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  return out;
}

// The shard holding `tensor`, from the index.
inline std::string shard_of(const std::string& dir, const std::string& tensor) {
  auto index = nlohmann::json::parse(slurp(dir + "/model.safetensors.index.json"));
  return dir + "/" + index["weight_map"][tensor].get<std::string>();
}

// Rewrites the JSON header of a safetensors file through `edit`, keeping the data region.
inline void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& edit) {
  std::string bytes = slurp(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  edit(h);
  std::string j = h.dump();
  while ((8 + j.size()) % 8) j += ' ';
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((j.size() >> (8 * i)) & 0xff);
  spit(path, prefix + j + bytes.substr(8 + n));
}

}  // namespace qvl::test
