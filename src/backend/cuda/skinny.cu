// Linear for few rows (decode: 1..32 tokens): out[n, N] = epilogue(x[n, K] · W[N, K]ᵀ).
// Memory-bound: every weight byte is read exactly once, so the kernel is built around the
// weight stream and the tensor cores only do the (cheap) arithmetic.
//
// Layout ("swap AB"): a block owns 16 weight rows and all n tokens; its 8 warps split K into
// 128-wide chunks (warp w takes chunks w, w+8, ...), and each warp runs mma.m16n8k16 with the
// 16 weight rows as A and up to 4 tiles of 8 tokens as B. K is permuted inside each 16-wide
// k-step so that both operands come straight from 16-byte global loads with no shuffles: lane
// (g = lane/4, t = lane%4) loads 8 consecutive BF16 (16 consecutive FP8) of weight rows g and
// g+8 and of token g, and the A/B fragment slots {2t, 2t+1, 2t+8, 2t+9} are filled from
// consecutive physical columns. Because A and B use the same permutation, the dot products
// are unchanged. The next chunk's weights are loaded while the current one is multiplied.
//
// FP8 weights are widened to BF16 in registers exactly (e4m3 bits placed into bf16, times
// 2^120 in bf16, which keeps subnormals exact); each 128-wide chunk is one scale block along
// K, so its partial sum is multiplied by the block scale in fp32 before it joins the total.
// The 8 warps' partials meet in shared memory; the epilogue rounds like the reference:
// v = bf16(acc + bias); v = bf16(act(v)); v = bf16(residual + v).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;
constexpr int kChunk = 128;

__device__ __forceinline__ uint4 load16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
// Weights are read once: keep them out of L1.
__device__ __forceinline__ uint4 load16_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

struct SkinnyParams {
  const void* w;       // [N, K] bf16 or fp8
  const float* scale;  // fp8: [*, scale_cols] dequantisation multipliers
  int scale_cols;
  int rows_per_scale;    // 128 (block scales) or 1 (one scale row per weight row)
  const bf16* x;         // [n, K]
  bf16* out;             // [n, N]
  const bf16* bias;      // [N] or null
  const bf16* residual;  // [n, N] or null (may alias out)
  int n, N, K;
  int act;
  // Prologue (kRmsNorm / kSiluMul): x is computed from src; x above is where it is written.
  const bf16* src;
  bf16* x_out;  // = x, writable: where the prologue's result is written
  const void* norm_w;
  bool norm_w_f32;
  float eps;
};

// Shared state of the prologues: 1/rms of each row for kRmsNorm.
struct PrologueSmem {
  float rstd[kFusedPrologueMaxRows];
};

// 8 consecutive x values of token `tok` at column k (k % 8 == 0, in range), as 4 bf16x2.
template <int PRO>
__device__ __forceinline__ uint4 load_x8(const SkinnyParams& p, int tok, int k, const PrologueSmem& ps) {
  if constexpr (PRO == SkinnyPrologue::kNone) {
    return load16(p.x + static_cast<int64_t>(tok) * p.K + k);
  } else if constexpr (PRO == SkinnyPrologue::kRmsNorm) {
    // out = bf16(w * bf16(x * rstd)), as rms_norm writes it
    float v[8], w[8];
    unpack8(load16(p.src + static_cast<int64_t>(tok) * p.K + k), v);
    if (p.norm_w_f32) {
      const float4 a = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.norm_w) + k));
      const float4 b = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.norm_w) + k + 4));
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
    } else {
      unpack8(load16(static_cast<const bf16*>(p.norm_w) + k), w);
    }
    const float r = ps.rstd[tok];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = w[e] * bf16_round(v[e] * r);
    return pack8(v);
  } else {
    // out = bf16(bf16(silu(g)) * u), as silu_mul writes it
    float g[8], u[8];
    const bf16* row = p.src + static_cast<int64_t>(tok) * 2 * p.K;
    unpack8(load16(row + k), g);
    unpack8(load16(row + p.K + k), u);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = bf16_round(silu(g[e])) * u[e];
    return pack8(g);
  }
}

