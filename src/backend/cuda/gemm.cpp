// cuBLASLt plans (see gemm.h). The column-major view cuBLASLt works in: Dᵀ [m x n] =
// op(A) · B with A = W stored k x m (ld k, op T) and B = Xᵀ stored k x n (ld k, op N): the
// "TN" layout every cuBLASLt kernel supports, and the one its FP8 modes require.
#include "backend/cuda/gemm.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace qvl::cuda {
namespace {

#define QVL_CUBLAS_CHECK(expr)                                                                                 \
  do {                                                                                                         \
    cublasStatus_t qvl_st_ = (expr);                                                                           \
    QVL_CHECK(qvl_st_ == CUBLAS_STATUS_SUCCESS)                                                                \
        << #expr << ": " << cublasLtGetStatusName(qvl_st_) << " (" << cublasLtGetStatusString(qvl_st_) << ")"; \
  } while (0)

// Largest power of two (<= 256) dividing the address: what cuBLASLt may assume.
int alignment_of(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && (v % a) != 0) a /= 2;
  return a;
}

}  // namespace

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

GemmRunner::GemmRunner(cudaStream_t stream, void* workspace, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  QVL_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

GemmRunner::Plan& GemmRunner::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [m, n, k, ldd, has_bias, has_res, align] = key;
  auto plan = std::make_unique<Plan>();
  QVL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t epi = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (has_bias) {
    const cudaDataType_t bt = CUDA_R_16BF;
    QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  QVL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, m, k));
  QVL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, n, k));
  QVL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, m, n, ldd));

  cublasLtMatmulPreference_t pref = nullptr;
  QVL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = workspace_bytes_;
  QVL_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al = static_cast<uint32_t>(align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    QVL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  QVL_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0)
      << "cuBLASLt has no BF16 algorithm for m=" << m << " n=" << n << " k=" << k << " ldd=" << ldd
      << " bias=" << has_bias << " residual=" << has_res << " align=" << align << " (" << cublasLtGetStatusName(st)
      << ")";
  plan->algo = result.algo;
  Plan& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

void GemmRunner::bf16_gemm(void* d, int64_t ldd, const void* x, const void* w, int64_t m, int64_t n, int64_t k,
                           const void* bias, const void* residual) {
  QVL_CHECK(m > 0 && n > 0 && k > 0 && ldd >= m) << "gemm m=" << m << " n=" << n << " k=" << k << " ldd=" << ldd;
  int align = std::min({alignment_of(d), alignment_of(x), alignment_of(w)});
  if (residual) align = std::min(align, alignment_of(residual));
  // Row strides also bound what every row (column, in cuBLASLt's view) starts on.
  align = std::min({align, alignment_of(reinterpret_cast<void*>(static_cast<uintptr_t>(k * 2))),
                    alignment_of(reinterpret_cast<void*>(static_cast<uintptr_t>(ldd * 2)))});
  Plan& plan = plan_for(Key{m, n, k, ldd, bias != nullptr, residual != nullptr, align});
  if (bias)
    QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
  const void* c = residual ? residual : d;
  QVL_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, c, plan.c, d, plan.c,
                                  &plan.algo, workspace_, workspace_bytes_, stream_));
}

}  // namespace qvl::cuda
