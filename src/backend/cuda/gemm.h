// cuBLASLt for Linears over many rows (prefill chunks, the vision encoder): BF16 operands,
// fp32 compute, BF16 output, bias fused as an epilogue and a residual added through beta = 1.
// One handle and one fixed workspace per backend (graph capture needs a fixed workspace); the
// matmul descriptors and the heuristic's algorithm are cached per shape, so a shape costs one
// heuristic query the first time and nothing after.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace qvl::cuda {

class GemmRunner {
 public:
  GemmRunner(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Row-major view: D[n, 0:m] (row stride ldd elements) = X[n, k] · W[m, k]ᵀ + bias[m] +
  // residual[n, 0:m] (row stride ldd; may equal D). bias and residual may be null. All BF16.
  void bf16_gemm(void* d, int64_t ldd, const void* x, const void* w, int64_t m, int64_t n, int64_t k, const void* bias,
                 const void* residual);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int>;  // m n k ldd bias res align
  Plan& plan_for(const Key& key);

  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace qvl::cuda
