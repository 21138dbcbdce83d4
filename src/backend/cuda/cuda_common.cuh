// Shared by the CUDA backend's sources (never included outside src/backend/cuda/): error
// checks, BF16/FP8 helpers, warp reductions, and the launch helper that enables programmatic
// dependent launch (PDL) on sm_90+.
//
// PDL contract, kept by every kernel launched through launch(): the kernel calls
// grid_dep_wait() before it reads anything an earlier kernel wrote and before it writes
// anything (an earlier kernel may still be reading it); only reads of memory no kernel writes
// (weights) may come before. grid_dep_launch() right after the wait lets the next kernel's
// blocks be scheduled as this one's last wave runs. On architectures without PDL both are no-ops.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "backend/cuda/kernels.h"
#include "core/check.h"

namespace qvl::cuda {

// A failed CUDA runtime call is a broken device or a bug: it throws CheckFailure with the call,
// the error name and its description.
#define QVL_CUDA_CHECK(expr)                                                                                     \
  do {                                                                                                           \
    cudaError_t qvl_cuda_err_ = (expr);                                                                          \
    QVL_CHECK(qvl_cuda_err_ == cudaSuccess)                                                                      \
        << #expr << ": " << cudaGetErrorName(qvl_cuda_err_) << " (" << cudaGetErrorString(qvl_cuda_err_) << ")"; \
  } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define QVL_CUDA_CHECK_LAUNCH(what) QVL_CUDA_CHECK_NAMED(cudaGetLastError(), what)
#define QVL_CUDA_CHECK_NAMED(expr, what)                                                                          \
  do {                                                                                                            \
    cudaError_t qvl_cuda_err_ = (expr);                                                                           \
    QVL_CHECK(qvl_cuda_err_ == cudaSuccess)                                                                       \
        << (what) << ": " << cudaGetErrorName(qvl_cuda_err_) << " (" << cudaGetErrorString(qvl_cuda_err_) << ")"; \
  } while (0)

using bf16 = __nv_bfloat16;
using bf162 = __nv_bfloat162;

// ---- programmatic dependent launch ----
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, ctx.stream>>>(args...) with the PDL attribute when
// enabled, in clusters of `cluster_x` consecutive blocks along x when cluster_x > 1 (needs
// ctx.clusters and grid.x a multiple of cluster_x), and checks the launch.
template <typename... KArgs, typename... Args>
void launch_clustered(const LaunchContext& ctx, const char* name, unsigned cluster_x, void (*kernel)(KArgs...),
                      dim3 grid, dim3 block, size_t smem, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || (ctx.skip && skip_launch(*ctx.skip, name, grid.x))) return;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = ctx.stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (ctx.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    QVL_CHECK(ctx.clusters) << name << ": clusters of " << cluster_x << " blocks on a device without clusters";
    QVL_CHECK_EQ(grid.x % cluster_x, 0u) << name;
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = n > 0 ? attr : nullptr;
  cfg.numAttrs = n;
  if (ctx.emulated_smem > 0)
    cfg.dynamicSmemBytes = check_emulated_launch(ctx, name, reinterpret_cast<const void*>(kernel), smem, cluster_x,
                                                 block.x * block.y * block.z);
  if (ctx.profiler) ctx.profiler->before(name);
  QVL_CUDA_CHECK_NAMED(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...), name);
  if (ctx.profiler) ctx.profiler->after();
}

template <typename... KArgs, typename... Args>
void launch(const LaunchContext& ctx, const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
            Args&&... args) {
  launch_clustered(ctx, name, 1, kernel, grid, block, smem, std::forward<Args>(args)...);
}

