// Internal to the CUDA backend's decode Linear (skinny.cu, skinny_stream.cu): what both of its
// kernels share.
//
// The op: out[n, N] = epilogue(x[n, K] · W[N, K]ᵀ) for few rows (decode: 1..32 tokens).
// Memory-bound: every weight byte is read exactly once, so the kernel is built around the
// weight stream and the tensor cores only do the (cheap) arithmetic.
//
// Layout ("swap AB"): a block owns 16 weight rows and all n tokens; its 8 warps (16 in the
// one-tile kernel's SkinnyTuning::warps blocks) split K into 128-wide chunks (warp w takes
// chunks w, w+8, ...), and each warp runs mma.m16n8k16 with the
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
//
// The optional prologue (RMSNorm or SiLU·mul of x's producer, deferred by the backend) is
// computed once per block into shared memory (prologue_x) right after the PDL wait.
#pragma once

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda::skinny {

constexpr int kWarps = 8;
// The one-tile kernel may run 16 warps per block (SkinnyTuning::warps): the prologues and the
// tile's reduction take the block's warp count as a template argument W (default kWarps).
constexpr int kMaxWarps = 16;
constexpr int kRows = kSkinnyTileRows;
constexpr int kChunk = 128;
constexpr int kChunkShift = 7;  // log2(kChunk): FP8 scale blocks are kChunk rows tall
static_assert(kChunk == 1 << kChunkShift);

__device__ __forceinline__ uint4 load16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
// Weights are read once: keep them out of L1. A warp's load covers half of each of 8 weight rows'
// 128-byte lines (lanes 4g..4g+3: 64 bytes of row g), and the next load of the lane the other
// half. The L2::128B prefetch size has the first miss fill the whole line from DRAM: decode step
// on an H200 at one row -0.4% (2B) to -6.5% (8B BF16), at 8 rows -1.0 to -4.9% (RESULTS run 40).
// L2::256B (the next line too) lost 0.9% on 2B BF16.
__device__ __forceinline__ uint4 load16_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

struct SkinnyParams {
  const void* w;       // [N, K] bf16 or fp8
  const float* scale;  // fp8: [*, scale_cols] dequantisation multipliers
  int scale_cols;
  // Weight rows per scale row as a shift: kChunkShift (128-row blocks) or 0 (a scale row per
  // weight row). A shift, where a division compiled to ~20 instructions per scale load.
  int scale_row_shift;
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
  bool silu_staged;  // kSiluMul: gate and up copied into shared memory first (prologue_bytes doubles)
  // SwiGLU epilogue (non-null; the one-tile and ring kernels): W = [gate; up], N = 2 I with
  // I % 8 == 0, no bias, activation or residual. Tile t takes gate rows 8t.. 8t + 7 as its rows
  // 0..7 and up rows I + 8t.. as its rows 8..15 (tile_row), so each gate output meets its up
  // output in the tile's reduction: out gets both, as the Linear alone writes them, and
  // glu_out[tok, 8t + r] = bf16(bf16(silu(gate)) * up), as silu_mul writes it.
  bf16* glu_out;
  // The next kernel may launch before this one's PDL wait (CudaBackendOptions::decode_early_launch;
  // the one-tile kernel).
  bool early_launch;
};

// Row r (0..15) of 16-row tile ti: rows 16 ti + r, or with the SwiGLU epilogue gate row 8 ti + r
// (r < 8) and up row N / 2 + 8 ti + r - 8. Past N: N - 1 (read, never stored).
__device__ __forceinline__ int tile_row(const SkinnyParams& p, int ti, int r) {
  if (p.glu_out != nullptr) return (r < 8 ? 0 : p.N / 2 - 8) + ti * 8 + r;
  return min(ti * kRows + r, p.N - 1);
}

// Shared state of the prologues: 1/rms of each row for kRmsNorm, and the per-warp partial
// sums of squares it is reduced from.
struct PrologueSmem {
  float rstd[kFusedPrologueMaxRows];
  float ss[kMaxWarps][kFusedPrologueMaxRows];
};

// Dynamic shared memory of a prologue kernel: x itself, [n][K] BF16 (at most
// kFusedPrologueMaxBytes), computed once per block so that the main loop reads it like x.
extern __shared__ uint4 prologue_x[];

// 8 consecutive x values of token `tok` at column k (k % 8 == 0, in range), as 4 bf16x2.
template <int PRO>
__device__ __forceinline__ uint4 load_x8(const SkinnyParams& p, int tok, int k, const PrologueSmem&) {
  if constexpr (PRO == SkinnyPrologue::kNone) {
    return load16(p.x + static_cast<int64_t>(tok) * p.K + k);
  } else {
    // ld.shared at a shared-window address: indexing prologue_x compiled to ~6 instructions per
    // load (the window base rebuilt from the CTA's cluster id each time).
    uint4 v;
    const uint32_t a = smem_u32(prologue_x) + static_cast<uint32_t>(tok * p.K + k) * 2u;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a)
                 : "memory");
    return v;
  }
}

