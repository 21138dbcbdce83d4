// W8A16 GEMM for FP8 Linears over many rows (prefill) on sm_90: the E4M3 weights are widened to
// BF16 in registers and multiplied by the activations with warpgroup MMA, so the weights are read
// once as FP8 instead of being dequantised into a BF16 copy first (CudaFp8Gemm::kDequant writes
// and reads back 2 bytes per weight: 4.4 of 4B FP8's 25 ms to first token on an H100).
//
// Row-major view: D[n, 0:m] = X[n, K] · bf16(W8[m, K] ⊙ scale)ᵀ + bias[m] + C[n, 0:m], where
// every weight becomes bf16(float(w8) · s) of its 128x128 block's scale, as the dequantising
// kernel computes it; the products and sums are fp32 (only the summation order differs from
// the dequantised BF16 GEMM).
//
// A block of two warpgroups owns 128 weight rows (the MMA's M: 64 per warpgroup; one scale row)
// and BN rows of X (the MMA's N), so the MMA computes Dᵀ = W · Xᵀ: W is the A operand, from
// registers, and X the B operand, K-major in shared memory (X's rows as they are, in the
// 128-byte swizzle). K runs in tiles of 64 through a ring of kStages shared-memory stages filled
// by cp.async. Each thread widens its own A fragments from the stage's W rows: for a 16-column
// step, rows g and g + 8 of its warp's 16, columns 2t, 2t + 1 and 2t + 8, 2t + 9 (the mma.m16n8k16
// A layout, which wgmma's register A follows per warp); a prmt picks the thread's two bytes and
// replicates their signs, and shifts and masks place each byte's exponent and mantissa into an
// fp32 whose value is e4m3 · 2^-120 (subnormals included), which the scale times 2^120 turns
// into float(w8) · s with one rounding. The next tile is widened while the current tile's MMAs
// run.
//
// Needs sm_90a (wgmma): this file is compiled for it where the build has sm_90; the host asks
// w8a16_available() first. Shapes: m % 128 == 0, K % 128 == 0, 128-row x 128-column scale
// blocks, 16-byte aligned X / W, X rows of exactly K elements.
#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda {
namespace {

constexpr int kBM = 128;     // weight rows per block (two warpgroups of 64)
constexpr int kBK = 64;      // K per stage: one 128-byte swizzle row of BF16 X
constexpr int kStages = 4;
constexpr int kThreads = 256;
constexpr int kWPitch = 80;  // bytes per W row in a stage: 64 + 16 makes the 16-byte reads of 8 rows conflict-free

template <int BN>
constexpr int x_stage_bytes() {
  return BN * 128;  // a multiple of 1024: every stage's X starts on a swizzle atom
}
constexpr int w_stage_bytes() {
  return kBM * kWPitch;  // 10240, a multiple of 1024
}
template <int BN>
constexpr int stage_bytes() {
  return x_stage_bytes<BN>() + w_stage_bytes();
}
template <int BN>
constexpr size_t smem_bytes() {
  return static_cast<size_t>(kStages) * stage_bytes<BN>() + 1024;  // + alignment of the first stage to 1024
}

struct W8a16Params {
  bf16* d;
  const bf16* c;  // residual (may alias d) or null
  const bf16* x;
  const uint8_t* w;
  const float* scales;  // [m / 128][scale_ld]
  const bf16* bias;     // [m] or null
  int64_t ldd;
  int m, n, k, scale_ld;
};

// D[64 x 128] (+)= A[64 x 16] (registers, BF16) . B[16 x 128] (shared memory, K-major BF16).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{" 
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  __trap();
#endif
}

// D[64 x 256] (+)= A[64 x 16] (registers, BF16) . B[16 x 256] (shared memory, K-major BF16).
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{" 
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Shared-memory writes of this thread (cp.async) become visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void keep_f(float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(v[i])::"memory");
}
__device__ __forceinline__ void keep_u(uint32_t (&v)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(v[i][j])::"memory");
}

