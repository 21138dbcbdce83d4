// FP8 prefill probe (issue 7, CUDA_PERF_NOTES.md "FP8 prefill"): the 4B FP8 text Linears of a
// prefill of 802 rows (36 layers: qkv 6144x2560, o 2560x4096, gate_up 19456x2560, down 2560x9728)
// as the CUDA backend runs them with CudaFp8Gemm::kDequant: FP8 rows dequantised to BF16 in
// chunks that fit a workspace, each chunk one cuBLASLt BF16 GEMM. Timed: the BF16 GEMMs alone
// (with cuBLASLt SM count targets), the dequantisation alone (today's kernel; 4 vectors per
// thread), both in series for 32 / 48 / 64 MiB workspaces (chunks as large as fit, or equal), and
// pipelined (each chunk's dequantisation on a second stream, into the other of two buffers, while
// the previous chunk's GEMM runs) with SM targets, stream priorities and dequant grid sizes.
// Synthetic weights; the results are timings only. Build and run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tools/bench/fp8_prefill_probe.cu \
//     -o /tmp/fp8_prefill_probe -lcublasLt && /tmp/fp8_prefill_probe
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    auto e = (x);                                                              \
    if (e != 0) {                                                              \
      printf("%s:%d %s -> %d\n", __FILE__, __LINE__, #x, static_cast<int>(e)); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float e4m3(uint32_t b) {
  const float f = __uint_as_float((b & 0x7f) << 20) * 0x1p120f;
  return (b & 0x80) ? -f : f;
}
__device__ __forceinline__ uint32_t pk(float a, float b) {
  bf16 x = __float2bfloat16_rn(a), y = __float2bfloat16_rn(b);
  return uint32_t(*reinterpret_cast<uint16_t*>(&x)) | (uint32_t(*reinterpret_cast<uint16_t*>(&y)) << 16);
}
// today's kernel: one 16-byte vector per thread-iteration
__global__ void deq1(bf16* dst, const uint8_t* w8, const float* scale, int rows, int cols, int scols) {
  const int vpr = cols / 16, total = rows * vpr;
  for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < total; v += gridDim.x * blockDim.x) {
    const int r = v / vpr, c = (v - r * vpr) * 16;
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w8 + (int64_t)r * cols + c));
    const float s = scale[(r / 128) * scols + c / 128];
    uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[8];
    for (int e = 0; e < 8; ++e)
      o[e] = pk(e4m3(w[e / 2] >> (16 * (e % 2))) * s, e4m3(w[e / 2] >> (16 * (e % 2) + 8)) * s);
    uint4* out = reinterpret_cast<uint4*>(dst + (int64_t)r * cols + c);
    out[0] = make_uint4(o[0], o[1], o[2], o[3]);
    out[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}
// U vectors per thread in flight
template <int U>
__global__ void deqU(bf16* dst, const uint8_t* w8, const float* scale, int rows, int cols, int scols) {
  const int vpr = cols / 16, total = rows * vpr;
  const int step = gridDim.x * blockDim.x * U;
  for (int b = blockIdx.x * blockDim.x * U + threadIdx.x; b < total; b += step) {
    uint4 raw[U];
    float s[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = b + u * blockDim.x;
      if (v < total) {
        const int r = v / vpr, c = (v - r * vpr) * 16;
        raw[u] = __ldcs(reinterpret_cast<const uint4*>(w8 + (int64_t)r * cols + c));
        s[u] = __ldg(scale + (r / 128) * scols + c / 128);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = b + u * blockDim.x;
      if (v < total) {
        const int r = v / vpr, c = (v - r * vpr) * 16;
        uint32_t w[4] = {raw[u].x, raw[u].y, raw[u].z, raw[u].w};
        uint32_t o[8];
        for (int e = 0; e < 8; ++e)
          o[e] = pk(e4m3(w[e / 2] >> (16 * (e % 2))) * s[u], e4m3(w[e / 2] >> (16 * (e % 2) + 8)) * s[u]);
        uint4* out = reinterpret_cast<uint4*>(dst + (int64_t)r * cols + c);
        out[0] = make_uint4(o[0], o[1], o[2], o[3]);
        out[1] = make_uint4(o[4], o[5], o[6], o[7]);
      }
    }
  }
}

struct Gemm {
  cublasLtHandle_t h;
  void* ws;
  size_t wsb = 32 << 20;
  cudaStream_t st;
  struct P {
    cublasLtMatmulDesc_t d;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
  };
  std::vector<std::pair<std::vector<long>, P>> plans;
  P& plan(long m, long n, long k, long ldd, int sms) {
    for (auto& p : plans)
      if (p.first == std::vector<long>{m, n, k, ldd, sms}) return p.second;
    P p;
    CK(cublasLtMatmulDescCreate(&p.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    int32_t t = sms;
    if (sms) CK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &t, sizeof t));
    CK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, m, k));
    CK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, n, k));
    CK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t w = wsb;
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof w));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(h, p.d, p.a, p.b, p.c, p.c, pref, 1, &r, &found));
    if (!found) exit(2);
    p.algo = r.algo;
    plans.push_back({{m, n, k, ldd, sms}, p});
    return plans.back().second;
  }
  void run(void* d, long ldd, const void* x, const void* w, long m, long n, long k, int sms) {
    P& p = plan(m, n, k, ldd, sms);
    float al = 1, be = 0;
    CK(cublasLtMatmul(h, p.d, &al, w, p.a, x, p.b, &be, d, p.c, d, p.c, &p.algo, ws, wsb, st));
  }
};

