// Which GELU cuBLASLt's GELU epilogue computes (CudaBackendOptions::cublas_gelu takes it for GELU tanh):
// D = GELU(W^T . X) in fp32 with W = I, for x over [-4, 4], against the tanh form and the erf form.
// On the GPU machine: nvcc -O2 -o /tmp/gelu_probe tools/bench/gelu_epilogue_probe.cu -lcublasLt && /tmp/gelu_probe
// H100, CUDA 13 (2026-11-26): max |cuBLASLt - gelu_tanh| = 5.17e-06, max |cuBLASLt - gelu_erf| = 4.74e-04.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>
int main() {
  const int m = 16, n = 64, k = 16;  // D [m x n] col-major = W^T(k x m)^T . X (k x n)
  std::vector<__nv_bfloat16> w(k * m), x(k * n);
  for (int i = 0; i < k; ++i)
    for (int j = 0; j < m; ++j) w[i + j * k] = __float2bfloat16(i == j ? 1.0f : 0.0f);
  std::vector<float> xv(k * n);
  for (int c = 0; c < n; ++c)
    for (int r = 0; r < k; ++r) {
      const float v = -4.0f + 8.0f * (c * k + r) / (k * n);
      x[r + c * k] = __float2bfloat16(v);
      xv[r + c * k] = __bfloat162float(x[r + c * k]);
    }
  void *dw, *dx, *dd;
  cudaMalloc(&dw, w.size() * 2);
  cudaMalloc(&dx, x.size() * 2);
  cudaMalloc(&dd, m * n * 4);
  cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
  cublasLtHandle_t h;
  cublasLtCreate(&h);
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_GELU;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  cublasLtMatrixLayout_t a, b, d;
  cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, k, m, k);
  cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, k, n, k);
  cublasLtMatrixLayoutCreate(&d, CUDA_R_32F, m, n, m);
  float al = 1, be = 0;
  void* ws;
  cudaMalloc(&ws, 1 << 22);
  cublasStatus_t st = cublasLtMatmul(h, desc, &al, dw, a, dx, b, &be, dd, d, dd, d, nullptr, ws, 1 << 22, 0);
  cudaDeviceSynchronize();
  std::vector<float> out(m * n);
  cudaMemcpy(out.data(), dd, out.size() * 4, cudaMemcpyDeviceToHost);
  double et = 0, ee = 0;
  for (int c = 0; c < n; ++c)
    for (int r = 0; r < m; ++r) {
      const double v = xv[r + c * k], got = out[r + c * m];
      const double gt = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
      const double ge = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
      et = std::fmax(et, std::fabs(got - gt));
      ee = std::fmax(ee, std::fabs(got - ge));
    }
  printf("status %d; max |cuBLASLt - gelu_tanh| = %.3g, max |cuBLASLt - gelu_erf| = %.3g\n", (int)st, et, ee);
  return 0;
}
