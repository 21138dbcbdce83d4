// cuBLASLt plans (see gemm.h). The column-major view cuBLASLt works in: Dᵀ [m x n] =
// op(A) · B with A = W stored k x m (ld k, op T) and B = Xᵀ stored k x n (ld k, op N): the
// "TN" layout every cuBLASLt kernel supports, and the one its FP8 modes require.
#include "backend/cuda/gemm.h"

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/check.h"
#include "core/log.h"

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
  bool supported = true;  // FP8 and GELU plans: the heuristic found an algorithm
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
  fp8_plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

GemmRunner::Plan& GemmRunner::plan_for(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  const auto [m, n, k, ldd, has_bias, has_res, align, gelu] = key;
  auto plan = std::make_unique<Plan>();
  QVL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t epi = gelu ? (has_bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU)
                                      : (has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
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
  if (gelu && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {  // the caller applies GELU itself
    plan->supported = false;
    Plan& ref = *plan;
    plans_.emplace(key, std::move(plan));
    return ref;
  }
  QVL_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0)
      << "cuBLASLt has no BF16 algorithm for m=" << m << " n=" << n << " k=" << k << " ldd=" << ldd
      << " bias=" << has_bias << " residual=" << has_res << " align=" << align << " (" << cublasLtGetStatusName(st)
      << ")";
  plan->algo = result.algo;
  Plan& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

bool GemmRunner::bf16_gemm(void* d, int64_t ldd, const void* x, const void* w, int64_t m, int64_t n, int64_t k,
                           const void* bias, const void* residual, bool gelu_tanh) {
  QVL_CHECK(!gelu_tanh || !residual) << "gemm: the GELU epilogue comes before a residual";
  QVL_CHECK(m > 0 && n > 0 && k > 0 && ldd >= m) << "gemm m=" << m << " n=" << n << " k=" << k << " ldd=" << ldd;
  int align = std::min({alignment_of(d), alignment_of(x), alignment_of(w)});
  if (residual) align = std::min(align, alignment_of(residual));
  // Row strides also bound what every row (column, in cuBLASLt's view) starts on.
  align = std::min({align, alignment_of(reinterpret_cast<void*>(static_cast<uintptr_t>(k * 2))),
                    alignment_of(reinterpret_cast<void*>(static_cast<uintptr_t>(ldd * 2)))});
  Plan& plan = plan_for(Key{m, n, k, ldd, bias != nullptr, residual != nullptr, align, gelu_tanh});
  if (!plan.supported) return false;
  if (bias)
    QVL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
  const void* c = residual ? residual : d;
  QVL_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, c, plan.c, d, plan.c,
                                  &plan.algo, workspace_, workspace_bytes_, stream_));
  return true;
}

// ---- block-scaled FP8 ----

GemmRunner::Plan& GemmRunner::fp8_plan_for(const Fp8GemmArgs& a) {
  const Key key{a.m, a.n, a.k, a.ldd, a.bias != nullptr, a.c != nullptr, 16, false};
  auto it = fp8_plans_.find(key);
  if (it != fp8_plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();
  // Any refusal on the way (an attribute this cuBLASLt does not know, no algorithm) makes the
  // shape unsupported: the caller then takes the dequantised path.
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t size) {
    if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulDescSetAttribute(plan->desc, attr, v, size);
  };
  QVL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  // Block scaling requires the split (fp32-promoted) accumulator; say so rather than rely on
  // the default.
  const int8_t fast_accum = 0;
  set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof(fast_accum));
  // cuBLASLt's A is the weight (k x m, transposed), B the activations (k x n).
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode));
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.w_scales, sizeof(a.w_scales));
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.x_scales, sizeof(a.x_scales));
  const cublasLtEpilogue_t epi = a.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  set(CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
  if (a.bias) {
    const cudaDataType_t bt = CUDA_R_16BF;
    set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt));
    set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a.bias, sizeof(a.bias));
  }
  QVL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, a.k, a.m, a.k));
  QVL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, a.k, a.n, a.k));
  QVL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, a.m, a.n, a.ldd));
  int found = 0;
  cublasLtMatmulHeuristicResult_t result{};
  if (st == CUBLAS_STATUS_SUCCESS) {
    cublasLtMatmulPreference_t pref = nullptr;
    QVL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    QVL_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t al = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      QVL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result,
                                        &found);
    cublasLtMatmulPreferenceDestroy(pref);
  }
  plan->supported = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (plan->supported) {
    plan->algo = result.algo;
  } else {
    log_info("cuBLASLt has no block-scaled FP8 algorithm for m=" + std::to_string(a.m) + " n=" + std::to_string(a.n) +
             " k=" + std::to_string(a.k) + (a.bias ? " +bias" : "") + (a.c ? " +residual" : "") + " (" +
             cublasLtGetStatusName(st) + "): FP8 Linears of this shape dequantise their weights instead");
  }
  Plan& ref = *plan;
  fp8_plans_.emplace(key, std::move(plan));
  return ref;
}