// Shared-memory matrix descriptor of a K-major BF16 tile in the 128-byte swizzle: rows of 128
// bytes, 8-row atoms 1024 bytes apart (stride byte offset), start address advanced 32 bytes per
// 16-column step inside the atom.
__device__ __forceinline__ uint64_t kmajor_sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// Bytes 2t, 2t + 1 of the 8 in (lo, hi) -> bf16x2 of float(e4m3) · s (s120 = s · 2^120).
__device__ __forceinline__ uint32_t widen_pair(uint32_t lo, uint32_t hi, uint32_t sel, float s120) {
  uint32_t a;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(a) : "r"(lo), "r"(hi), "r"(sel));  // [b0, sign b0, b1, sign b1]
  const float f0 = __uint_as_float((a << 20) & 0x87f00000u) * s120;
  const float f1 = __uint_as_float((a << 4) & 0x87f00000u) * s120;
  const bf162 v = __floats2bfloat162_rn(f0, f1);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int BN>
__device__ __forceinline__ void wgmma_step(float (&d)[BN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (BN == 128)
    wgmma_m64n128k16_rs(d, a, desc, 1);
  else
    wgmma_m64n256k16_rs(d, a, desc, 1);
}

template <int BN>
__global__ void __launch_bounds__(kThreads, BN == 128 ? 2 : 1) w8a16_kernel(const __grid_constant__ W8a16Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = static_cast<int>(blockIdx.x) * BN, m0 = static_cast<int>(blockIdx.y) * kBM;
  const int tiles = p.k / kBK;
  const uint8_t* wsrc = p.w + static_cast<int64_t>(m0) * p.k;
  auto xs = [&](int s) { return smem + s * stage_bytes<BN>(); };
  auto ws = [&](int s) { return smem + s * stage_bytes<BN>() + x_stage_bytes<BN>(); };
  auto load_w = [&](int kt) {
    uint8_t* dst = ws(kt % kStages);
    const uint8_t* src = wsrc + kt * kBK;
#pragma unroll
    for (int i = tid; i < kBM * 4; i += kThreads) {
      const int r = i >> 2, c = i & 3;
      cp_async16(dst + r * kWPitch + c * 16, src + static_cast<int64_t>(r) * p.k + c * 16);
    }
  };
  auto load_x = [&](int kt) {
    uint8_t* dst = xs(kt % kStages);
#pragma unroll
    for (int i = tid; i < BN * 8; i += kThreads) {
      const int r = i >> 3, c = i & 7;
      const bool ok = n0 + r < p.n;
      const bf16* src = p.x + static_cast<int64_t>(ok ? n0 + r : 0) * p.k + kt * kBK + c * 8;
      cp_async16(dst + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
  };

  // The weights do not depend on the previous kernel: their first stages go before the wait.
  for (int s = 0; s < kStages - 1; ++s)
    if (s < tiles) load_w(s);
  grid_dep_wait();
  grid_dep_launch();
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) load_x(s);
    cp_async_commit();
  }

  const int row = (warp >> 2) * 64 + (warp & 3) * 16 + g;  // this thread's A rows: row, row + 8
  const uint32_t sel = (2u * t) | ((8u | 2u * t) << 4) | ((2u * t + 1) << 8) | ((8u | (2u * t + 1)) << 12);
  const float* srow = p.scales + static_cast<int64_t>(blockIdx.y) * p.scale_ld;
  auto widen = [&](int kt, uint32_t(&a)[4][4]) {
    const uint8_t* w = ws(kt % kStages);
    const float s120 = __ldg(srow + (kt * kBK) / 128) * 0x1p120f;
#pragma unroll
    for (int st = 0; st < 4; ++st) {
      const uint4 lo = *reinterpret_cast<const uint4*>(w + row * kWPitch + st * 16);
      const uint4 hi = *reinterpret_cast<const uint4*>(w + (row + 8) * kWPitch + st * 16);
      a[st][0] = widen_pair(lo.x, lo.y, sel, s120);
      a[st][1] = widen_pair(hi.x, hi.y, sel, s120);
      a[st][2] = widen_pair(lo.z, lo.w, sel, s120);
      a[st][3] = widen_pair(hi.z, hi.w, sel, s120);
    }
  };

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;
  uint32_t a0[4][4], a1[4][4];
  cp_async_wait<kStages - 2>();
  fence_proxy_async_shared();
  __syncthreads();
  widen(0, a0);
  // One K tile: its MMAs on a (widened before) join the previous tile's in the tensor pipe; once
  // the previous tile's are done (its stage and its A registers b are free), the next stage's
  // wait, the refill of the previous tile's stage and the next tile's widening into b run while
  // this tile's MMAs do.
  auto step = [&](int kt, uint32_t(&a)[4][4], uint32_t(&b)[4][4]) {
    const uint32_t xa = smem_u32(xs(kt % kStages));
    keep_f(acc);
    wgmma_fence();
#pragma unroll
    for (int st = 0; st < 4; ++st) wgmma_step<BN>(acc, a[st], kmajor_sw128_desc(xa + st * 32));
    wgmma_commit();
    wgmma_wait<1>();
    keep_u(b);
    cp_async_wait<kStages - 3>();
    fence_proxy_async_shared();
    __syncthreads();  // tile kt + 1 is in for every thread; every warpgroup is done with tile kt - 1
    if (kt + kStages - 1 < tiles) {
      load_w(kt + kStages - 1);
      load_x(kt + kStages - 1);
    }
    cp_async_commit();
    if (kt + 1 < tiles) widen(kt + 1, b);
  };
  for (int kt = 0; kt < tiles; kt += 2) {
    step(kt, a0, a1);
    if (kt + 1 < tiles) step(kt + 1, a1, a0);
  }
  wgmma_wait<0>();
  keep_u(a0);
  keep_u(a1);
  keep_f(acc);

  // acc[4j + e]: weight row m0 + row + (e >> 1) * 8, X row n0 + 8j + 2t + (e & 1).
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int nr = n0 + 8 * j + 2 * t + (e & 1);
      const int mr = m0 + row + (e >> 1) * 8;
      if (nr >= p.n) continue;
      float v = acc[4 * j + e];
      if (p.bias) v += __bfloat162float(p.bias[mr]);
      const int64_t o = static_cast<int64_t>(nr) * p.ldd + mr;
      if (p.c) v += __bfloat162float(p.c[o]);
      p.d[o] = __float2bfloat16_rn(v);
    }
  }