// ---- thread-block cluster primitives ----
// sm_90+; the kernels that use them are never launched below, and compile to nothing there
// (flash.cuh flash_kernel, attention_decode.cu).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
inline constexpr bool kDeviceHasClusters = false;
#else
inline constexpr bool kDeviceHasClusters = true;
#endif
// Every thread of every block of the cluster arrives; shared-memory writes before it are
// visible to the cluster's reads after it (release / acquire). Not .aligned: threads may reach
// it from divergent paths (the merge loop's early exit).
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}
// The two halves of a cluster barrier, for a barrier whose arrival and wait are apart: every
// thread of the cluster arrives (relaxed: no ordering of its memory accesses), and each thread
// then waits before it relies on the others' arrival (e.g. on their having started, before it
// first touches their shared memory).
__device__ __forceinline__ void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#endif
}
// ---- shared-memory and tensor-core primitives (sm_80+) ----
// A shared-memory address in the shared window (32-bit), as PTX's shared-space operands take it.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// ---- mbarriers and bulk copies (sm_90+; empty elsewhere, where the kernels that use them are
// compiled out): decode_stack.cu's weight ring and skinny_ring.cu ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QVL_SM90(...) __VA_ARGS__
#else
#define QVL_SM90(...)
#endif
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  QVL_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)));
}
// After mbar_init: the barriers' initialisation, visible to the cluster and to the bulk copies
// and TMA loads that complete on them (the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
  QVL_SM90(asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory"));
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  QVL_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                        : "memory"));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  QVL_SM90(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory"));
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  QVL_SM90(
      asm volatile("{\n"
                   ".reg .pred p;\n"
                   "WAIT_%=:\n"
                   "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                   "@!p bra WAIT_%=;\n"
                   "}\n" ::"r"(smem_u32(bar)),
                   "r"(parity)
                   : "memory"));
}
// Global -> shared bulk copy completing on `bar` (bytes and addresses multiples of 16).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  QVL_SM90(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory"));
}
// The same for data read once: L2 evict-first.
__device__ __forceinline__ void bulk_load_evict_first(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  QVL_SM90(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(0x12F0000000000000ull)
      : "memory"));
}
// 16 bytes global -> shared without registers (cp.async, sm_80+; a plain copy below), complete
// for this thread after cp_async_wait_all (then a block barrier before other threads read them).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
#else
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
// The same with zero fill where !valid (src is not read), in commit groups: the kernels that
// use these are built for sm_80+.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (cp.async.ca; both 4-byte aligned), in the same commit groups.
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_u32(p)));
}
// d += a (16 x 16 BF16, row) · b (16 x 8 BF16, col) in fp32: mma.m16n8k16.
template <bool kF16 = false>  // BF16 operands, or (kF16) f16
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kF16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory transport between the blocks of a cluster (sm_90), for merges that push rather
// than pull: 4-byte stores into a peer block's shared memory that count their bytes on an
// mbarrier there (st.async), so that the receiver waits on its own barrier for exactly what it
// expects instead of the whole cluster meeting at a barrier. Addresses are shared-window (32-bit).
// The same shared-memory address in block `rank` of this cluster.
__device__ __forceinline__ uint32_t cluster_peer_smem(uint32_t local, unsigned rank) {
  uint32_t out = local;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(local), "r"(rank));
#endif
  return out;
}
__device__ __forceinline__ void st_async_f32(uint32_t remote, float v, uint32_t remote_bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(remote),
               "r"(__float_as_uint(v)), "r"(remote_bar)
               : "memory");
#endif
}
// Four consecutive floats (16-byte aligned at both ends) in one st.async.
__device__ __forceinline__ void st_async_f32x4(uint32_t remote, float4 v, uint32_t remote_bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(remote),
      "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)), "r"(__float_as_uint(v.w)),
      "r"(remote_bar)
      : "memory");
#endif
}
// Initialises a one-arrival mbarrier for the cluster's st.async. Peers may store to it once a
// cluster barrier phase that this thread arrives at afterwards has completed.
__device__ __forceinline__ void mbar_init_cluster(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;\n" ::"r"(smem_u32(bar))
               : "memory");
#endif
}
// The barrier's one arrival, which also expects `bytes` of st.async.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
#endif
}
// Waits for the barrier's first phase (acquire at cluster scope: the peers' stores are visible).
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n\t.reg .pred p;\n"
      "WAIT_%=:\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], 0;\n\t"
      "@!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar))
      : "memory");
#endif
}
// The generic address of the same shared-memory location in block `rank` of this cluster.
__device__ __forceinline__ const float* cluster_peer(const float* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;\n" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
  return reinterpret_cast<const float*>(out);
#else
  return p;
#endif
}

