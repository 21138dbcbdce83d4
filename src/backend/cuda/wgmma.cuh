// Shared by the warpgroup-MMA attention kernels (attention_*_wgmma.cu, built for sm_90a only):
// warpgroup MMA, TMA, descriptor and pipeline helpers, and the tensor-map encoder (wgmma.cu).
//
// Conventions the kernels share:
// - Tiles are BF16 rows of 128 bytes in the 128-byte swizzle (what TMA writes with
//   CU_TENSOR_MAP_SWIZZLE_128B), 8-row atoms 1024 bytes apart, every tile 1024-aligned.
// - K-major operands (Q, K) step 32 bytes per 16 columns inside the atom; V is the transposed
//   (N-major) B operand of P·V, 64 columns wide, stepping 2048 bytes (16 rows) per 16 keys.
// - The compiler does not know that an issued wgmma writes its accumulators (or reads its A
//   registers) later: keep() pins them across each wait.
#pragma once

#include <cuda.h>

#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda::wgmma {

// Both kernels' dynamic shared memory: kQTiles tiles of Q, then kStages (K, V) tile pairs, then
// the mbarriers (init_ring's layout), from the first 1024-aligned byte (the swizzle's atom).
// kBytes is what a launch asks for: the tiles, the alignment slack and the barriers.
template <int kQTiles, int kStages, int kTileBytes>
struct RingSmem {
  static constexpr int kBytes = (kQTiles + 2 * kStages) * kTileBytes + 1024 + 256;
  static_assert(static_cast<size_t>(1 + 2 * kStages) * sizeof(uint64_t) <= 256, "the barriers fit");
  uint8_t* base;
  __device__ explicit RingSmem(uint8_t* raw) : base(raw + ((1024 - (smem_u32(raw) & 1023)) & 1023)) {}
  __device__ uint8_t* q() const { return base; }
  __device__ uint8_t* k(int s) const { return base + (kQTiles + 2 * s) * kTileBytes; }
  __device__ uint8_t* v(int s) const { return base + (kQTiles + 2 * s + 1) * kTileBytes; }
  __device__ uint64_t* bars() const { return reinterpret_cast<uint64_t*>(base + (kQTiles + 2 * kStages) * kTileBytes); }
  __device__ uint64_t* q_full() const { return bars(); }               // Q has landed
  __device__ uint64_t* full() const { return bars() + 1; }             // [kStages]: K and V of a tile have landed
  __device__ uint64_t* empty() const { return bars() + 1 + kStages; }  // [kStages]: every consumer warp is done
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The 32 accumulator operands (%0..%31) of an m64n64 wgmma, and its register list.
#define QVL_WGMMA_ACC32(d)                                                                                    \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define QVL_WGMMA_D32                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
// O[64 x 64] += P[64 x 16] (registers) · V[16 x 64] (shared memory, N-major), in BF16 or (kF16) in
// f16.
#define QVL_WGMMA_O(TYPES)                                              \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                          \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " " QVL_WGMMA_D32 \
  "{%32, %33, %34, %35}, "                                              \
  "%36, p, 1, 1, 1;\n}\n"
template <bool kF16 = false>
__device__ __forceinline__ void wgmma_o(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kF16)
    asm volatile(QVL_WGMMA_O("f16.f16")
                 : QVL_WGMMA_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
  else
    asm volatile(QVL_WGMMA_O("bf16.bf16")
                 : QVL_WGMMA_ACC32(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void keep(float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(v[i])::"memory");
}
template <int R>
__device__ __forceinline__ void keep(uint32_t (&v)[R][4]) {
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(v[i][j])::"memory");
}

// Shared-memory matrix descriptor of a tile in the 128-byte swizzle: leading byte offset 16,
// stride byte offset 1024 (8-row atoms), layout type 1 (SW128).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// TMA: the box at the given coordinates (innermost first) into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}

// 2^x on the special-function unit, subnormal results flushed to zero.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The online softmax of a consumer thread's two rows of an m64nN accumulator (NS = N / 2 floats:
// element i is row g + 8 ((i / 2) % 2) of the warp's 16, column 8 (i / 4) + 2 t + i % 2), as
// flash.cuh computes it: log2 domain, p = exp2(s · scale − m) by one FFMA and one EX2, m and l per
// row in fp32 (l partial over the thread's columns until finish()).
template <int NS>
struct RowSoftmax {
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  // One key tile: s becomes p in place; alpha rescales what O and l held before. When `masked`,
  // elements with !visible(i) count as -inf.
  template <class Visible>
  __device__ __forceinline__ void step(float (&s)[NS], float scale_log2, bool masked, Visible visible,
                                       float (&alpha)[2]) {
    if (masked) {
#pragma unroll
      for (int i = 0; i < NS; ++i) s[i] = visible(i) ? s[i] : -INFINITY;
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < NS; ++i) mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
    float neg_base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r] * scale_log2);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with no visible key yet: all p = 0
      alpha[r] = ex2(m[r] - base);
      m[r] = m_new;
      neg_base[r] = -base;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      s[i] = ex2(fmaf(s[i], scale_log2, neg_base[(i >> 1) & 1]));
      l[(i >> 1) & 1] += s[i];
    }
  }
  // P as the register A operand of P·V, rounded to BF16 (kF16: to f16): the accumulator layout of
  // two 8-column tiles is the A layout of one 16-key step (elements 8 kk .. 8 kk + 7).
  template <bool kF16 = false>
  __device__ __forceinline__ static void pack(const float (&s)[NS], uint32_t (&pk)[NS / 8][4]) {
    auto two = [](float lo, float hi) { return kF16 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi); };