#endif
}

template <int BN>
void run(const LaunchContext& ctx, const W8a16Params& prm) {
  static bool configured = false;  // one device per process in qvl; the attribute is per function
  if (!configured) {
    QVL_CUDA_CHECK(cudaFuncSetAttribute(w8a16_kernel<BN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem_bytes<BN>())));
    configured = true;
  }
  launch(ctx, "w8a16_gemm", w8a16_kernel<BN>, dim3(ceil_div(prm.n, BN), static_cast<unsigned>(prm.m / kBM)),
         dim3(kThreads), smem_bytes<BN>(), prm);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool w8a16_available(int compute_capability) {
#if defined(QVL_W8A16_SM90A)
  return compute_capability == 90;
#else
  (void)compute_capability;
  return false;
#endif
}

bool w8a16_linear(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, const Tensor& scale,
                  int rows_per_scale, int block, const void* bias, const void* residual, int bn) {
  const int64_t n = x.dim(0), k = weight.dim(1), m = weight.dim(0);
  if (!w8a16_available(ctx.compute_capability) || block != 128 || rows_per_scale != 128 || m % kBM != 0 ||
      k % 128 != 0 || x.row_numel() != k || out.row_numel() != m || scale.dim(1) * 128 < k ||
      !aligned16(x.data) || !aligned16(weight.data) || n > INT32_MAX || m > INT32_MAX || k > INT32_MAX)
    return false;
  W8a16Params prm{};
  prm.d = out.as<bf16>();
  prm.c = static_cast<const bf16*>(residual);
  prm.x = x.as<const bf16>();
  prm.w = static_cast<const uint8_t*>(weight.data);
  prm.scales = scale.as<const float>();
  prm.bias = static_cast<const bf16*>(bias);
  prm.ldd = m;
  prm.m = static_cast<int>(m);
  prm.n = static_cast<int>(n);
  prm.k = static_cast<int>(k);
  prm.scale_ld = static_cast<int>(scale.dim(1));
  if (bn == 0) {  // the width with the fewer padded rows per wave of blocks
    const int64_t sms = std::max(1, ctx.num_sms), tiles_m = m / kBM;
    auto cost = [&](int64_t w) { return (ceil_div(n, w) * tiles_m + sms - 1) / sms * w; };
    bn = cost(256) < cost(128) ? 256 : 128;
  }
  if (bn == 256)
    run<256>(ctx, prm);
  else
    run<128>(ctx, prm);
  return true;
}

}  // namespace qvl::cuda