// ---- numeric helpers ----
__device__ __forceinline__ float bf16_round(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// 8 bf16 in one 16-byte vector.
struct alignas(16) Bf16x8 {
  bf162 h[4];
};

// N BF16 in a vector of N * 2 bytes (uint2: 4, uint4: 8) to and from floats, round to nearest.
template <int N, class Vec>
__device__ __forceinline__ void unpack_bf16(const Vec& v, float (&f)[N]) {
  static_assert(sizeof(Vec) == 2 * N, "N BF16");
  const bf162* h = reinterpret_cast<const bf162*>(&v);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    float2 p = __bfloat1622float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
template <class Vec, int N>
__device__ __forceinline__ Vec pack_bf16(const float (&f)[N]) {
  static_assert(sizeof(Vec) == 2 * N, "N BF16");
  Vec v;
  bf162* h = reinterpret_cast<bf162*>(&v);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}
__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  unpack_bf16<8>(v, f);
}
__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  return pack_bf16<uint4>(f);
}

// FP8 E4M3 (torch.float8_e4m3fn) -> float, exact: the 7 magnitude bits placed into a float's
// exponent/mantissa and rescaled by 2^120 (which also handles subnormals). 0x7f/0xff (NaN)
// never occur in quantised weights or in the saturated KV cache and decode as 480.
__device__ __forceinline__ float fp8_e4m3_to_float_dev(uint8_t b) {
  const float f = __uint_as_float(static_cast<uint32_t>(b & 0x7f) << 20) * 0x1p120f;
  return (b & 0x80) ? -f : f;
}
// 4 FP8 E4M3 values (a word) widened exactly to 4 f16 (two words, in order): E4M3 lies inside
// f16's range. One conversion a pair on sm_89+. Before it, a rescaling: one byte permute puts a
// pair's bytes at the top of their halves ([b_hi 0 b_lo 0]; 0x1404 picks bytes 0 and 1, 0x3424
// bytes 2 and 3, a nibble 4 reading a zero byte), the sign stays at bit 15, the 7 magnitude bits
// move one place down under f16's exponent, and one f16x2 multiplication by 2^8 rescales them
// exactly, subnormals included.
__device__ __forceinline__ void fp8x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
#else
  auto pair = [w](uint32_t sel) {
    const uint32_t u = __byte_perm(w, 0u, sel);
    uint32_t bits = (u & 0x80008000u) | ((u & 0x7f007f00u) >> 1);
    const __half2 k = __halves2half2(__ushort_as_half(0x5c00), __ushort_as_half(0x5c00));  // 2^8
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&bits), k);
    return *reinterpret_cast<const uint32_t*>(&v);
  };
  lo = pair(0x1404u);
  hi = pair(0x3424u);
#endif
}
__device__ __forceinline__ uint4 fp8x8_to_f16x8(uint2 raw) {
  uint4 r;
  fp8x4_to_f16x4(raw.x, r.x, r.y);
  fp8x4_to_f16x4(raw.y, r.z, r.w);
  return r;
}
// Two floats rounded to a BF16 pair / an f16 pair (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  bf162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// A BF16 pair to an f16 pair: exact in f16's normal range, saturated at ±65504 beyond it (q of
// the attentions that read an FP8 cache in f16).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w) {
  const float lo = fminf(fmaxf(__uint_as_float(w << 16), -65504.0f), 65504.0f);
  const float hi = fminf(fmaxf(__uint_as_float(w & 0xffff0000u), -65504.0f), 65504.0f);
  return pack_f16x2(lo, hi);
}
// float -> FP8 E4M3, round to nearest even, saturating at +-448 (the KV cache's conversion).
__device__ __forceinline__ uint8_t float_to_fp8_e4m3_dev(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float gelu_tanh(float z) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * z * (1.0f + tanhf(k * (z + 0.044715f * z * z * z)));
}
__device__ __forceinline__ float gelu_erf(float z) {
  return 0.5f * z * (1.0f + erff(z * 0.7071067811865476f));
}
__device__ __forceinline__ float silu(float z) {
  return z / (1.0f + expf(-z));
}

inline unsigned ceil_div(int64_t a, int64_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

}  // namespace qvl::cuda
