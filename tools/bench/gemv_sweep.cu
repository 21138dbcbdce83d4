// Decode-Linear kernel sweep (GPU machine): times every skinny-kernel configuration
// (kernels.h SkinnyTuning) on the Qwen3-VL 2B/4B decode shapes, BF16 and FP8, 1/8/32 rows,
// inside a CUDA graph of back-to-back launches with programmatic dependent launch (as the
// decode step runs them), each launch reading a different copy of the weights (the pool is
// far larger than L2, as a real step's 3.4 GB are). Also measures the read-only and copy
// bandwidth ceilings. Each configuration's output is compared with the first configuration's.
//
// Build (here, against a pack.sh build):   tools/bench/build_gemv_sweep.sh
// Run (GPU machine):                       build-dev/gemv_sweep [--quick] [--ring] [--default] [--l2]
// (--default: only the default configuration; --l2: every launch reads the same copy.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/skinny_common.cuh"

using namespace qvl;
using namespace qvl::cuda;

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// Deterministic pseudo-random fill: bf16 in [-a, a], e4m3 bytes of moderate magnitude, or
// positive floats (scales).
__global__ void fill_kernel(void* p, size_t n, int kind, uint32_t seed, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h & 0xffffff) / 16777216.0f;  // [0, 1)
    if (kind == 0)
      static_cast<bf16*>(p)[i] = __float2bfloat16_rn((2 * u - 1) * a);
    else if (kind == 1)
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>((h >> 24) & 0xbf);  // no NaN (0x7f/0xff)
    else
      static_cast<float*>(p)[i] = a * (0.5f + u);
  }
}