#pragma unroll
    for (int kk = 0; kk < NS / 8; ++kk) {
      pk[kk][0] = two(s[8 * kk + 0], s[8 * kk + 1]);
      pk[kk][1] = two(s[8 * kk + 2], s[8 * kk + 3]);
      pk[kk][2] = two(s[8 * kk + 4], s[8 * kk + 5]);
      pk[kk][3] = two(s[8 * kk + 6], s[8 * kk + 7]);
    }
  }
  // The row sums over the 4 threads of a row; then 1 / l (0 for a row that saw no key).
  __device__ __forceinline__ void finish(float (&inv)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    }
  }
};

// The block's mbarriers, bars[0]: Q has landed; bars[1 + s]: stage s (K and V) has landed;
// bars[1 + stages + s]: all `consumer_warps` are done with stage s. Thread 0 initialises them;
// the whole block meets before anyone uses them.
__device__ __forceinline__ void init_ring(uint64_t* bars, int stages, int consumer_warps) {
  if (threadIdx.x == 0) {
    mbar_init(&bars[0], 1);
    for (int s = 0; s < stages; ++s) {
      mbar_init(&bars[1 + s], 1);
      mbar_init(&bars[1 + stages + s], consumer_warps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
}

// A consumer warp is done with a stage: one arrival per warp on its empty barrier.
__device__ __forceinline__ void release_stage(uint64_t* empty) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbar_arrive(empty);
}

// A consumer warpgroup's loop over `tiles` key tiles of a kStages ring (full / empty mbarriers),
// with FA3's intra-warpgroup overlap: per tile j >= 1, issue S = Q·K_jᵀ and O += P_{j-1}·V_{j-1},
// wait for S, softmax (the tensor cores run P·V meanwhile), wait for P·V, release the stage of
// tile j - 1, rescale O, pack P; then the last P·V. issue_s(stage) and issue_o(stage) issue and
// commit one group each; softmax(j, alpha) runs RowSoftmax::step on s. O is NO accumulators of
// an m64n64 output; P goes to pk in BF16 (kF16: f16). Every consumer warp of the block runs it
// over the same tiles.
template <int kStages, bool kF16 = false, int NS, int NO, class IssueS, class IssueO, class Softmax>
__device__ __forceinline__ void consumer_loop(int tiles, uint64_t* full, uint64_t* empty, float (&s)[NS],
                                              float (&o)[NO][32], uint32_t (&pk)[NS / 8][4], IssueS issue_s,
                                              IssueO issue_o, Softmax softmax) {
  auto keep_o = [&] {
#pragma unroll
    for (int n = 0; n < NO; ++n) keep(o[n]);
  };
  mbar_wait(&full[0], 0);
  wgmma_fence();
  issue_s(0);
  wgmma_wait<0>();
  keep(s);
  {
    float alpha[2];
    softmax(0, alpha);
  }
  RowSoftmax<NS>::template pack<kF16>(s, pk);
  for (int j = 1; j < tiles; ++j) {
    const int st = j % kStages, prev = (j - 1) % kStages;
    mbar_wait(&full[st], (j / kStages) & 1);
    keep_o();
    wgmma_fence();
    issue_s(st);
    issue_o(prev);
    wgmma_wait<1>();
    keep(s);
    float alpha[2];
    softmax(j, alpha);
    wgmma_wait<0>();
    keep_o();
    keep(pk);
    release_stage(&empty[prev]);
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[n][i] *= alpha[(i >> 1) & 1];
    RowSoftmax<NS>::template pack<kF16>(s, pk);
  }
}

// The last tile's P·V (after consumer_loop, and whatever the kernel does to the last stage first).
template <int kStages, int NO, int NP, class IssueO>
__device__ __forceinline__ void consumer_last(int tiles, uint64_t* empty, float (&o)[NO][32], uint32_t (&pk)[NP][4],
                                              IssueO issue_o) {
#pragma unroll
  for (int n = 0; n < NO; ++n) keep(o[n]);
  wgmma_fence();
  issue_o((tiles - 1) % kStages);
  wgmma_wait<0>();
#pragma unroll
  for (int n = 0; n < NO; ++n) keep(o[n]);
  keep(pk);
  release_stage(&empty[(tiles - 1) % kStages]);
}

// Row r (0 or 1: g or g + 8) of an m64n64 O accumulator times inv, as BF16 to out (the row's
// 64 columns; this thread writes columns 8 i + 2 t, + 1).
__device__ __forceinline__ void store_o_row(bf16* out, const float (&o)[32], int r, float inv) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < 8; ++i)
    *reinterpret_cast<bf162*>(out + 8 * i + 2 * t) =
        __floats2bfloat162_rn(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Host side (wgmma.cu, built with the kernels): a BF16 tensor map in the 128-byte swizzle of
// `rank` dimensions (dims and box innermost first, strides in bytes for dims 1..rank-1), made by
// cuTensorMapEncodeTiled (looked up once through cudaGetDriverEntryPoint: qvl starts without
// libcuda). False if it cannot be made: the caller falls back to its mma.sync kernel, and the
// first failure of the process is logged, naming `what`.
bool encode_sw128(CUtensorMap* map, int rank, void* base, const cuuint64_t* dims, const cuuint64_t* strides,
                  const cuuint32_t* box, const char* what);
// The same, in the 128-byte swizzle where `sw128`, else unswizzled (rows of the box packed).
bool encode_bf16_tiles(CUtensorMap* map, int rank, void* base, const cuuint64_t* dims, const cuuint64_t* strides,
                       const cuuint32_t* box, bool sw128, const char* what);

}  // namespace qvl::cuda::wgmma