int main(int argc, char** argv) {
  const int L = 36, M = 802;
  struct Lin {
    int N, K;
  } lin[4] = {{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}};
  int sets = 4;  // distinct weight sets (layers) cycled
  std::vector<uint8_t*> W(4 * sets);
  std::vector<float*> S(4 * sets);
  for (int s = 0; s < sets; ++s)
    for (int i = 0; i < 4; ++i) {
      size_t n = (size_t)lin[i].N * lin[i].K;
      CK(cudaMalloc(&W[s * 4 + i], n));
      std::vector<uint8_t> h(n);
      for (size_t j = 0; j < n; ++j) h[j] = (uint8_t)((j * 2654435761u >> 13) & 0x77);
      CK(cudaMemcpy(W[s * 4 + i], h.data(), n, cudaMemcpyHostToDevice));
      size_t ns = (size_t)((lin[i].N + 127) / 128) * ((lin[i].K + 127) / 128);
      CK(cudaMalloc(&S[s * 4 + i], ns * 4));
      std::vector<float> hs(ns, 0.01f);
      CK(cudaMemcpy(S[s * 4 + i], hs.data(), ns * 4, cudaMemcpyHostToDevice));
    }
  bf16 *X, *Y;
  CK(cudaMalloc(&X, (size_t)M * 9728 * 2));
  CK(cudaMemset(X, 0, (size_t)M * 9728 * 2));
  CK(cudaMalloc(&Y, (size_t)M * 19456 * 2));
  int lo, hi;
  CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
  cudaStream_t s1, s2, s2hi;
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, lo));
  CK(cudaStreamCreateWithPriority(&s2hi, cudaStreamNonBlocking, hi));
  Gemm g;
  CK(cublasLtCreate(&g.h));
  CK(cudaMalloc(&g.ws, g.wsb));
  g.st = s1;
  int nsm;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  // BF16 weights for the lower bound
  std::vector<bf16*> WB(4);
  for (int i = 0; i < 4; ++i) {
    CK(cudaMalloc(&WB[i], (size_t)lin[i].N * lin[i].K * 2));
    CK(cudaMemset(WB[i], 0, (size_t)lin[i].N * lin[i].K * 2));
  }
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  const int kEv = 4096;
  std::vector<cudaEvent_t> evd(kEv), evg(kEv);
  for (int i = 0; i < kEv; ++i) {
    CK(cudaEventCreateWithFlags(&evd[i], cudaEventDisableTiming));
    CK(cudaEventCreateWithFlags(&evg[i], cudaEventDisableTiming));
  }
  auto deq = [&](int kern, bf16* dst, int li, int set, int r0, int r1, cudaStream_t st, int grid) {
    const Lin& l = lin[li];
    const uint8_t* w = W[set * 4 + li] + (size_t)r0 * l.K;
    const float* s = S[set * 4 + li] + (size_t)(r0 / 128) * ((l.K + 127) / 128);
    int total = (r1 - r0) * (l.K / 16);
    int g = grid ? grid : std::min(nsm * 16, (total + 255) / 256);
    if (kern == 1) deq1<<<g, 256, 0, st>>>(dst, w, s, r1 - r0, l.K, (l.K + 127) / 128);
    if (kern == 4)
      deqU<4><<<grid ? grid : std::min(nsm * 8, (total / 4 + 255) / 256 + 1), 256, 0, st>>>(dst, w, s, r1 - r0, l.K,
                                                                                            (l.K + 127) / 128);
  };
  // chunks: (li, r0, r1)
  auto chunks_of = [&](size_t bufbytes, bool balanced) {
    std::vector<std::vector<int>> cs;
    for (int i = 0; i < 4; ++i) {
      const Lin& l = lin[i];
      int chunk = (int)(bufbytes / ((size_t)l.K * 2));
      chunk = chunk >= 128 ? chunk / 128 * 128 : chunk;
      if (balanced) {
        int n = (l.N + chunk - 1) / chunk;
        chunk = ((l.N + n - 1) / n + 127) / 128 * 128;
      }
      for (int r = 0; r < l.N; r += chunk) cs.push_back({i, r, std::min(l.N, r + chunk)});
    }
    return cs;
  };
  auto timeit = [&](const char* name, auto&& body) {
    body();  // warm-up
    CK(cudaDeviceSynchronize());
    float best = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      CK(cudaEventRecord(t0, s1));
      body();
      CK(cudaEventRecord(t1, s1));
      CK(cudaEventSynchronize(t1));
      float ms;
      CK(cudaEventElapsedTime(&ms, t0, t1));
      best = std::min(best, ms);
    }
    printf("%-60s %8.3f ms\n", name, best);
  };
  timeit("bf16 gemms only", [&] {
    for (int l = 0; l < L; ++l)
      for (int i = 0; i < 4; ++i) g.run(Y, lin[i].N, X, WB[i], lin[i].N, M, lin[i].K, 0);
  });
  for (int sm : {120, 112, 100}) {
    char nm[100];
    snprintf(nm, sizeof nm, "bf16 gemms only, sm target %d", sm);
    timeit(nm, [&] {
      for (int l = 0; l < L; ++l)
        for (int i = 0; i < 4; ++i) g.run(Y, lin[i].N, X, WB[i], lin[i].N, M, lin[i].K, sm);
    });
  }
  bf16* buf[2];
  size_t maxbuf = 64 << 20;
  CK(cudaMalloc(&buf[0], maxbuf));
  CK(cudaMalloc(&buf[1], maxbuf));
  for (int kern : {1, 4}) {
    char nm[100];
    snprintf(nm, sizeof nm, "dequant only, kernel %d (32 MiB chunks)", kern);
    auto cs = chunks_of(32 << 20, false);
    timeit(nm, [&] {
      for (int l = 0; l < L; ++l)
        for (auto& c : cs) deq(kern, buf[0], c[0], l % sets, c[1], c[2], s1, 0);
    });
  }
  for (int kern : {1, 4})
    for (size_t mib : {32, 48, 64})
      for (bool bal : {false, true}) {
        char nm[100];
        snprintf(nm, sizeof nm, "serial, kernel %d, %zu MiB%s", kern, mib, bal ? " balanced" : "");
        auto cs = chunks_of(mib << 20, bal);
        timeit(nm, [&] {
          for (int l = 0; l < L; ++l)
            for (auto& c : cs) {
              const Lin& li = lin[c[0]];
              deq(kern, buf[0], c[0], l % sets, c[1], c[2], s1, 0);
              g.run(Y + c[1], li.N, X, buf[0], c[2] - c[1], M, li.K, 0);
            }
        });
      }
  // pipelined: chunk j's dequant on the side stream into buf[j%2], GEMM j on s1 after it; dequant j
  // waits for GEMM j-2 (the last user of that buffer).
  for (int kern : {1, 4})
    for (size_t mib : {32, 48})
      for (int sm : {0, 120, 112, 100})
        for (int pri : {0, 1})
          for (int grid : {0, 264, 528}) {
            if (pri == 1 && grid != 0) continue;
            char nm[120];
            snprintf(nm, sizeof nm, "pipelined, kernel %d, %zu MiB balanced, sm %d, %s prio, grid %d", kern, mib, sm,
                     pri ? "high" : "low", grid);
            auto cs = chunks_of(mib << 20, true);
            cudaStream_t side = pri ? s2hi : s2;
            timeit(nm, [&] {
              int j = 0;
              const int n = L * (int)cs.size();
              auto issue_deq = [&](int jj) {
                const auto& c = cs[jj % cs.size()];
                if (jj >= 2) CK(cudaStreamWaitEvent(side, evg[(jj - 2) % kEv], 0));
                deq(kern, buf[jj % 2], c[0], (jj / (int)cs.size()) % sets, c[1], c[2], side, grid);
                CK(cudaEventRecord(evd[jj % kEv], side));
              };
              CK(cudaEventRecord(evg[kEv - 1], s1));
              CK(cudaStreamWaitEvent(side, evg[kEv - 1], 0));
              issue_deq(0);
              for (j = 0; j < n; ++j) {
                if (j + 1 < n) issue_deq(j + 1);
                const auto& c = cs[j % cs.size()];
                const Lin& li = lin[c[0]];
                CK(cudaStreamWaitEvent(s1, evd[j % kEv], 0));
                g.run(Y + c[1], li.N, X, buf[j % 2], c[2] - c[1], M, li.K, sm);
                CK(cudaEventRecord(evg[j % kEv], s1));
              }
            });
          }
  return 0;
}