// RMSNorm weights of the thread's first kPrologueWeightVecs vectors (columns 8v.., v = thread
// + 32 W m), loaded before the PDL wait: weights are never written by a kernel.
constexpr int kPrologueWeightVecs = 2;
struct PrologueWeights {
  float w[kPrologueWeightVecs][8];
};
__device__ __forceinline__ void load_norm_w8(const SkinnyParams& p, int k, float (&w)[8]) {
  if (p.norm_w_f32) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.norm_w) + k));
    const float4 b = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(p.norm_w) + k + 4));
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
  } else {
    unpack8(load16(static_cast<const bf16*>(p.norm_w) + k), w);
  }
}
template <int PRO, int W = kWarps>
__device__ __forceinline__ void prefetch_prologue(const SkinnyParams& p, PrologueWeights& pw) {
  if constexpr (PRO == SkinnyPrologue::kRmsNorm) {
#pragma unroll
    for (int m = 0; m < kPrologueWeightVecs; ++m) {
      const int v = threadIdx.x + m * W * 32;
      if (v < p.K / 8) load_norm_w8(p, v * 8, pw.w[m]);
    }
  }
}

// SiLU·mul of 8 gate and 8 up values as the unfused op writes it: bf16(bf16(silu(g)) * u).
__device__ __forceinline__ uint4 silu_mul8(uint4 gate, uint4 up) {
  float g[8], u[8];
  unpack8(gate, g);
  unpack8(up, u);
#pragma unroll
  for (int e = 0; e < 8; ++e) g[e] = bf16_round(silu(g[e])) * u[e];
  return pack8(g);
}

