// main() of qvl_gpu_tests: exits 77 (ctest's skip code) when there is no CUDA device, runs the
// tests otherwise, and prints one summary table of every comparison (op, shape, max error,
// tolerance, pass) after the run, so one run on the GPU machine tells the whole story.
// QVL_GPU_TEST_SEED=<n> repeats a run's random inputs. QVL_GPU_TEST_PROFILE=sm_NN[:BYTES] runs
// every test as on that GPU (set_cuda_test_profile): with a build of only that architecture's PTX
// (cmake -DQVL_CUDA_ARCHS=80), an H100 / H200 runs the sm_80 device code, JIT-compiled, with the
// backend's sm_80 choices; tests of sm_90-only paths then skip themselves.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "backend/cuda/cuda_backend.h"
#include "cli/emulate_gpu.h"
#include "gpu/gpu_util.h"

namespace qvl::test::gpu {
namespace {

uint32_t g_seed = 0;
std::vector<CheckRow>& rows() {
  static std::vector<CheckRow> r;
  return r;
}
std::unique_ptr<Backend>& cuda_ptr() {
  static std::unique_ptr<Backend> b;
  return b;
}

class TablePrinter : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo& info) override {
    // Each test draws from its own stream: seed + hash of its name, so one test's inputs do not
    // depend on which tests ran before it.
    std::seed_seq seq{g_seed, static_cast<uint32_t>(
                                  std::hash<std::string>{}(std::string(info.test_suite_name()) + "." + info.name()))};
    rng().seed(seq);
  }
  void OnTestProgramEnd(const ::testing::UnitTest&) override {
    std::printf("\n== GPU op checks (seed %u): CUDA vs CPU oracle ==\n", g_seed);
    std::printf("%-34s %-40s %10s %10s %9s %17s %s\n", "op", "shape", "max|err|", "max|ref|", "rel_l2",
                "tol(l2, max/ref)", "");
    auto print = [](const CheckRow& r) {
      std::printf("%-34s %-40s %10.3g %10.3g %9.2e %8.1e,%8.1e %s\n", r.op.c_str(), r.shape.c_str(), r.max_abs,
                  r.max_ref, r.rel_l2, r.tol.rel_l2, r.tol.max_abs_rel, r.pass ? "ok" : "FAIL");
    };
    int fails = 0;
    for (const CheckRow& r : rows()) {
      print(r);
      fails += r.pass ? 0 : 1;
    }
    // Failures again at the end, where a truncated log still shows them.
    if (fails > 0) {
      std::printf("-- failed checks --\n");
      for (const CheckRow& r : rows())
        if (!r.pass) print(r);
    }
    std::printf("== %zu checks, %d failed ==\n", rows().size(), fails);
  }
};

}  // namespace

Backend& cpu() {
  static std::unique_ptr<Backend> b = make_cpu_backend(0);
  return *b;
}
Backend* cuda() {
  return cuda_ptr().get();
}
std::mt19937& rng() {
  static std::mt19937 g;
  return g;
}

void record(const CheckRow& row) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  rows().push_back(row);
}

std::string dims(std::initializer_list<int64_t> d) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (int64_t v : d) {
    os << (first ? "" : ", ") << v;
    first = false;
  }
  os << "]";
  return os.str();
}

::testing::AssertionResult compare(const std::string& op, const std::string& shape, const std::vector<float>& actual,
                                   const std::vector<float>& expected, tol::GpuTol tol) {
  CheckRow row{op, shape};
  row.tol = tol;
  if (actual.size() != expected.size()) {
    record(row);
    return ::testing::AssertionFailure() << op << " " << shape << ": " << actual.size() << " values vs "
                                         << expected.size();
  }
  double num = 0, den = 0;
  bool nan = false;
  size_t worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isnan(a) || std::isnan(e) || std::isinf(a)) nan = true;
    const double d = std::fabs(a - e);
    if (d > row.max_abs) {
      row.max_abs = d;
      worst = i;
    }
    row.max_ref = std::max(row.max_ref, std::fabs(e));
    num += d * d;
    den += e * e;
  }
  row.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  row.pass = !nan && row.rel_l2 <= tol.rel_l2 && row.max_abs <= tol.max_abs_rel * row.max_ref;
  record(row);
  if (row.pass) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << op << " " << shape << (nan ? ": NaN/Inf" : "") << ": rel_l2 " << row.rel_l2
                                       << " (tol " << tol.rel_l2 << "), max|err| " << row.max_abs << " at index "
                                       << worst << " (actual " << actual[worst] << ", expected " << expected[worst]
                                       << "; tol " << tol.max_abs_rel << " x max|ref| " << row.max_ref << ")";
}

}  // namespace qvl::test::gpu

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (qvl::cuda_device_count() == 0) {
    std::printf("qvl_gpu_tests: no CUDA device; skipping (exit 77)\n");
    return 77;
  }
  if (const char* profile = std::getenv("QVL_GPU_TEST_PROFILE"); profile != nullptr && *profile != '\0') {
    qvl::CudaBackendOptions o;
    qvl::Status s = qvl::parse_emulate_gpu(profile, o);
    if (s.is_ok()) s = qvl::set_cuda_test_profile(o.emulate_compute_capability, o.emulate_smem_per_block);
    if (!s.is_ok()) {
      std::fprintf(stderr, "qvl_gpu_tests: QVL_GPU_TEST_PROFILE: %s\n", s.to_string().c_str());
      return 1;
    }
    std::printf("qvl_gpu_tests: every test as %s\n", qvl::cuda_device_info(0).value().name.c_str());
  }
  const char* seed = std::getenv("QVL_GPU_TEST_SEED");
  qvl::test::gpu::g_seed = seed ? static_cast<uint32_t>(std::strtoul(seed, nullptr, 10)) : std::random_device{}();
  auto backend = qvl::make_cuda_backend({});
  if (!backend.is_ok()) {
    std::fprintf(stderr, "qvl_gpu_tests: %s\n", backend.status().to_string().c_str());
    return 1;
  }
  qvl::test::gpu::cuda_ptr() = std::move(backend).value();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  listeners.Append(new qvl::test::gpu::TablePrinter);
  const int rc = RUN_ALL_TESTS();
  qvl::test::gpu::cuda_ptr().reset();
  return rc;
}
