// Device discovery for the CUDA backend: how many devices, and the facts the planner and the
// bench print (name, memory, multiprocessors, L2). Never fails when there is no driver: that
// is "zero devices". Also the measurement-only launch filter (kernels.h SkipRule).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"

namespace qvl {

namespace {
// set_cuda_test_profile's profile (0, 0: none).
CudaBackendOptions& test_profile() {
  static CudaBackendOptions o;
  return o;
}
}  // namespace

Status set_cuda_test_profile(int compute_capability, int smem_per_block) {
  CudaBackendOptions o;
  o.emulate_compute_capability = compute_capability;
  o.emulate_smem_per_block = smem_per_block;
  test_profile() = CudaBackendOptions{};
  for (int d = 0; d < cuda_device_count(); ++d) {
    QVL_ASSIGN_OR_RETURN(CudaDeviceInfo info, cuda_device_info(d));
    QVL_RETURN_IF_ERROR(apply_emulated_profile(o, info));
  }
  test_profile() = o;
  return Status::ok();
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

Result<CudaDeviceInfo> cuda_device_info(int ordinal) {
  int n = cuda_device_count();
  if (ordinal < 0 || ordinal >= n)
    return not_found("CUDA device " + std::to_string(ordinal) + " does not exist (" + std::to_string(n) +
                     " device(s) visible)");
  cudaDeviceProp prop{};
  cudaError_t err = cudaGetDeviceProperties(&prop, ordinal);
  if (err != cudaSuccess)
    return failed_precondition("CUDA device " + std::to_string(ordinal) + ": " + cudaGetErrorString(err));
  CudaDeviceInfo info;
  info.ordinal = ordinal;
  info.name = prop.name;
  info.compute_capability = prop.major * 10 + prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.max_smem_per_block = static_cast<int>(prop.sharedMemPerBlockOptin);
  info.total_memory = prop.totalGlobalMem;
  info.l2_bytes = static_cast<size_t>(prop.l2CacheSize);
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, ordinal);
  info.memory_clock_khz = clock_khz;
  cudaDeviceGetAttribute(&info.memory_bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal);
  int previous = 0;
  cudaGetDevice(&previous);
  if (cudaSetDevice(ordinal) == cudaSuccess) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) info.free_memory = free_bytes;
    cudaSetDevice(previous);
  }
  cudaGetLastError();
  QVL_RETURN_IF_ERROR(apply_emulated_profile(test_profile(), info));
  return info;
}

}  // namespace qvl

namespace qvl::cuda {

std::vector<SkipRule> parse_skip_rules(const std::string& spec) {
  std::vector<SkipRule> rules;
  for (size_t pos = 0; pos < spec.size();) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    SkipRule rule;
    const size_t at = item.find('@');
    rule.name = item.substr(0, at);
    if (at != std::string::npos) rule.grid_x = static_cast<unsigned>(std::strtoul(item.c_str() + at + 1, nullptr, 10));
    rules.push_back(rule);
  }
  return rules;
}

bool skip_launch(const std::vector<SkipRule>& rules, const char* name, unsigned grid_x) {
  for (const SkipRule& r : rules)
    if (r.name == name && (r.grid_x == 0 || r.grid_x == grid_x)) return true;
  return false;
}

}  // namespace qvl::cuda