// Runs after grid_dep_wait: fills prologue_x with x exactly as the unfused op writes it
// (RMSNorm: bf16(w * bf16(x * rstd)); SiLU·mul: bf16(bf16(silu(g)) * u)) and writes this
// block's share of x to global memory (blocks split the n*K/8 vectors evenly), so x ends up
// fully written. Sums of squares are reduced in a fixed order (deterministic).
template <int PRO, int W = kWarps>
__device__ __forceinline__ void run_prologue(const SkinnyParams& p, PrologueSmem& ps, const PrologueWeights& pw) {
  static_assert(W <= kMaxWarps);
  if constexpr (PRO != SkinnyPrologue::kNone) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int kv = p.K / 8;  // vectors per row
    const int64_t per = (static_cast<int64_t>(p.n) * kv + gridDim.x - 1) / gridDim.x;
    const int64_t v0 = per * blockIdx.x, v1 = v0 + per;
    if constexpr (PRO == SkinnyPrologue::kRmsNorm) {
      float ss[kFusedPrologueMaxRows];
#pragma unroll
      for (int tok = 0; tok < kFusedPrologueMaxRows; ++tok) {
        ss[tok] = 0.0f;
        if (tok < p.n) {
          const uint4* row = reinterpret_cast<const uint4*>(p.src + static_cast<int64_t>(tok) * p.K);
          for (int v = threadIdx.x; v < kv; v += W * 32) {
            const uint4 raw = load16(row + v);
            prologue_x[tok * kv + v] = raw;
            float f[8];
            unpack8(raw, f);
#pragma unroll
            for (int e = 0; e < 8; ++e) ss[tok] += f[e] * f[e];
          }
        }
      }
#pragma unroll
      for (int tok = 0; tok < kFusedPrologueMaxRows; ++tok) {
        if (tok < p.n) {
          const float w = warp_sum(ss[tok]);
          if (lane == 0) ps.ss[warp][tok] = w;
        }
      }
      __syncthreads();
      if (threadIdx.x < p.n) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) total += ps.ss[w][threadIdx.x];
        ps.rstd[threadIdx.x] = rsqrtf(total / static_cast<float>(p.K) + p.eps);
      }
      __syncthreads();
      for (int v = threadIdx.x, m = 0; v < kv; v += W * 32, ++m) {
        float w[8];
        if (m < kPrologueWeightVecs) {
#pragma unroll
          for (int e = 0; e < 8; ++e) w[e] = m == 0 ? pw.w[0][e] : pw.w[1][e];
        } else {
          load_norm_w8(p, v * 8, w);
        }
        for (int tok = 0; tok < p.n; ++tok) {
          const int i = tok * kv + v;
          float x8[8];
          unpack8(prologue_x[i], x8);
          const float r = ps.rstd[tok];
#pragma unroll
          for (int e = 0; e < 8; ++e) x8[e] = w[e] * bf16_round(x8[e] * r);
          const uint4 x = pack8(x8);
          prologue_x[i] = x;
          if (i >= v0 && i < v1) reinterpret_cast<uint4*>(p.x_out)[i] = x;
        }
      }
    } else if (p.silu_staged) {
      // gate into prologue_x and up into the n * kv vectors after it, all at once (cp.async: no
      // registers, one round trip where the loop below takes one per vector of each thread),
      // then each thread combines the vectors it copied. Staging RMSNorm's rows the same way
      // measured slower (2B +3%, K = 2048: one vector per thread).
      uint4* up = prologue_x + p.n * kv;
      for (int i = threadIdx.x; i < p.n * kv; i += W * 32) {
        const int tok = i / kv, k = (i % kv) * 8;
        const bf16* row = p.src + static_cast<int64_t>(tok) * 2 * p.K;
        cp_async16(&prologue_x[i], row + k);
        cp_async16(&up[i], row + p.K + k);
      }
      cp_async_wait_all();
      for (int i = threadIdx.x; i < p.n * kv; i += W * 32) {
        const uint4 x = silu_mul8(prologue_x[i], up[i]);
        prologue_x[i] = x;
        if (i >= v0 && i < v1) reinterpret_cast<uint4*>(p.x_out)[i] = x;
      }
    } else {
      for (int i = threadIdx.x; i < p.n * kv; i += W * 32) {
        const int tok = i / kv, k = (i % kv) * 8;
        const bf16* row = p.src + static_cast<int64_t>(tok) * 2 * p.K;
        const uint4 x = silu_mul8(load16(row + k), load16(row + p.K + k));
        prologue_x[i] = x;
        if (i >= v0 && i < v1) reinterpret_cast<uint4*>(p.x_out)[i] = x;
      }
    }
    __syncthreads();
  }
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  const uint32_t a[4] = {a0, a1, a2, a3};
  mma_m16n8k16(d, a, b0, b1);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Two e4m3 bytes of w (bytes 0, 1 for sel kE4m3Lo, 2, 3 for kE4m3Hi) -> one bf16x2, exact. prmt
// puts each byte b in the low byte of its half and b's sign, replicated, in the high byte (a
// selector nibble with bit 3 set); shifted left by 4 and masked, each half is b's sign at bit 15
// and its exponent and mantissa at bits 10..4: the bf16 whose value is e4m3(b) * 2^-120, which
// the multiplication by 2^120 makes exact, subnormals included. Four instructions per pair.
constexpr uint32_t kE4m3Lo = 0x9180u, kE4m3Hi = 0xB3A2u;
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t w, uint32_t sel) {
  uint32_t a;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(a) : "r"(w), "r"(sel));  // [sign b_lo, b_lo, sign b_hi, b_hi]
  const uint32_t bits = (a << 4) & 0x87f087f0u;                 // e4m3 value * 2^-120, as bf16
  const bf162 scaled = __hmul2(*reinterpret_cast<const bf162*>(&bits), __floats2bfloat162_rn(0x1p120f, 0x1p120f));
  return *reinterpret_cast<const uint32_t*>(&scaled);
}

// A lane's 16 e4m3 weights of row a and of row b (16 bytes each) as BF16 pairs, in the order the
// mmas take them: pair 2i / 2i + 1 from word i's low / high bytes.
__device__ __forceinline__ void widen_fp8_rows(const uint4& a16, const uint4& b16, uint32_t (&wa)[8],
                                               uint32_t (&wb)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    wa[2 * i] = e4m3x2_to_bf16x2(word(a16, i), kE4m3Lo);
    wa[2 * i + 1] = e4m3x2_to_bf16x2(word(a16, i), kE4m3Hi);
    wb[2 * i] = e4m3x2_to_bf16x2(word(b16, i), kE4m3Lo);
    wb[2 * i + 1] = e4m3x2_to_bf16x2(word(b16, i), kE4m3Hi);
  }
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

