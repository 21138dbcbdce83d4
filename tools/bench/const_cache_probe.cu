// Whether a value in __constant__ memory stays in a multiprocessor's constant cache from one
// kernel launch to the next, and what reading it costs while the memory system is busy.
// The decode attention's late blocks spend ~4 us from entry to issuing their first keys, most of
// it one 96-byte L2 hit (the step table's entry) queued behind the weight loads in flight
// (bench/RESULTS.md run 42, item 2). A constant-cache hit would not go to the memory system.
// Per launch, one block of 256 threads per multiprocessor. With `congest`, warps 1..7 first issue
// 64 KB of loads from a 2 GB buffer (as a Linear's weight stream), then thread 0 times one read
// of a 16-byte table entry (clock64 around the load and its first use): from a __constant__
// array, by ld.global, or by ld.global.nc. Between the timed launches, `others` kernels run: one
// with 4 KB of parameters and one streaming 64 MB (a decode layer's other kernels). Prints the
// median and maximum cycles over blocks for launch 0 (the first after the table was written) and
// the median over launches 1..N-1.
// On the GPU machine: nvcc -O3 -arch=sm_90 -o /tmp/cc tools/bench/const_cache_probe.cu && /tmp/cc
// H200 at 1980 MHz (2026-11-29, bench/RESULTS.md run 47 item 1), launches 1..19, median cycles:
// quiet 320 (const) / 331 (ld.global) / 332 (ld.global.nc); with the other kernels between
// launches 680 / 610 / 614; with those and the congestion 1004 / 956 / 969. No read is ever a
// constant-cache hit (~30 cycles) at a block's first access in a launch: a __constant__ table
// offers nothing over an L2 hit to the decode kernels.
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

__constant__ int4 c_tab[64];

enum Mode { kConst = 0, kGlobal = 1, kGlobalNc = 2 };

template <int M>
__global__ void __launch_bounds__(256)
    probe(const int4* g_tab, const uint4* big, size_t big_vecs, long long* cycles, int* sink, int congest) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint4 acc = make_uint4(0, 0, 0, 0);
  if (congest && warp > 0) {
    // 7 warps x 32 lanes x 18 loads x 16 B = 64.5 KB per block, issued together.
    const size_t base = (static_cast<size_t>(blockIdx.x) * 7 + (warp - 1)) * 32 * 18 + lane;
    uint4 r[18];
#pragma unroll
    for (int i = 0; i < 18; ++i) r[i] = big[(base + i * 32) % big_vecs];
#pragma unroll
    for (int i = 0; i < 18; ++i) acc.x ^= r[i].x ^ r[i].w;
  }
  if (threadIdx.x == 0) {
    if (congest) {  // let the other warps issue first
      const long long s = clock64();
      while (clock64() - s < 400) {
      }
    }
    const int i = blockIdx.x & 63;
    const long long t0 = clock64();
    int4 v;
    if (M == kConst) {
      v = c_tab[i];
    } else if (M == kGlobal) {
      v = g_tab[i];
    } else {
      v = __ldg(g_tab + i);
    }
    long long t1 = clock64();
    if (v.x == 0x7fffffff) t1 += 1;  // the use: t1 is read after v arrives
    t1 = v.y == 0x7fffffff ? t1 + 1 : clock64();
    cycles[blockIdx.x] = t1 - t0;
    acc.x ^= v.z;
  }
  if (acc.x == 0x12345678u) sink[0] = 1;
}

struct BigParams {
  int v[1024];
};
__global__ void many_params(BigParams p, int* sink) {
  if (p.v[threadIdx.x & 1023] == 0x7fffffff) sink[1] = 1;
}
__global__ void stream(const uint4* src, uint4* dst, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) dst[i] = src[i];
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t big_bytes = size_t{2} << 30, big_vecs = big_bytes / 16;
  uint4 *big = nullptr, *s_src = nullptr, *s_dst = nullptr;
  int4* g_tab = nullptr;
  int* sink = nullptr;
  long long* cyc = nullptr;
  const size_t s_vecs = (size_t{64} << 20) / 16;
  CK(cudaMalloc(&big, big_bytes));
  CK(cudaMemset(big, 1, big_bytes));
  CK(cudaMalloc(&s_src, s_vecs * 16));
  CK(cudaMalloc(&s_dst, s_vecs * 16));
  CK(cudaMalloc(&g_tab, 64 * 16));
  CK(cudaMalloc(&sink, 16));
  constexpr int kLaunches = 20;
  CK(cudaMalloc(&cyc, sizeof(long long) * sms * kLaunches));
  std::vector<int4> h(64);
  for (int i = 0; i < 64; ++i) h[i] = make_int4(i, i + 1, i + 2, i + 3);
  BigParams bp{};
  for (int i = 0; i < 1024; ++i) bp.v[i] = i;

  const char* names[3] = {"const", "ld.global", "ld.global.nc"};
  printf("%d multiprocessors; cycles of one 16-byte table read (clock64)\n", sms);
  printf("%-13s %-7s %-7s | launch 0: median max | launches 1..%d: median of medians, median of maxima\n", "mode",
         "congest", "others", kLaunches - 1);
  for (int mode = 0; mode < 3; ++mode) {
    for (int congest = 0; congest < 2; ++congest) {
      for (int others = 0; others < 2; ++others) {
        CK(cudaMemcpyToSymbol(c_tab, h.data(), 64 * 16));
        CK(cudaMemcpy(g_tab, h.data(), 64 * 16, cudaMemcpyHostToDevice));
        CK(cudaDeviceSynchronize());
        for (int l = 0; l < kLaunches; ++l) {
          long long* out = cyc + static_cast<size_t>(l) * sms;
          if (mode == kConst) probe<kConst><<<sms, 256>>>(g_tab, big, big_vecs, out, sink, congest);
          if (mode == kGlobal) probe<kGlobal><<<sms, 256>>>(g_tab, big, big_vecs, out, sink, congest);
          if (mode == kGlobalNc) probe<kGlobalNc><<<sms, 256>>>(g_tab, big, big_vecs, out, sink, congest);
          if (others) {
            many_params<<<sms, 128>>>(bp, sink);
            stream<<<sms * 4, 256>>>(s_src, s_dst, s_vecs);
            many_params<<<sms, 128>>>(bp, sink);
          }
        }
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        std::vector<long long> c(static_cast<size_t>(sms) * kLaunches);
        CK(cudaMemcpy(c.data(), cyc, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        std::vector<long long> meds, maxs;
        long long med0 = 0, max0 = 0;
        for (int l = 0; l < kLaunches; ++l) {
          std::vector<long long> v(c.begin() + l * sms, c.begin() + (l + 1) * sms);
          std::sort(v.begin(), v.end());
          if (l == 0) {
            med0 = v[v.size() / 2];
            max0 = v.back();
          } else {
            meds.push_back(v[v.size() / 2]);
            maxs.push_back(v.back());
          }
        }
        std::sort(meds.begin(), meds.end());
        std::sort(maxs.begin(), maxs.end());
        printf("%-13s %-7d %-7d | %8lld %8lld | %8lld %8lld\n", names[mode], congest, others, med0, max0,
               meds[meds.size() / 2], maxs[maxs.size() / 2]);
      }
    }
  }
  return 0;
}
