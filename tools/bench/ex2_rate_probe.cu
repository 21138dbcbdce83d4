// The exponential unit's rate for ex2.approx.f32 against the packed ex2.approx.f16x2 and
// ex2.approx.ftz.bf16x2 (elements per clock per multiprocessor, at the nominal clock): whether a
// packed exponential would halve the vision attention's softmax time (CUDA_PERF_NOTES.md).
// On the GPU machine: nvcc -O3 -arch=sm_90 -o /tmp/ex2 tools/bench/ex2_rate_probe.cu && /tmp/ex2
// H100 (bench/RESULTS.md run 35): 15.86 / 15.93 / 15.93. The packed forms compile to two MUFU.EX2
// per pair (cuobjdump -sass: MUFU.EX2.BF16 of each half), so they give no more exponentials.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
template <int M>
__global__ void k(float* out, int iters, float seed) {
  uint32_t v[8];
  for (int i = 0; i < 8; ++i) {
    float f = -seed * (threadIdx.x + i) * 1e-3f;
    v[i] = __float_as_uint(f);
    if (M) {
      __half2 h = __floats2half2_rn(f, f * 0.5f);
      v[i] = *reinterpret_cast<uint32_t*>(&h);
    }
  }
  if (M == 2)
    for (int i = 0; i < 8; ++i) {
      __nv_bfloat162 h = __floats2bfloat162_rn(-seed * 1e-3f * i, -seed * 2e-3f);
      v[i] = *reinterpret_cast<uint32_t*>(&h);
    }
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (M == 0) asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+r"(v[i]));
      if (M == 1) asm volatile("ex2.approx.f16x2 %0, %0;" : "+r"(v[i]));
      if (M == 2) asm volatile("ex2.approx.ftz.bf16x2 %0, %0;" : "+r"(v[i]));
    }
  }
  uint32_t x = 0;
  for (int i = 0; i < 8; ++i) x ^= v[i];
  if (x == 0x12345678) out[0] = 1;
}
int main() {
  float* o;
  cudaMalloc(&o, 4);
  int sms;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int clk;
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const int iters = 4096, blocks = sms * 4, threads = 512;
  const char* names[3] = {"f32", "f16x2", "bf16x2"};
  for (int m = 0; m < 3; ++m) {
    for (int r = 0; r < 2; ++r) {
      cudaEventRecord(a);
      if (m == 0) k<0><<<blocks, threads>>>(o, iters, 1.f);
      if (m == 1) k<1><<<blocks, threads>>>(o, iters, 1.f);
      if (m == 2) k<2><<<blocks, threads>>>(o, iters, 1.f);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms;
      cudaEventElapsedTime(&ms, a, b);
      double elems = double(blocks) * threads * iters * 8 * (m ? 2 : 1);
      double clocks = ms * 1e-3 * clk * 1e3;
      if (r)
        printf("%-7s %.3f ms  %.2f elements/clk/SM (clock %d MHz nominal)\n", names[m], ms, elems / clocks / sms,
               clk / 1000);
    }
  }
  printf("%s\n", cudaGetErrorString(cudaGetLastError()));
}
