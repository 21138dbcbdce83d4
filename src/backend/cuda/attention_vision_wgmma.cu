// Vision attention at head dim 64 on sm_90a (H100 / H200): the same op as attention_vision.cu
// (non-causal softmax(q·kᵀ·scale)·v inside each segment of packed qkv [N, 3·nh·64]) with
// Hopper's warpgroup MMA. A block holds 128 query rows as two warpgroups of 64 that share each
// 64-key tile of K and V. Tiles stream through three cp.async stages in 128-byte-swizzled shared
// memory, the layout wgmma reads through its descriptors: K as the K-major B operand of
// S = Q·Kᵀ, V as the transposed (MN-major) B operand of O = P·V. Q and P stay in registers as the
// A operand; the online softmax runs on S in the accumulator layout, as in flash.cuh.
//
// The kernel is compiled for sm_90a only (CMakeLists.txt adds that target for this file); other
// targets get an empty body, and vision_attention_wgmma_available() asks the device which one it
// loaded before anything dispatches here.
#include "backend/cuda/flash.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define QVL_WGMMA 1
#endif

namespace qvl::cuda {
namespace {

constexpr int kHD = 64;     // head dim (one 128-byte swizzled row per key)
constexpr int kBN = 64;     // keys per tile
constexpr int kGroups = 2;  // warpgroups per block, 64 query rows each
constexpr int kBM = 64 * kGroups;
constexpr int kThreads = 128 * kGroups;
constexpr int kStages = 3;
constexpr int kTileBytes = kBN * kHD * 2;                    // 8 KiB: one K or V tile
constexpr int kSmemBytes = kStages * 2 * kTileBytes + 1024;  // + alignment to the 1 KiB swizzle atom

struct Params {
  const bf16* qkv;
  bf16* out;
  const int32_t* cu;
  int num_segments;
  int heads;
  float scale_log2;
};

#ifdef QVL_WGMMA
// Shared-memory matrix descriptor: start address, leading / stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16 |
         static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32 | uint64_t{1} << 62;
}
// d (64 x 64 fp32, accumulator layout) = [d +] a (64 x 16 bf16, registers) · b (16 x 64, shared).
template <int kTransB>
__device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,"
      "%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate), "n"(kTransB));
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit_and_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const bf162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
#endif

__global__ void __launch_bounds__(kThreads, 1) vision_attention_wgmma_kernel(const Params p) {
#ifdef QVL_WGMMA
  extern __shared__ uint8_t smem_raw[];
  // Tiles start on 1 KiB (the swizzle atom: 8 rows of 128 bytes).
  uint8_t* smem = smem_raw + ((1024 - (flash::smem_addr(smem_raw) & 1023)) & 1023);
  auto tile = [&](int stage, int v) { return smem + (stage * 2 + v) * kTileBytes; };

  // This block's query tile: walk the segments (as attention_vision.cu does).
  int idx = blockIdx.x, a = 0, b = 0, qn = 0, kn = 0;
  for (int s = 0; s < p.num_segments; ++s) {
    const int begin = p.cu[s], len = p.cu[s + 1] - begin, tiles = (len + kBM - 1) / kBM;
    if (idx < tiles) {
      a = begin + idx * kBM;
      b = begin;
      qn = min(kBM, len - idx * kBM);
      kn = len;
      break;
    }
    idx -= tiles;
  }
  if (qn <= 0) return;
  const int head = blockIdx.y, tid = threadIdx.x;
  const int64_t ld = 3LL * p.heads * kHD;
  const bf16* kbase = p.qkv + b * ld + static_cast<int64_t>(p.heads + head) * kHD;
  const bf16* vbase = kbase + static_cast<int64_t>(p.heads) * kHD;

  // Tile t's K and V rows into stage s, 16-byte chunk c of row r at chunk c ^ (r % 8); keys past
  // the segment read as zeros.
  auto load_tile = [&](int t, int s) {
    for (int i = tid; i < 2 * kBN * 8; i += kThreads) {
      const int v = i / (kBN * 8), r = (i / 8) % kBN, c = i % 8;
      const int key = t * kBN + r;
      const bool ok = key < kn;
      const bf16* src = (v ? vbase : kbase) + static_cast<int64_t>(ok ? key : 0) * ld + c * 8;
      flash::cp_async16(tile(s, v) + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
    flash::cp_async_commit();
  };

  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int r0 = warp * 16 + g, r1 = r0 + 8;  // query rows of this thread within the block's tile
  // Q as the A operand: k-step ks holds columns 16ks.. of rows r0 and r1 (rows past qn: zeros).
  uint32_t qa[4][4];
  {
    const bf16* q0 = p.qkv + (a + min(r0, qn - 1)) * ld + head * kHD;
    const bf16* q1 = p.qkv + (a + min(r1, qn - 1)) * ld + head * kHD;
    auto q32 = [](const bf16* row, int col) { return __ldg(reinterpret_cast<const uint32_t*>(row + col)); };
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      qa[ks][0] = q32(q0, 16 * ks + 2 * t4);
      qa[ks][1] = q32(q1, 16 * ks + 2 * t4);
      qa[ks][2] = q32(q0, 16 * ks + 8 + 2 * t4);
      qa[ks][3] = q32(q1, 16 * ks + 8 + 2 * t4);
    }
  }

  float o[32], s[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = s[i] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const int ntiles = (kn + kBN - 1) / kBN;
  load_tile(0, 0);
  if (ntiles > 1) load_tile(1, 1);
  for (int t = 0; t < ntiles; ++t) {
    if (t + 1 < ntiles)
      flash::cp_async_wait<1>();
    else
      flash::cp_async_wait<0>();
    // cp.async wrote through the generic proxy; wgmma reads through the async one.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    // The stage tile t + 2 overwrites held tile t - 1, which every warpgroup has finished.
    if (t + 2 < ntiles) load_tile(t + 2, (t + 2) % kStages);
    const uint32_t kaddr = flash::smem_addr(tile(t % kStages, 0)), vaddr = flash::smem_addr(tile(t % kStages, 1));

    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_64x64x16<0>(s, qa[ks], sw128_desc(kaddr + ks * 32, 16, 1024), ks);
    wgmma_commit_and_wait();

    // s[4j..4j+1]: row r0, keys 8j + 2·t4 (+1); s[4j+2..4j+3]: row r1.
    if ((t + 1) * kBN > kn) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int key = t * kBN + 8 * j + 2 * t4;
        if (key >= kn) s[4 * j] = s[4 * j + 2] = -INFINITY;
        if (key + 1 >= kn) s[4 * j + 1] = s[4 * j + 3] = -INFINITY;
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
      mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    // Every tile holds a key of the segment, so the new maxima are finite.
    const float n0 = fmaxf(m0, mx0 * p.scale_log2), n1 = fmaxf(m1, mx1 * p.scale_log2);
    const float c0 = exp2f(m0 - n0), c1 = exp2f(m1 - n1);
    m0 = n0;
    m1 = n1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[4 * j] = exp2f(fmaf(s[4 * j], p.scale_log2, -n0));
      s[4 * j + 1] = exp2f(fmaf(s[4 * j + 1], p.scale_log2, -n0));
      s[4 * j + 2] = exp2f(fmaf(s[4 * j + 2], p.scale_log2, -n1));
      s[4 * j + 3] = exp2f(fmaf(s[4 * j + 3], p.scale_log2, -n1));
      sum0 += s[4 * j] + s[4 * j + 1];
      sum1 += s[4 * j + 2] + s[4 * j + 3];
      o[4 * j] *= c0;
      o[4 * j + 1] *= c0;
      o[4 * j + 2] *= c1;
      o[4 * j + 3] *= c1;
    }
    l0 = l0 * c0 + sum0;
    l1 = l1 * c1 + sum1;
    // P as the A operand: k-step kk is keys 16kk.. = accumulator columns of n-blocks 2kk, 2kk + 1.
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      pa[kk][0] = pack_bf16(s[8 * kk], s[8 * kk + 1]);
      pa[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
      pa[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
      pa[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
    }
    wgmma_fence();
    // V [key][dim] is B transposed: 16 keys (2 KiB of rows) per k-step, one 64-dim atom.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_64x64x16<1>(o, pa[kk], sw128_desc(vaddr + kk * 2048, 16, 1024), 1);
    wgmma_commit_and_wait();
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
  const int64_t ldo = static_cast<int64_t>(p.heads) * kHD;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = head * kHD + 8 * j + 2 * t4;
    if (r0 < qn)
      *reinterpret_cast<bf162*>(p.out + (a + r0) * ldo + col) =
          __floats2bfloat162_rn(o[4 * j] * inv0, o[4 * j + 1] * inv0);
    if (r1 < qn)
      *reinterpret_cast<bf162*>(p.out + (a + r1) * ldo + col) =
          __floats2bfloat162_rn(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
  }
#endif
}

// Writes 1 where this binary's code for the device is the sm_90a one.
__global__ void wgmma_probe_kernel(int* out) {
#ifdef QVL_WGMMA
  *out = 1;
#else
  *out = 0;
#endif
}

}  // namespace

bool vision_attention_wgmma_available() {
  static const bool available = [] {
    int dev = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return false;
    if (prop.major != 9 || prop.minor != 0) return false;
    int* flag = nullptr;
    int host = 0;
    QVL_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
    wgmma_probe_kernel<<<1, 1>>>(flag);
    QVL_CUDA_CHECK(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost));
    QVL_CUDA_CHECK(cudaFree(flag));
    if (host == 1)
      QVL_CUDA_CHECK(
          cudaFuncSetAttribute(vision_attention_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return host == 1;
  }();
  return available;
}

void launch_vision_attention_wgmma(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                                   int num_heads, float scale) {
  unsigned tiles = 0;
  for (size_t s = 0; s + 1 < seg.host_cu_seqlens.size(); ++s)
    tiles += ceil_div(seg.host_cu_seqlens[s + 1] - seg.host_cu_seqlens[s], kBM);
  const Params prm{qkv.as<bf16>(),
                   out.as<bf16>(),
                   seg.cu_seqlens.as<int32_t>(),
                   static_cast<int>(seg.host_cu_seqlens.size()) - 1,
                   num_heads,
                   scale * 1.4426950408889634f};
  launch(ctx, "vision_attention_wgmma", vision_attention_wgmma_kernel, dim3(tiles, num_heads), dim3(kThreads),
         kSmemBytes, prm);
}

}  // namespace qvl::cuda