// part = this lane's C fragments of chunk c (rows g, g+8 of the 16-row tile whose weights the
// lane holds in w; tokens 8j+2t, 8j+2t+1), before the chunk's block scale.
template <bool kFp8, int NT, int PRO>
__device__ __forceinline__ void chunk_mma(const SkinnyParams& p, int c, int t, int g,
                                          const uint4 (&w)[2 * Chunk<kFp8>::kSteps], const PrologueSmem& pro_smem,
                                          float (&part)[NT][4]) {
  using C = Chunk<kFp8>;
  constexpr int E = C::kElems;
  constexpr int S = C::kSteps;
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
      widen_fp8_rows(w[2 * s], w[2 * s + 1], wa, wb);
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
          mma_bf16(part[j], word(w[2 * s], 2 * h), word(w[2 * s + 1], 2 * h), word(w[2 * s], 2 * h + 1),
                   word(w[2 * s + 1], 2 * h + 1), word(xv[j][0], 2 * h), word(xv[j][0], 2 * h + 1));
        }
      }
    }
  }
}

// The FP8 block scale of weight row `row` in 128-column chunk c.
__device__ __forceinline__ float block_scale(const SkinnyParams& p, int row, int c) {
  return __ldg(p.scale + static_cast<int64_t>(row >> p.scale_row_shift) * p.scale_cols + c);
}

// acc += a chunk's partial sums, rows g times sa and rows g + 8 times sb (C fragment layout).
template <int NT>
__device__ __forceinline__ void accumulate_scaled(float (&acc)[NT][4], const float (&part)[NT][4], float sa, float sb) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    acc[j][0] += part[j][0] * sa;
    acc[j][1] += part[j][1] * sa;
    acc[j][2] += part[j][2] * sb;
    acc[j][3] += part[j][3] * sb;
  }
}

// One output element: v = bf16(acc + bias); v = bf16(act(v)); out = bf16(residual + v).
__device__ __forceinline__ void store_out(const SkinnyParams& p, int row, int tok, float v) {
  if (p.bias) v += __bfloat162float(p.bias[row]);
  v = bf16_round(v);
  if (p.act == static_cast<int>(Activation::kGeluTanh)) v = bf16_round(gelu_tanh(v));
  if (p.act == static_cast<int>(Activation::kGeluErf)) v = bf16_round(gelu_erf(v));
  const int64_t o = static_cast<int64_t>(tok) * p.N + row;
  if (p.residual) v += __bfloat162float(p.residual[o]);
  p.out[o] = __float2bfloat16_rn(v);
}

// A warp's partial sums into red[warp] (C fragment: acc[j][0..1] = row g, tokens 8j+2t,
// 8j+2t+1; acc[j][2..3] = row g + 8).
template <int NT, int W = kWarps>
__device__ __forceinline__ void write_partials(float (&red)[W][kRows][NT * 8 + 1], const float (&acc)[NT][4]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[warp][g][j * 8 + 2 * t] = acc[j][0];
    red[warp][g][j * 8 + 2 * t + 1] = acc[j][1];
    red[warp][g + 8][j * 8 + 2 * t] = acc[j][2];
    red[warp][g + 8][j * 8 + 2 * t + 1] = acc[j][3];
  }
}

// The SwiGLU epilogue's outputs of tile ti from the sums of its gate row r and up row r + 8.
__device__ __forceinline__ void store_glu(const SkinnyParams& p, int ti, int r, int tok, float gate, float up) {
  const int j = ti * 8 + r, half = p.N / 2;
  const int64_t o = static_cast<int64_t>(tok) * p.N + j;
  const float g = bf16_round(gate), u = bf16_round(up);
  p.out[o] = __float2bfloat16_rn(g);
  p.out[o + half] = __float2bfloat16_rn(u);
  p.glu_out[static_cast<int64_t>(tok) * half + j] = __float2bfloat16_rn(bf16_round(silu(g)) * u);
}

// The end of a 16-row tile: the 8 warps' partial sums meet in `red`, are added in warp order,
// and each output is stored (tile ti's rows, tile_row). Every thread of the block calls it (one
// barrier).
template <int NT, int W = kWarps>
__device__ __forceinline__ void reduce_tile_and_store(const SkinnyParams& p, float (&red)[W][kRows][NT * 8 + 1],
                                                      const float (&acc)[NT][4], int ti) {
  write_partials<NT, W>(red, acc);
  __syncthreads();
  if (p.glu_out != nullptr) {
    for (int idx = threadIdx.x; idx < 8 * p.n; idx += W * 32) {
      const int tok = idx / 8, r = idx % 8;
      float g = 0.0f, u = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) g += red[w][r][tok];
#pragma unroll
      for (int w = 0; w < W; ++w) u += red[w][r + 8][tok];
      store_glu(p, ti, r, tok, g, u);
    }
    return;
  }
  const int row0 = ti * kRows;
  for (int idx = threadIdx.x; idx < kRows * p.n; idx += W * 32) {
    const int tok = idx / kRows, r = idx % kRows;
    const int row = row0 + r;
    if (row >= p.N) continue;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) v += red[w][r][tok];
    store_out(p, row, tok, v);
  }
}