// Runs after grid_dep_wait: computes the prologue's per-row state and writes this block's
// share of x (blocks split the n*K/8 vectors evenly), so x ends up fully written.
template <int PRO>
__device__ __forceinline__ void run_prologue(const SkinnyParams& p, PrologueSmem& ps) {
  if constexpr (PRO != SkinnyPrologue::kNone) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if constexpr (PRO == SkinnyPrologue::kRmsNorm) {
      for (int tok = warp; tok < p.n; tok += kWarps) {
        const uint4* row = reinterpret_cast<const uint4*>(p.src + static_cast<int64_t>(tok) * p.K);
        float ss = 0.0f;
        for (int v = lane; v < p.K / 8; v += 32) {
          float f[8];
          unpack8(load16(row + v), f);
#pragma unroll
          for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
        }
        ss = warp_sum(ss);
        if (lane == 0) ps.rstd[tok] = rsqrtf(ss / static_cast<float>(p.K) + p.eps);
      }
    }
    __syncthreads();
    const int64_t vecs = static_cast<int64_t>(p.n) * (p.K / 8);
    const int64_t per = (vecs + gridDim.x - 1) / gridDim.x;
    const int64_t v0 = per * blockIdx.x, v1 = min(vecs, v0 + per);
    for (int64_t v = v0 + threadIdx.x; v < v1; v += blockDim.x) {
      const int tok = static_cast<int>(v / (p.K / 8)), k = static_cast<int>(v % (p.K / 8)) * 8;
      reinterpret_cast<uint4*>(p.x_out + static_cast<int64_t>(tok) * p.K)[k / 8] = load_x8<PRO>(p, tok, k, ps);
    }
  }
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Two e4m3 bytes (selected by `sel` from w) -> one bf16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t w, uint32_t sel) {
  const uint32_t a = __byte_perm(w, 0u, sel);  // [0, b_lo, 0, b_hi]: each byte in a half's high byte
  const uint32_t bits = ((a & 0x7f007f00u) >> 4) | (a & 0x80008000u);  // e4m3 value * 2^-120, as bf16
  const bf162 scaled = __hmul2(*reinterpret_cast<const bf162*>(&bits), __floats2bfloat162_rn(0x1p120f, 0x1p120f));
  return *reinterpret_cast<const uint32_t*>(&scaled);
}

template <bool kFp8>
struct Chunk {
  static constexpr int kElems = kFp8 ? 16 : 8;          // elements per 16-byte load
  static constexpr int kSteps = kChunk / (4 * kElems);  // loads per row per chunk (4 lanes per row)
};

// Loads the lane's weights of chunk c: w[2s] = row a, w[2s+1] = row b, for step s.
template <bool kFp8>
__device__ __forceinline__ void load_weights(const SkinnyParams& p, int c, int ra, int rb, int t,
                                             uint4 (&w)[2 * Chunk<kFp8>::kSteps]) {
  constexpr int E = Chunk<kFp8>::kElems;
  const char* base = static_cast<const char*>(p.w);
  const int esize = kFp8 ? 1 : 2;
#pragma unroll
  for (int s = 0; s < Chunk<kFp8>::kSteps; ++s) {
    const int k = c * kChunk + s * 4 * E + t * E;
    if (k < p.K) {
      w[2 * s] = load16_stream(base + (static_cast<int64_t>(ra) * p.K + k) * esize);
      w[2 * s + 1] = load16_stream(base + (static_cast<int64_t>(rb) * p.K + k) * esize);
    } else {
      w[2 * s] = make_uint4(0, 0, 0, 0);
      w[2 * s + 1] = make_uint4(0, 0, 0, 0);
    }
  }
}