bool GemmRunner::fp8_supported(const Fp8GemmArgs& a) {
  QVL_CHECK(a.m > 0 && a.n > 0 && a.k > 0 && a.ldd >= a.m)
      << "fp8 gemm m=" << a.m << " n=" << a.n << " k=" << a.k << " ldd=" << a.ldd;
  return fp8_plan_for(a).supported;
}

void GemmRunner::fp8_gemm(const Fp8GemmArgs& a) {
  Plan& plan = fp8_plan_for(a);
  QVL_CHECK(plan.supported) << "fp8_gemm: cuBLASLt refused m=" << a.m << " n=" << a.n << " k=" << a.k;
  QVL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a.w_scales, sizeof(a.w_scales)));
  QVL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a.x_scales, sizeof(a.x_scales)));
  if (a.bias)
    QVL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a.bias, sizeof(a.bias)));
  const float alpha = 1.0f, beta = a.c ? 1.0f : 0.0f;
  const void* c = a.c ? a.c : a.d;
  QVL_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, a.wq, plan.a, a.xq, plan.b, &beta, c, plan.c, a.d, plan.c,
                                  &plan.algo, workspace_, workspace_bytes_, stream_));
}

// ---- the W8A8 Linear ----

namespace {

constexpr size_t kAlign = 256;
size_t round_up(size_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}
bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Where one chunk of `rows` rows keeps its quantised activations, scales and tail output.
struct ChunkLayout {
  size_t scales = 0, tail_scales = 0, tail_out = 0, total = 0;  // offsets; the bytes of q start at 0
};
ChunkLayout chunk_layout(int64_t rows, int64_t k, int64_t groups, int64_t m) {
  ChunkLayout l;
  const int64_t main_rows = rows / kFp8GemmRowMultiple * kFp8GemmRowMultiple;
  l.scales = round_up(static_cast<size_t>(rows * k));
  l.tail_scales = l.scales + round_up(static_cast<size_t>(groups * main_rows) * sizeof(float));
  l.tail_out = l.tail_scales + round_up(static_cast<size_t>(groups * kFp8GemmRowMultiple) * sizeof(float));
  l.total = l.tail_out + round_up(static_cast<size_t>(kFp8GemmRowMultiple * m) * 2);
  return l;
}

}  // namespace