// Dynamic shared memory of a prologue launch: x, [n][K] BF16 (and up beside it when staged).
inline size_t prologue_bytes(const SkinnyParams& p) {
  const size_t bytes = static_cast<size_t>(p.n) * p.K * sizeof(uint16_t);
  QVL_CHECK(p.n <= kFusedPrologueMaxRows && bytes <= kFusedPrologueMaxBytes)
      << "fused prologue over " << p.n << " x " << p.K << " values";
  return p.silu_staged ? 2 * bytes : bytes;
}

// The persistent streaming kernel's launcher (skinny_stream.cu): depth = chunks in flight per
// warp (BF16 2 or 3, FP8 4 or 6), split = warps sharing one row tile's K (1, 2, 4 or 8).
template <bool kFp8>
void launch_stream(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro, int depth, int split);

// The bulk-copy ring kernel (skinny_ring.cu, sm_90+, at most 8 rows). configure_ring() lets its
// kernels take up to `bytes` (LaunchContext::ring_smem) of dynamic shared memory.
struct RingTuning {
  // Stages in the ring (0: as many as fit 104 KiB beside the prologue, at least 2); at most what
  // fits LaunchContext::ring_smem.
  int depth = 0;
  int group = 0;   // row mode: 8 * group chunks per stage (0: 4 KB of each row)
  int blocks = 1;  // blocks per multiprocessor
  int mode = 0;  // 1: whole 16-row tiles per stage (one copy), 2: row segments (16 copies), 0: whole tiles up to 64 KB
};
void configure_ring(int bytes);
// The most dynamic shared memory the ring kernels take on any device (kernels.h
// ring_smem_budget: the opt-in limit less their static shared memory, ~9 KB, up to this).
constexpr int kRingSmemMax = 200 * 1024;
// Whether a ring launch of p can fit ctx.ring_smem at all (two stages of whole tiles or of the
// smallest row segments, beside `pro_bytes` of prologue and the block scales of `blocks` per
// multiprocessor): where it cannot, a forced ring gives way to the defaults.
bool ring_fits(const LaunchContext& ctx, const SkinnyParams& p, bool fp8, size_t pro_bytes, int blocks);
// Tiles of at most this many bytes stream through the ring as whole tiles by default (one copy
// each).
constexpr int kRingWholeTileMax = 64 * 1024;
// Whether the ring can stream whole tiles of at most `max_tile` bytes (the default layout,
// RingTuning{}, takes them up to 64 KB; larger ones need RingTuning::mode 1): two of them must fit
// in ctx.ring_smem beside `pro_bytes` of prologue and the block scales.
bool ring_whole_tiles(const LaunchContext& ctx, const SkinnyParams& p, bool fp8, size_t pro_bytes, int max_tile);
template <bool kFp8>
void launch_ring(const LaunchContext& ctx, const SkinnyParams& p, SkinnyPrologue::Kind pro, const RingTuning& rt);

// The wide kernel (skinny_wide.cu, sm_90+: clusters): FP8 weights, no prologue, 128 weight rows
// per block, K split over a cluster of `splits` blocks (1, 2, 4 or 8). configure_wide(ring_smem)
// lets its kernels take their shared memory where ring_smem (LaunchContext) allows it, and
// wide_available() says whether ctx can launch it for n rows (at most kSkinnyWideMaxRows);
// wide_splits() is the default split for an N x K weight (forced > 0: that); wide_tall() says
// whether N output rows already give every multiprocessor two of its 128-row tiles (gate_up).
void configure_wide(int ring_smem);
bool wide_available(const LaunchContext& ctx, int64_t n);
bool wide_tall(const LaunchContext& ctx, int64_t N);
int wide_splits(const LaunchContext& ctx, int64_t N, int64_t K, int forced);
void launch_wide(const LaunchContext& ctx, const SkinnyParams& p, int splits);

}  // namespace qvl::cuda::skinny
