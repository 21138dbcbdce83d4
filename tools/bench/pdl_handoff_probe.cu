// What a kernel boundary costs with programmatic dependent launch (griddepcontrol.wait), against a
// release/acquire counter the dependent polls instead (the handoff a persistent decode kernel would
// use), and against plain stream order. A chain of 140 kernels in a CUDA graph; each block loads
// 0 or 32 KB of "weights" before its wait, reads 8 KB of the previous kernel's output after it,
// spins `work` ns and writes its output. Prints the graph time per kernel and the median / least
// gap between the previous kernel's last block end and this kernel's first block start.
// Modes: 0 = PDL wait, 1 = counter (launched with PDL, never waits), 2 = no PDL.
// On the GPU machine: nvcc -O3 -std=c++17 -arch=sm_90 -o /tmp/pdl tools/bench/pdl_handoff_probe.cu && /tmp/pdl
// H100 (bench/RESULTS.md run 35), one block per multiprocessor, no work, no weights: 1.87 us per
// kernel with the PDL wait (gap 0.5 us), 2.57 with the counter (0.26), 2.32 in stream order (1.0).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                    \
  do {                                                                           \
    auto e = (x);                                                                \
    if (e != cudaSuccess) {                                                      \
      printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

struct P {
  unsigned* cnt;                // [K] completions of kernel i
  unsigned* passed;             // [K] consumers of cnt[i] that passed
  unsigned long long* t_end;    // [K * G]
  unsigned long long* t_start;  // [K * G]
  const uint4* w;               // weights
  float* buf;                   // [K + 1][G * 64]
  int g;                        // blocks per kernel
  int i;                        // kernel index
  int mode;
  int work;  // ns
  int wvec;  // uint4 per thread before the wait
};

__device__ __forceinline__ unsigned long long gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void __launch_bounds__(256) step(P p) {
  const int b = blockIdx.x, t = threadIdx.x;
  uint4 acc[8];
  const uint4* wb = p.w + (size_t(p.i) * p.g + b) * 256 * 8;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (k < p.wvec) acc[k] = __ldcs(wb + k * 256 + t);
  if (p.i > 0) {
    if (p.mode == 0) {
      asm volatile("griddepcontrol.wait;" ::: "memory");
    } else if (p.mode == 1) {
      if (t == 0)
        while (ld_acquire(p.cnt + p.i - 1) < unsigned(p.g)) {
        }
      __syncthreads();
    }
  }
  if (p.mode != 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (t == 0) p.t_start[p.i * p.g + b] = gtime();
  // read the previous output (8 KB), as x
  const float* in = p.buf + size_t(p.i) * p.g * 64;
  float s = 0;
  for (int k = t; k < 2048; k += 256) s += in[(k * 7 + b * 64) % (p.g * 64)];
  unsigned x = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k)
    if (k < p.wvec) x ^= acc[k].x ^ acc[k].y ^ acc[k].z ^ acc[k].w;
  s += float(x & 1);
  if (p.work > 0) {
    const unsigned long long t0 = gtime();
    while (gtime() - t0 < unsigned(p.work)) {
    }
  }
  __shared__ float red[8];
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(~0u, s, o);
  if ((t & 31) == 0) red[t >> 5] = s;
  __syncthreads();
  if (t < 64) p.buf[size_t(p.i + 1) * p.g * 64 + b * 64 + t] = red[t & 7] + 1.f;
  __syncthreads();
  if (t == 0) {
    if (p.mode == 1) {
      __threadfence();
      red_release(p.cnt + p.i, 1);
    }
    p.t_end[p.i * p.g + b] = gtime();
    if (p.mode == 1 && p.i > 0) {
      if (atomicAdd(p.passed + p.i - 1, 1) == unsigned(p.g) - 1) {
        p.cnt[p.i - 1] = 0;
        p.passed[p.i - 1] = 0;
      }
    }
  }
}

int main(int argc, char** argv) {
  const int K = 140, reps = 50;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int gmax = 3 * sms;
  unsigned *cnt, *passed;
  unsigned long long *te, *ts;
  uint4* w;
  float* buf;
  const size_t wbytes = size_t(K) * gmax * 256 * 8 * 16;
  CK(cudaMalloc(&cnt, K * 4));
  CK(cudaMalloc(&passed, K * 4));
  CK(cudaMemset(cnt, 0, K * 4));
  CK(cudaMemset(passed, 0, K * 4));
  CK(cudaMalloc(&te, size_t(K) * gmax * 8));
  CK(cudaMalloc(&ts, size_t(K) * gmax * 8));
  CK(cudaMalloc(&w, wbytes));
  CK(cudaMemset(w, 1, wbytes));
  CK(cudaMalloc(&buf, size_t(K + 1) * gmax * 64 * 4));
  CK(cudaMemset(buf, 0, size_t(K + 1) * gmax * 64 * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  printf("sms %d, weights %.0f MB\n", sms, wbytes / 1e6);
  printf("%-5s %-4s %-6s %-5s %10s %12s %12s\n", "mode", "g/sm", "work", "wvec", "us/kernel", "gap_med_us",
         "gap_min_us");
  for (int gsm : {1, 2})
    for (int work : {0, 2000})
      for (int wvec : {0, 8})
        for (int mode : {0, 1, 2}) {
          const int g = gsm * sms;
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
          for (int i = 0; i < K; ++i) {
            P p{cnt, passed, te, ts, w, buf, g, i, mode, work, wvec};
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(g);
            cfg.blockDim = dim3(256);
            cfg.stream = st;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = (mode == 2 || i == 0) ? 0 : 1;
            CK(cudaLaunchKernelEx(&cfg, step, p));
          }
          CK(cudaStreamEndCapture(st, &graph));
          CK(cudaGraphInstantiate(&exec, graph, 0));
          for (int r = 0; r < 5; ++r) CK(cudaGraphLaunch(exec, st));
          CK(cudaStreamSynchronize(st));
          cudaEvent_t e0, e1;
          CK(cudaEventCreate(&e0));
          CK(cudaEventCreate(&e1));
          std::vector<float> ms;
          for (int r = 0; r < reps; ++r) {
            CK(cudaEventRecord(e0, st));
            CK(cudaGraphLaunch(exec, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float m;
            CK(cudaEventElapsedTime(&m, e0, e1));
            ms.push_back(m);
          }
          std::sort(ms.begin(), ms.end());
          std::vector<unsigned long long> hte(size_t(K) * g), hts(size_t(K) * g);
          CK(cudaMemcpy(hte.data(), te, hte.size() * 8, cudaMemcpyDeviceToHost));
          CK(cudaMemcpy(hts.data(), ts, hts.size() * 8, cudaMemcpyDeviceToHost));
          std::vector<double> gaps;
          for (int i = 1; i < K; ++i) {
            unsigned long long me = 0, ms0 = ~0ull;
            for (int b = 0; b < g; ++b) {
              me = std::max(me, hte[size_t(i - 1) * g + b]);
              ms0 = std::min(ms0, hts[size_t(i) * g + b]);
            }
            gaps.push_back((double(ms0) - double(me)) / 1000.0);
          }
          std::sort(gaps.begin(), gaps.end());
          printf("%-5d %-4d %-6d %-5d %10.3f %12.3f %12.3f\n", mode, gsm, work, wvec, ms[reps / 2] * 1000.0 / K,
                 gaps[gaps.size() / 2], gaps[0]);
          CK(cudaGraphExecDestroy(exec));
          CK(cudaGraphDestroy(graph));
        }
  return 0;
}