__global__ void read_kernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x * 4) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const size_t j = i + (size_t)u * gridDim.x * blockDim.x;
      v[u] = j < n ? __ldcs(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

// skinny_common.cuh's e4m3 -> bf16 widening against the float conversion, for every byte pair.
__global__ void widen_check_kernel(unsigned* mismatches) {
  const uint32_t pair = blockIdx.x * blockDim.x + threadIdx.x;  // < 65536
  const uint32_t w = pair | (pair << 16);
  const uint32_t lo = skinny::e4m3x2_to_bf16x2(w, skinny::kE4m3Lo), hi = skinny::e4m3x2_to_bf16x2(w, skinny::kE4m3Hi);
  for (int i = 0; i < 4; ++i) {
    const uint8_t b = (w >> (8 * i)) & 0xff;
    if ((b & 0x7f) == 0x7f) continue;  // NaN
    const float f = fp8_e4m3_to_float_dev(b);
    const uint16_t want = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    const uint16_t got = static_cast<uint16_t>((i < 2 ? lo : hi) >> (16 * (i & 1)));
    if (got != want) atomicAdd(mismatches, 1u);
  }
}

void fill(void* p, size_t n, int kind, uint32_t seed, float a) {
  fill_kernel<<<1024, 256>>>(p, n, kind, seed, a);
  CK(cudaGetLastError());
}

struct Shape {
  const char* name;
  int64_t N, K;
  bool residual;
};

int main(int argc, char** argv) {
  bool quick = false, ring_only = false, l2 = false, only_default = false;
  for (int i = 1; i < argc; ++i) {
    quick |= std::strcmp(argv[i], "--quick") == 0;
    ring_only |= std::strcmp(argv[i], "--ring") == 0;
    l2 |= std::strcmp(argv[i], "--l2") == 0;  // every launch reads one copy (L2-resident where it fits)
    only_default |= std::strcmp(argv[i], "--default") == 0;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gemv_sweep on %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  {
    unsigned* d = nullptr;
    unsigned h = 0;
    CK(cudaMalloc(&d, 4));
    CK(cudaMemset(d, 0, 4));
    widen_check_kernel<<<256, 256>>>(d);
    CK(cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost));
    std::printf("e4m3 -> bf16 widening: %u mismatches over all byte pairs\n", h);
    CK(cudaFree(d));
  }
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  const size_t pool_bytes = size_t{3} << 30;
  char* pool = nullptr;
  CK(cudaMalloc(&pool, pool_bytes));
  fill(pool, pool_bytes / 2, 0, 1, 0.05f);  // BF16 weights (the second half becomes FP8 weights below)
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&sink, 16));

  // ---- ceilings ----
  {
    const size_t n = (size_t{2} << 30) / 16;
    auto time = [&](auto fn) {
      fn();
      CK(cudaStreamSynchronize(stream));
      std::vector<float> v;
      for (int r = 0; r < 5; ++r) {
        CK(cudaEventRecord(e0, stream));
        fn();
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        v.push_back(ms);
      }
      std::sort(v.begin(), v.end());
      return v[2];
    };
    for (int blocks_per_sm : {4, 8, 16}) {
      const float ms = time([&] {
        read_kernel<<<prop.multiProcessorCount * blocks_per_sm, 256, 0, stream>>>(reinterpret_cast<const uint4*>(pool),
                                                                                  n, sink);
      });
      std::printf("ceiling: read 2 GiB, %d blocks/SM: %.0f GB/s\n", blocks_per_sm, 2.147483648 / ms * 1e3);
    }
    const float ms = time([&] {
      CK(cudaMemcpyAsync(pool + (size_t{1} << 30), pool, size_t{1} << 30, cudaMemcpyDeviceToDevice, stream));
    });
    std::printf("ceiling: copy 1 GiB (read + write): %.0f GB/s\n", 2 * 1.073741824 / ms * 1e3);
  }
  // FP8 weights need bytes that are valid e4m3: refill the pool's second half as e4m3.
  char* pool8 = pool + pool_bytes / 2;
  fill(pool8, pool_bytes / 2, 1, 7, 0);

  const std::vector<Shape> shapes = {
      {"2b qkv", 4096, 2048, false},       {"2b o", 2048, 2048, true},          {"2b gate_up", 12288, 2048, false},
      {"2b down", 2048, 6144, true},       {"2b lm_head", 151936, 2048, false}, {"4b qkv", 6144, 2560, false},
      {"4b o", 2560, 4096, true},          {"4b gate_up", 19456, 2560, false},  {"4b down", 2560, 9728, true},
      {"4b lm_head", 151936, 2560, false},
  };
  // Variant 1 first (the reference of rel_diff): the default, then group / prewait / blocks settings.
  std::vector<SkinnyTuning> configs = {{1, 0, 0},       {1, 0, 0, 1, 1}, {1, 0, 0, 1, 2},
                                       {1, 0, 0, 2, 1}, {1, 0, 0, 2, 2}, {1, 0, 0, 3, 2},
                                       {1, 0, 0, 4, 2}, {1, 0, 0, 5, 2}, {1, 0, 0, 0, 0, 3}};
  for (int split : {1, 2, 4, 8})
    for (int d : {2, 3}) configs.push_back({2, d, split});  // FP8: depth 4, 6
  // The bulk-copy ring (variant 3): depth (0: the default), group (chunks per warp per stage),
  // blocks per multiprocessor. --ring: only these, after the default one-tile kernel.
  // variant 3: depth, split = mode (1 whole tiles, 2 row segments), group, -, blocks.
  const std::vector<SkinnyTuning> ring = {{3, 0, 0, 0, 0, 1}, {3, 0, 1, 0, 0, 1}, {3, 3, 1, 0, 0, 1},
                                          {3, 0, 2, 0, 0, 1}, {3, 0, 2, 2, 0, 1}, {3, 0, 2, 4, 0, 1},
                                          {3, 0, 0, 0, 0, 2}, {3, 2, 1, 0, 0, 2}};
  if (ring_only) configs.resize(1);
  configs.insert(configs.end(), ring.begin(), ring.end());
  configs.push_back({0, 0, 0});  // the default choice for the shape
  if (only_default) configs = {{0, 0, 0}};
  const int ring_smem = prop.major >= 9 ? ring_smem_budget(static_cast<int>(prop.sharedMemPerBlockOptin)) : 0;
  configure_skinny(ring_smem);
  const std::vector<int> rows = quick       ? std::vector<int>{1}
                                : ring_only ? std::vector<int>{1, 8}
                                            : std::vector<int>{1, 8, 32};

  bf16 *x = nullptr, *out = nullptr, *ref = nullptr;
  float* scale = nullptr;
  CK(cudaMalloc(&x, 32 * 10000 * 2));
  CK(cudaMalloc(&out, 32 * 151936 * 2));
  CK(cudaMalloc(&ref, 32 * 151936 * 2));
  CK(cudaMalloc(&scale, 1200 * 80 * 4));
  fill(x, 32 * 10000, 0, 3, 1.0f);
  fill(scale, 1200 * 80, 2, 5, 1e-3f);
  std::vector<uint16_t> h_out(32 * 151936), h_ref(32 * 151936);

  std::printf("%-11s %-4s %3s %-12s %9s %7s %9s\n", "shape", "w", "n", "config", "us", "GB/s", "rel_diff");
  for (bool fp8 : {false, true}) {
    for (const Shape& sh : shapes) {
      const size_t wbytes = static_cast<size_t>(sh.N * sh.K) * (fp8 ? 1 : 2);
      const int copies = l2 ? 1 : static_cast<int>(std::max<size_t>(1, (pool_bytes / 2) / wbytes));
      for (int n : rows) {
        double best_us = 1e30;
        std::string best;
        for (const SkinnyTuning& cfg : configs) {
          if (!fp8 && cfg.variant == 1 && (cfg.group >= 2 || cfg.blocks == 3)) continue;  // FP8 only
          LaunchContext ctx;
          ctx.stream = stream;
          ctx.pdl = true;
          ctx.num_sms = prop.multiProcessorCount;
          ctx.ring_smem = ring_smem;
          ctx.skinny = cfg;
          if (fp8 && cfg.variant == 2 && cfg.depth) ctx.skinny.depth = cfg.depth == 2 ? 4 : 6;
          auto weight = [&](int copy) {
            LinearWeight w;
            LinearPart part;
            char* base = (fp8 ? pool8 : pool) + static_cast<size_t>(copy % copies) * wbytes;
            part.weight = Tensor(base, fp8 ? DType::kF8E4M3 : DType::kBF16, {sh.N, sh.K}, Device::kCuda);
            if (fp8)
              part.scale_inv = Tensor(scale, DType::kF32, {(sh.N + 127) / 128, (sh.K + 127) / 128}, Device::kCuda);
            w.parts.push_back(part);
            w.out_features = sh.N;
            w.in_features = sh.K;
            return w;
          };
          Tensor tx(x, DType::kBF16, {n, sh.K}, Device::kCuda);
          Tensor to(out, DType::kBF16, {n, sh.N}, Device::kCuda);
          Epilogue ep;
          // Correctness: one launch on copy 0, no residual, against the first config.
          try {
            CK(cudaMemsetAsync(out, 0xff, n * sh.N * 2, stream));
            launch_skinny_linear(ctx, to, tx, weight(0), ep);
          } catch (const std::exception& e) {
            std::printf("%-11s %-4s %3d config %d,%d,%d,%d,%d,%d failed: %s\n", sh.name, fp8 ? "fp8" : "bf16", n,
                        cfg.variant, ctx.skinny.depth, cfg.split, cfg.group, cfg.prewait, cfg.blocks, e.what());
            continue;
          }
          CK(cudaStreamSynchronize(stream));
          CK(cudaMemcpy(h_out.data(), out, n * sh.N * 2, cudaMemcpyDeviceToHost));
          double diff = 0, mx = 0;
          if (&cfg == &configs.front()) {
            h_ref = h_out;
          } else {
            for (int64_t i = 0; i < n * sh.N; ++i) {
              const float a = bf16_to_float(h_out[i]), b = bf16_to_float(h_ref[i]);
              diff = std::max(diff, std::isfinite(a) ? std::fabs(static_cast<double>(a) - b) : 1e30);
              mx = std::max(mx, std::fabs(static_cast<double>(b)));
            }
          }
          // Timing: a graph of R launches over rotating weight copies, residual as in the model.
          if (sh.residual) ep.residual = to;
          const int R = 16;
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          for (int r = 0; r < R; ++r) launch_skinny_linear(ctx, to, tx, weight(r + 1), ep);
          CK(cudaStreamEndCapture(stream, &graph));
          CK(cudaGraphInstantiate(&exec, graph, 0));
          CK(cudaGraphLaunch(exec, stream));
          std::vector<float> v;
          for (int rep = 0; rep < 5; ++rep) {
            CK(cudaEventRecord(e0, stream));
            CK(cudaGraphLaunch(exec, stream));
            CK(cudaEventRecord(e1, stream));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            v.push_back(ms);
          }
          CK(cudaGraphExecDestroy(exec));
          CK(cudaGraphDestroy(graph));
          std::sort(v.begin(), v.end());
          const double us = v[2] * 1e3 / R;
          const double gbps = wbytes / (us * 1e-6) / 1e9;
          char name[48];
          std::snprintf(name, sizeof name, "%d,%d,%d,%d,%d,%d", cfg.variant, ctx.skinny.depth, cfg.split, cfg.group,
                        cfg.prewait, cfg.blocks);
          std::printf("%-11s %-4s %3d %-12s %9.2f %7.0f %9.1e\n", sh.name, fp8 ? "fp8" : "bf16", n, name, us, gbps,
                      mx > 0 ? diff / mx : diff);
          if (us < best_us) {
            best_us = us;
            best = name;
          }
        }
        std::printf("BEST %-11s %-4s %3d %-12s %9.2f %7.0f\n", sh.name, fp8 ? "fp8" : "bf16", n, best.c_str(), best_us,
                    wbytes / (best_us * 1e-6) / 1e9);
      }
    }
  }
  return 0;
}
