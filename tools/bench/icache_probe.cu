// What running a kernel's code cold costs: the decode step runs five large kernels per layer
// (decode attention ~107 KB of SASS, the Linears 20-100 KB each; readelf on the cubins), so each
// may start with its instructions out of the multiprocessor's instruction caches.
// A kernel of kInstr straight-line FFMAs in 8 independent chains (issue-bound when warm), one
// block of 4 warps per multiprocessor; thread 0 stamps %globaltimer before and after the code.
// Chains of 200 launches in a graph: the same kernel each time (warm), two kernels of the same
// size taking turns, or four. Prints the median time per block through the code.
// On the GPU machine: nvcc -O3 -arch=sm_90 -o /tmp/ic tools/bench/icache_probe.cu && /tmp/ic
// H100 (bench/RESULTS.md run 35), median per block, the same kernel / four taking turns: 8 KB
// 0.38 / 0.61 us, 32 KB 2.24 / 2.85, 64 KB 5.57 / 5.92, 128 KB 19.2 / 19.4. A cold start costs
// 0.2-0.6 us. Straight-line code over ~16 KB runs at 2-4 cycles per instruction even when warm.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                    \
  do {                                                                           \
    auto e = (x);                                                                \
    if (e != cudaSuccess) {                                                      \
      printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      return 1;                                                                  \
    }                                                                            \
  } while (0)

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// kInstr FFMAs (16 bytes of SASS each), in 8 chains; ID makes each instantiation's constants differ.
template <int kInstr, int ID>
__global__ void __launch_bounds__(128) big(unsigned long long* t, float* out, float seed) {
  if (threadIdx.x == 0) t[blockIdx.x * 2] = gtime();
  float a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = seed * (threadIdx.x + j);
#pragma unroll
  for (int i = 0; i < kInstr / 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(a[j]) : "f"(1.0f + 1e-7f * (i + ID)), "f"(1e-3f * (j + ID)));
  __syncthreads();
  if (threadIdx.x == 0) t[blockIdx.x * 2 + 1] = gtime();
  float s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += a[j];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <int kInstr>
int run(cudaStream_t st, int sms, unsigned long long* t, float* out) {
  void (*k[4])(unsigned long long*, float*, float) = {big<kInstr, 0>, big<kInstr, 1>, big<kInstr, 2>, big<kInstr, 3>};
  for (int kinds : {1, 2, 4}) {
    const int n = 200;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; ++i) k[i % kinds]<<<sms, 128, 0, st>>>(t + size_t(i) * sms * 2, out, 1e-3f);
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < 3; ++r) CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    std::vector<unsigned long long> h(size_t(n) * sms * 2);
    CK(cudaMemcpy(h.data(), t, h.size() * 8, cudaMemcpyDeviceToHost));
    std::vector<double> d;
    for (int i = 8; i < n; ++i)
      for (int b = 0; b < sms; ++b)
        d.push_back((h[(size_t(i) * sms + b) * 2 + 1] - h[(size_t(i) * sms + b) * 2]) / 1e3);
    std::sort(d.begin(), d.end());
    printf("%6d FFMAs (%4d KB of code), %d kernel(s) taking turns: median %.2f us, p90 %.2f us per block\n", kInstr,
           kInstr * 16 / 1024, kinds, d[d.size() / 2], d[d.size() * 9 / 10]);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  unsigned long long* t;
  float* out;
  CK(cudaMalloc(&t, size_t(200) * sms * 2 * 8));
  CK(cudaMalloc(&out, size_t(sms) * 128 * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  if (run<512>(st, sms, t, out) || run<2048>(st, sms, t, out) || run<4096>(st, sms, t, out) ||
      run<8192>(st, sms, t, out))
    return 1;
  return 0;
}