template <bool kFp8, int NT, int PRO>
__global__ void __launch_bounds__(kWarps * 32, NT <= 2 ? 2 : 1) skinny_kernel(const SkinnyParams p) {
  using C = Chunk<kFp8>;
  constexpr int E = C::kElems;
  constexpr int S = C::kSteps;
  __shared__ float red[kWarps][kRows][NT * 8 + 1];
  __shared__ PrologueSmem pro_smem;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * kRows;
  // Rows past N re-read row N-1 (in bounds); their results are never stored.
  const int ra = min(row0 + g, p.N - 1), rb = min(row0 + g + 8, p.N - 1);
  const int nchunks = (p.K + kChunk - 1) / kChunk;

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  uint4 wcur[2 * S], wnext[2 * S];
  int c = warp;
  if (c < nchunks) load_weights<kFp8>(p, c, ra, rb, t, wcur);  // weights: safe before the wait
  grid_dep_wait();
  grid_dep_launch();
  run_prologue<PRO>(p, pro_smem);

  for (; c < nchunks; c += kWarps) {
    if (c + kWarps < nchunks) load_weights<kFp8>(p, c + kWarps, ra, rb, t, wnext);
    float part[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[j][e] = 0.0f;

#pragma unroll
    for (int s = 0; s < S; ++s) {
      const int k = c * kChunk + s * 4 * E + t * E;
      // Activations of this step: E consecutive columns of token 8j+g (zero past n or K).
      uint4 xv[NT][kFp8 ? 2 : 1];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int tok = j * 8 + g;
        const bool ok = tok < p.n && k < p.K;
        xv[j][0] = ok ? load_x8<PRO>(p, tok, k, pro_smem) : make_uint4(0, 0, 0, 0);
        if (kFp8) xv[j][kFp8 ? 1 : 0] = ok ? load_x8<PRO>(p, tok, k + 8, pro_smem) : make_uint4(0, 0, 0, 0);
      }
      if (kFp8) {
        uint32_t wa[8], wb[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          wa[2 * i] = e4m3x2_to_bf16x2(word(wcur[2 * s], i), 0x1404);
          wa[2 * i + 1] = e4m3x2_to_bf16x2(word(wcur[2 * s], i), 0x3424);
          wb[2 * i] = e4m3x2_to_bf16x2(word(wcur[2 * s + 1], i), 0x1404);
          wb[2 * i + 1] = e4m3x2_to_bf16x2(word(wcur[2 * s + 1], i), 0x3424);
        }
        // mma i covers physical columns 4i..4i+3 of the lane's 16.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint4& xq = xv[j][i >> 1];
            mma_bf16(part[j], wa[2 * i], wb[2 * i], wa[2 * i + 1], wb[2 * i + 1], word(xq, (i & 1) * 2),
                     word(xq, (i & 1) * 2 + 1));
          }
        }
      } else {
        // mma h covers physical columns 4h..4h+3 of the lane's 8.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma_bf16(part[j], word(wcur[2 * s], 2 * h), word(wcur[2 * s + 1], 2 * h), word(wcur[2 * s], 2 * h + 1),
                     word(wcur[2 * s + 1], 2 * h + 1), word(xv[j][0], 2 * h), word(xv[j][0], 2 * h + 1));
          }
        }
      }
    }
    float sa = 1.0f, sb = 1.0f;
    if (kFp8) {
      sa = __ldg(p.scale + static_cast<int64_t>(ra / p.rows_per_scale) * p.scale_cols + c);
      sb = __ldg(p.scale + static_cast<int64_t>(rb / p.rows_per_scale) * p.scale_cols + c);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      acc[j][0] += part[j][0] * sa;
      acc[j][1] += part[j][1] * sa;
      acc[j][2] += part[j][2] * sb;
      acc[j][3] += part[j][3] * sb;
    }
#pragma unroll
    for (int i = 0; i < 2 * S; ++i) wcur[i] = wnext[i];
  }

  // C fragment: acc[j][0..1] = rows g, tokens 8j+2t, 8j+2t+1; acc[j][2..3] = row g+8.
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[warp][g][j * 8 + 2 * t] = acc[j][0];
    red[warp][g][j * 8 + 2 * t + 1] = acc[j][1];
    red[warp][g + 8][j * 8 + 2 * t] = acc[j][2];
    red[warp][g + 8][j * 8 + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kRows * p.n; idx += kWarps * 32) {
    const int tok = idx / kRows, r = idx % kRows;
    const int row = row0 + r;
    if (row >= p.N) continue;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w][r][tok];
    if (p.bias) v += __bfloat162float(p.bias[row]);
    v = bf16_round(v);
    if (p.act == static_cast<int>(Activation::kGeluTanh)) v = bf16_round(gelu_tanh(v));
    if (p.act == static_cast<int>(Activation::kGeluErf)) v = bf16_round(gelu_erf(v));
    const int64_t o = static_cast<int64_t>(tok) * p.N + row;
    if (p.residual) v += __bfloat162float(p.residual[o]);
    p.out[o] = __float2bfloat16_rn(v);
  }
}

template <bool kFp8>
void launch_nt(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro) {
  const dim3 grid(ceil_div(p.N, kRows)), block(kWarps * 32);
  const int nt = (p.n + 7) / 8;
  if (pro != SkinnyPrologue::kNone) {
    QVL_CHECK_LE(p.n, kFusedPrologueMaxRows);
    if (pro == SkinnyPrologue::kRmsNorm)
      launch(ctx, "skinny_linear+rms_norm", skinny_kernel<kFp8, 1, SkinnyPrologue::kRmsNorm>, grid, block, 0, p);
    else
      launch(ctx, "skinny_linear+silu_mul", skinny_kernel<kFp8, 1, SkinnyPrologue::kSiluMul>, grid, block, 0, p);
    return;
  }
  constexpr int kN = SkinnyPrologue::kNone;
  switch (nt) {
    case 1:
      launch(ctx, "skinny_linear", skinny_kernel<kFp8, 1, kN>, grid, block, 0, p);
      break;
    case 2:
      launch(ctx, "skinny_linear", skinny_kernel<kFp8, 2, kN>, grid, block, 0, p);
      break;
    case 3:
      launch(ctx, "skinny_linear", skinny_kernel<kFp8, 3, kN>, grid, block, 0, p);
      break;
    case 4:
      launch(ctx, "skinny_linear", skinny_kernel<kFp8, 4, kN>, grid, block, 0, p);
      break;
    default:
      QVL_CHECK(false) << "skinny_linear: " << p.n << " rows (at most " << kSkinnyMaxRows << ")";
  }
}

}  // namespace

