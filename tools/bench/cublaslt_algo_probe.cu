// cuBLASLt's first heuristic algorithm against the best of its top 16, timed (20 runs each, zeroed
// operands, L2-warm), for the vision encoder's and the 2B / 4B prefill's GEMM shapes (BF16, TN, fp32
// compute, BF16 out). On the GPU machine:
//   nvcc -O2 -o /tmp/algo_probe tools/bench/cublaslt_algo_probe.cu -lcublasLt && /tmp/algo_probe
// Results (H100, 2026-11-26): tools/bench/CUDA_PERF_NOTES.md.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>
struct Shape {
  long m, n, k;
  bool bias, res;
  int gelu;
  const char* name;
};
int main() {
  std::vector<Shape> shapes = {
      {3072, 3072, 1024, true, false, 0, "vision qkv"},      {1024, 3072, 1024, true, true, 0, "vision proj"},
      {4096, 3072, 1024, true, false, 1, "vision fc1+gelu"}, {1024, 3072, 4096, true, true, 0, "vision fc2"},
      {4096, 802, 2048, false, false, 0, "2B qkv"},          {2048, 802, 2048, false, true, 0, "2B o"},
      {12288, 802, 2048, false, false, 0, "2B gate_up"},     {2048, 802, 6144, false, true, 0, "2B down"},
      {6144, 802, 2560, false, false, 0, "4B qkv"},          {2560, 802, 4096, false, true, 0, "4B o"},
      {19456, 802, 2560, false, false, 0, "4B gate_up"},     {2560, 802, 9728, false, true, 0, "4B down"},
  };
  cublasLtHandle_t h;
  cublasLtCreate(&h);
  size_t wsb = 32 << 20;
  void* ws;
  cudaMalloc(&ws, wsb);
  void *A, *B, *C, *bias;
  cudaMalloc(&A, 256 << 20);
  cudaMalloc(&B, 64 << 20);
  cudaMalloc(&C, 128 << 20);
  cudaMalloc(&bias, 1 << 20);
  cudaMemset(A, 0, 256 << 20);
  cudaMemset(B, 0, 64 << 20);
  cudaMemset(C, 0, 128 << 20);
  cudaMemset(bias, 0, 1 << 20);
  cudaStream_t st;
  cudaStreamCreate(&st);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (auto& s : shapes) {
    cublasLtMatmulDesc_t d;
    cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtEpilogue_t epi = s.gelu   ? CUBLASLT_EPILOGUE_GELU_BIAS
                             : s.bias ? CUBLASLT_EPILOGUE_BIAS
                                      : CUBLASLT_EPILOGUE_DEFAULT;
    cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (s.bias) {
      cudaDataType_t bt = CUDA_R_16BF;
      cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
      cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, s.k, s.m, s.k);
    cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, s.k, s.n, s.k);
    cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, s.m, s.n, s.m);
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t w = wsb;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof w);
    cublasLtMatmulHeuristicResult_t r[16];
    int found = 0;
    cublasLtMatmulAlgoGetHeuristic(h, d, a, b, c, c, pref, 16, r, &found);
    float al = 1, be = s.res ? 1 : 0;
    float first = 0, best = 1e9;
    int besti = -1;
    for (int i = 0; i < found; ++i) {
      auto run = [&] { return cublasLtMatmul(h, d, &al, A, a, B, b, &be, C, c, C, c, &r[i].algo, ws, wsb, st); };
      if (run() != CUBLAS_STATUS_SUCCESS) continue;
      for (int j = 0; j < 3; ++j) run();
      cudaEventRecord(e0, st);
      for (int j = 0; j < 20; ++j) run();
      cudaEventRecord(e1, st);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      ms /= 20;
      if (i == 0) first = ms;
      if (ms < best) {
        best = ms;
        besti = i;
      }
    }
    const double fl = 2.0 * s.m * s.n * s.k;
    printf("%-16s %d algos: first %7.2f us (%4.0f TFLOP/s), best #%d %7.2f us (%4.0f TFLOP/s), %+.1f%%\n", s.name,
           found, first * 1e3, fl / first / 1e9, besti, best * 1e3, fl / best / 1e9, 100.0 * (best - first) / first);
  }
  return 0;
}
