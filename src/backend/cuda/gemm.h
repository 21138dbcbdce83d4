// cuBLASLt for Linears over many rows (prefill chunks, the vision encoder): fp32 compute, BF16
// output, bias fused as an epilogue and a residual added through beta = 1. Two kinds:
// - BF16 operands (bf16_gemm);
// - W8A8 block-scaled FP8 (fp8_gemm; sm_90): E4M3 weights with one fp32 scale per 128x128
//   block (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: the checkpoints' weight_scale_inv as
//   stored, K-major) times E4M3 activations with one fp32 scale per row and 128 columns
//   (VEC128_32F, written by fp8_quant.cu). cuBLASLt's rules for these modes (cuBLAS docs,
//   "128-element 1D and 128x128 2D block scaling"; TransformerEngine's checks): "TN" layout,
//   fast accumulation off, D BF16, m and n multiples of 4 (8 for a 1-D-scaled operand in
//   practice), k % 16 == 0, 16-byte aligned operands and scales, and the 2-D scales' K stride a
//   multiple of 4. w8a8_linear() builds a whole Linear from these calls.
// One handle and one fixed workspace per backend (graph capture needs a fixed workspace); the
// matmul descriptors and the heuristic's algorithm are cached per shape, so a shape costs one
// heuristic query the first time and nothing after (a refusal is cached too).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "backend/backend.h"
#include "backend/cuda/kernels.h"

namespace qvl::cuda {

// One block-scaled FP8 product, in the row-major view: D[n, 0:m] (row stride ldd) =
// (xq ⊙ x_scales) · (wq ⊙ w_scales)ᵀ + bias[m] + c[n, 0:m] (row stride ldd).
struct Fp8GemmArgs {
  void* d = nullptr;                // BF16
  int64_t ldd = 0;                  // elements, for D and C
  const void* c = nullptr;          // BF16 residual, or null; may equal d
  const void* xq = nullptr;         // [n, k] E4M3, row stride k
  const float* x_scales = nullptr;  // [ceil(k/128), n]: row r, group g at g * n + r
  const void* wq = nullptr;         // [m, k] E4M3, row stride k
  const float* w_scales = nullptr;  // [ceil(m/128), ceil(k/128)], ceil(k/128) % 4 == 0
  const void* bias = nullptr;       // BF16 [m], or null
  int64_t m = 0, n = 0, k = 0;
};

class GemmRunner {
 public:
  GemmRunner(cudaStream_t stream, void* workspace, size_t workspace_bytes);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // Row-major view: D[n, 0:m] (row stride ldd elements) = X[n, k] · W[m, k]ᵀ + bias[m] +
  // residual[n, 0:m] (row stride ldd; may equal D). bias and residual may be null. All BF16.
  // gelu_tanh: cuBLASLt's GELU (tanh) epilogue on the fp32 result (+ bias), before the BF16
  // rounding (no residual then); false, having enqueued nothing, where cuBLASLt has no such
  // algorithm for the shape (asked once). Without gelu_tanh it always runs (true).
  bool bf16_gemm(void* d, int64_t ldd, const void* x, const void* w, int64_t m, int64_t n, int64_t k, const void* bias,
                 const void* residual, bool gelu_tanh = false);

  // Whether cuBLASLt has a block-scaled FP8 algorithm for this shape (bias and residual present
  // or not, pointers as given); asks the heuristic the first time only. False, not an error, for
  // a shape or architecture it refuses.
  bool fp8_supported(const Fp8GemmArgs& a);
  // Enqueues the product; fp8_supported(a) must have been true.
  void fp8_gemm(const Fp8GemmArgs& a);

 private:
  struct Plan;
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, int, bool>;  // m n k ldd bias res align gelu
  Plan& plan_for(const Key& key);
  Plan& fp8_plan_for(const Fp8GemmArgs& a);

  cudaStream_t stream_;
  void* workspace_;
  size_t workspace_bytes_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<Key, std::unique_ptr<Plan>> fp8_plans_;
};

// The W8A8 path of an FP8 Linear (cuda_backend.h): out [n, m] = x [n, K] · Wᵀ (+ bias)
// (+ residual, which may alias out), with x quantised by launch_quantize_fp8_rows into
// `workspace`. Rows run in chunks that fit the workspace; each chunk is one cuBLASLt call over
// its rows rounded down to a multiple of kFp8GemmRowMultiple, and, when rows remain, one more
// over its last kFp8GemmRowMultiple rows into the workspace (before the first call, which may
// overwrite a residual that one reads), whose last rows are then copied to out. Returns false,
// having enqueued nothing, where the path does not apply: weights not in 128x128 blocks or
// with per-row scales, K % 16 != 0, ceil(K/128) % 4 != 0, m % 8 != 0, fewer than
// kFp8GemmRowMultiple rows, unaligned tensors, a workspace too small, or any of the calls
// refused by cuBLASLt (all are asked before anything is enqueued).
bool w8a8_linear(const LaunchContext& ctx, GemmRunner& gemm, void* workspace, size_t workspace_bytes, Tensor out,
                 const Tensor& x, const LinearWeight& w, const void* bias, const void* residual);

}  // namespace qvl::cuda