void launch_skinny_linear(const LaunchContext& ctx, Tensor out, const Tensor& x, const LinearWeight& w,
                          const Epilogue& ep, const SkinnyPrologue& pro) {
  QVL_CHECK_EQ(w.parts.size(), 1u) << "skinny_linear needs a merged (device) weight";
  const Tensor& weight = w.parts[0].weight;
  const bool fp8 = weight.dtype == DType::kF8E4M3;
  QVL_CHECK(x.dtype == DType::kBF16 && out.dtype == DType::kBF16) << x.describe() << " -> " << out.describe();
  QVL_CHECK(fp8 || weight.dtype == DType::kBF16) << "skinny_linear weight " << weight.describe();
  const int64_t n = x.dim(0), K = x.row_numel(), N = out.row_numel();
  QVL_CHECK_LE(n, kSkinnyMaxRows);
  QVL_CHECK_EQ(out.dim(0), n);
  QVL_CHECK_EQ(weight.dim(0), N);
  QVL_CHECK_EQ(weight.dim(1), K);
  QVL_CHECK_EQ(K % (fp8 ? 16 : 8), 0) << "skinny_linear: K " << K;
  QVL_CHECK(x.data != out.data) << "skinny_linear: x aliases out";
  SkinnyParams p{};
  p.w = weight.data;
  p.x = x.as<bf16>();
  p.out = out.as<bf16>();
  p.n = static_cast<int>(n);
  p.N = static_cast<int>(N);
  p.K = static_cast<int>(K);
  p.act = static_cast<int>(ep.act);
  if (!w.bias.empty()) {
    QVL_CHECK(w.bias.dtype == DType::kBF16 && w.bias.numel() == N) << "bias " << w.bias.describe();
    p.bias = w.bias.as<bf16>();
  }
  if (!ep.residual.empty()) {
    QVL_CHECK(ep.residual.dtype == DType::kBF16 && ep.residual.same_shape(out))
        << "residual " << ep.residual.describe() << " vs out " << out.describe();
    p.residual = ep.residual.as<bf16>();
  }
  if (pro.kind != SkinnyPrologue::kNone) {
    QVL_CHECK(pro.src.dtype == DType::kBF16 && pro.src.dim(0) == n) << "prologue source " << pro.src.describe();
    QVL_CHECK_EQ(K % 8, 0);
    QVL_CHECK(pro.src.data != out.data && (ep.residual.empty() || ep.residual.data != x.data))
        << "prologue source or x aliases the output";
    p.src = pro.src.as<bf16>();
    p.x_out = x.as<bf16>();
    if (pro.kind == SkinnyPrologue::kRmsNorm) {
      QVL_CHECK_EQ(pro.src.row_numel(), K);
      QVL_CHECK(pro.weight.numel() == K && (pro.weight.dtype == DType::kF32 || pro.weight.dtype == DType::kBF16))
          << "rms_norm weight " << pro.weight.describe();
      p.norm_w = pro.weight.data;
      p.norm_w_f32 = pro.weight.dtype == DType::kF32;
      p.eps = pro.eps;
    } else {
      QVL_CHECK_EQ(pro.src.row_numel(), 2 * K);
    }
  }
  if (fp8) {
    const Tensor& scale = w.parts[0].scale_inv;
    QVL_CHECK_EQ(w.block_size, kChunk) << "skinny_linear handles 128x128 FP8 blocks";
    QVL_CHECK(scale.dtype == DType::kF32) << scale.describe();
    QVL_CHECK_EQ(scale.dim(1), (K + kChunk - 1) / kChunk);
    p.scale = scale.as<float>();
    p.scale_cols = static_cast<int>(scale.dim(1));
    p.rows_per_scale = scale.dim(0) == (N + kChunk - 1) / kChunk ? kChunk : 1;
    QVL_CHECK(p.rows_per_scale == kChunk || scale.dim(0) == N) << "scale " << scale.describe() << " for N " << N;
    launch_nt<true>(ctx, p, pro.kind);
  } else {
    launch_nt<false>(ctx, p, pro.kind);
  }
}

}  // namespace qvl::cuda