bool w8a8_linear(const LaunchContext& ctx, GemmRunner& gemm, void* workspace, size_t workspace_bytes, Tensor out,
                 const Tensor& x, const LinearWeight& w, const void* bias, const void* residual) {
  if (workspace == nullptr || w.parts.size() != 1 || !w.is_fp8() || w.block_size != kFp8ActGroup) return false;
  const Tensor& wq = w.parts[0].weight;
  const Tensor& ws = w.parts[0].scale_inv;
  const int64_t n = x.dim(0), k = w.in_features, m = w.out_features;
  const int64_t groups = (k + kFp8ActGroup - 1) / kFp8ActGroup;
  // Per-row weight scales (parts off the 128 grid) have no cuBLASLt mode.
  if (ws.dtype != DType::kF32 || ws.ndim != 2 || ws.dim(0) != (m + kFp8ActGroup - 1) / kFp8ActGroup ||
      ws.dim(1) != groups)
    return false;
  if (k % 16 != 0 || groups % 4 != 0 || m % kFp8GemmRowMultiple != 0 || n < kFp8GemmRowMultiple) return false;
  if (x.dtype != DType::kBF16 || out.dtype != DType::kBF16 || out.row_numel() != m) return false;
  if (!aligned16(x.data) || !aligned16(out.data) || !aligned16(wq.data) || !aligned16(ws.data) ||
      !aligned16(residual) || !aligned16(workspace) || !aligned16(bias))
    return false;

  // Rows per chunk: the most (a multiple of 8) whose layout fits; then as many equal chunks as
  // that needs, so that the last one is not left with a few rows.
  const ChunkLayout fixed = chunk_layout(0, k, groups, m);
  const size_t per_row = static_cast<size_t>(k) + static_cast<size_t>(groups) * sizeof(float);
  if (workspace_bytes < fixed.total + 2 * kAlign) return false;
  int64_t cap = static_cast<int64_t>((workspace_bytes - fixed.total - 2 * kAlign) / per_row);
  cap = cap / kFp8GemmRowMultiple * kFp8GemmRowMultiple;
  if (cap < kFp8GemmRowMultiple) return false;
  const int64_t chunks = (n + cap - 1) / cap;
  int64_t rows_per_chunk = (n + chunks - 1) / chunks;
  rows_per_chunk = (rows_per_chunk + kFp8GemmRowMultiple - 1) / kFp8GemmRowMultiple * kFp8GemmRowMultiple;
  if (n - (chunks - 1) * rows_per_chunk < kFp8GemmRowMultiple) return false;
  QVL_CHECK_LE(chunk_layout(rows_per_chunk, k, groups, m).total, workspace_bytes);

  char* base = static_cast<char*>(workspace);
  auto* out_rows = static_cast<uint16_t*>(out.data);
  const auto* res_rows = static_cast<const uint16_t*>(residual);
  // The calls of one chunk [r0, r1): `body` over its rows rounded down to a multiple of 8, and
  // `tail` over its last 8 rows into the workspace when rows remain (tail.n = 0 otherwise).
  struct Chunk {
    Fp8GemmArgs body, tail;
    float* scales = nullptr;
    float* tail_scales = nullptr;
  };
  auto chunk = [&](int64_t r0, int64_t r1) {
    const int64_t rows = r1 - r0, body_rows = rows / kFp8GemmRowMultiple * kFp8GemmRowMultiple;
    const ChunkLayout l = chunk_layout(rows, k, groups, m);
    Chunk c;
    c.scales = reinterpret_cast<float*>(base + l.scales);
    c.tail_scales = reinterpret_cast<float*>(base + l.tail_scales);
    Fp8GemmArgs a;
    a.m = m;
    a.k = k;
    a.ldd = m;
    a.wq = wq.data;
    a.w_scales = ws.as<const float>();
    a.bias = bias;
    c.body = a;
    c.body.n = body_rows;
    c.body.d = out_rows + r0 * m;
    c.body.c = residual ? res_rows + r0 * m : nullptr;
    c.body.xq = base;
    c.body.x_scales = c.scales;
    c.tail = a;
    c.tail.n = body_rows < rows ? kFp8GemmRowMultiple : 0;
    c.tail.d = base + l.tail_out;
    c.tail.c = residual ? res_rows + (r1 - kFp8GemmRowMultiple) * m : nullptr;
    c.tail.xq = base + (rows - kFp8GemmRowMultiple) * k;
    c.tail.x_scales = c.tail_scales;
    return c;
  };
  // Ask for every call before enqueueing any, so that a refusal leaves out and the residual
  // untouched for the dequantised path.
  for (int64_t r0 = 0; r0 < n; r0 += rows_per_chunk) {
    const Chunk c = chunk(r0, std::min(n, r0 + rows_per_chunk));
    if (!gemm.fp8_supported(c.body)) return false;
    if (c.tail.n > 0 && !gemm.fp8_supported(c.tail)) return false;
  }
  for (int64_t r0 = 0; r0 < n; r0 += rows_per_chunk) {
    const int64_t r1 = std::min(n, r0 + rows_per_chunk);
    const Chunk c = chunk(r0, r1);
    const bool tail = c.tail.n > 0;
    launch_quantize_fp8_rows(ctx, base, c.scales, c.body.n, tail ? c.tail_scales : nullptr, x.rows(r0, r1));
    if (tail) {
      ProfileRange range(ctx, "cublasLt fp8 gemm (last 8 rows)");
      gemm.fp8_gemm(c.tail);
    }
    {
      ProfileRange range(ctx, "cublasLt fp8 gemm");
      gemm.fp8_gemm(c.body);
    }
    if (tail) {
      const int64_t rest = (r1 - r0) - c.body.n;
      ProfileRange range(ctx, "memcpy d2d");
      const cudaError_t err = cudaMemcpyAsync(out_rows + (r0 + c.body.n) * m,
                                              static_cast<const uint16_t*>(c.tail.d) + (kFp8GemmRowMultiple - rest) * m,
                                              static_cast<size_t>(rest * m) * 2, cudaMemcpyDeviceToDevice, ctx.stream);
      QVL_CHECK(err == cudaSuccess) << "w8a8_linear: copy of the last rows: " << cudaGetErrorString(err);
    }
  }
  return true;
}

}  // namespace qvl::cuda
