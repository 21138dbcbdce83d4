// Text attention over the paged KV cache:
// - text_qkv_prepare: per token, RMSNorm of every q and k head (q_norm/k_norm), interleaved
//   M-RoPE, K and V stored at the token's slot; q rotated in place. One block per token.
// - prefill (rows per sequence > 1): the flash core (flash.cuh) with K/V rows gathered from
//   pages by cp.async, causal: a row at absolute position p sees cache tokens [0, p].
// - decode (one row per sequence): split-K flash-decoding. A block owns one (sequence, kv
//   head, split) and all q heads of that GQA group, so each K/V row is read once for the
//   group. The split count depends only on the number of sequences (graph-safe); the keys per
//   split follow the actual context length, read on the device. The last split of a (sequence,
//   kv head) to finish merges the splits' (o, max, sum) partials (an arrival counter, no second
//   kernel); with one split the block writes the output itself.
//
// Cache layout (backend.h KvCacheView): page p, layer l, K then V, each [page_size, Hkv, dh].
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/flash.cuh"

namespace qvl::cuda {
namespace {

struct CacheGeometry {
  char* base = nullptr;
  int64_t page_bytes = 0;
  int64_t layer_offset = 0;  // layer * layer_bytes
  int64_t v_offset = 0;      // page_size * token_bytes
  int64_t token_bytes = 0;   // Hkv * dh * element size
  int page_size = 16;
  int esize = 2;  // 2: BF16 cache, 1: FP8 E4M3 cache (saturated, no scale)
};

CacheGeometry geometry(const KvCacheView& cache, int layer) {
  QVL_CHECK(cache.dtype == DType::kBF16 || cache.dtype == DType::kF8E4M3)
      << "KV cache dtype " << dtype_name(cache.dtype) << " (BF16 or F8_E4M3)";
  QVL_CHECK(layer >= 0 && layer < cache.num_layers) << "layer " << layer << " of " << cache.num_layers;
  CacheGeometry g;
  g.base = static_cast<char*>(cache.base);
  g.page_bytes = static_cast<int64_t>(cache.page_bytes());
  g.layer_offset = static_cast<int64_t>(cache.layer_bytes()) * layer;
  g.token_bytes = static_cast<int64_t>(cache.token_bytes_per_layer());
  g.v_offset = g.token_bytes * cache.page_size;
  g.page_size = cache.page_size;
  g.esize = dtype_size(cache.dtype);
  return g;
}

// First byte of head `kvh` of token (page, off) of this layer's K (or V).
__device__ __forceinline__ char* cache_row(const CacheGeometry& c, int32_t page, int off, int kvh, int hd, bool v) {
  return c.base + page * c.page_bytes + c.layer_offset + (v ? c.v_offset : 0) + off * c.token_bytes +
         static_cast<int64_t>(kvh) * hd * c.esize;
}

// Element d of a cache row (BF16, or FP8 rounded from BF16 as an engine casting its bf16 K/V would).
__device__ __forceinline__ void store_kv(char* row, int d, float v, int esize) {
  if (esize == 2) {
    reinterpret_cast<bf16*>(row)[d] = __float2bfloat16_rn(v);
  } else {
    reinterpret_cast<uint8_t*>(row)[d] = float_to_fp8_e4m3_dev(bf16_round(v));
  }
}

// 8 consecutive cache elements as floats (16 bytes of BF16 or 8 bytes of FP8).
template <bool kFp8>
__device__ __forceinline__ void load_kv8(const char* p, float (&f)[8]) {
  if constexpr (kFp8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      f[e] = fp8_e4m3_to_float_dev(static_cast<uint8_t>(raw.x >> (8 * e)));
      f[4 + e] = fp8_e4m3_to_float_dev(static_cast<uint8_t>(raw.y >> (8 * e)));
    }
  } else {
    unpack8(*reinterpret_cast<const uint4*>(p), f);
  }
}

// ---------------------------------------------------------------- q/k norm + M-RoPE + store
template <typename W>
struct PrepareParams {
  bf16* qkv;
  const W* q_norm;  // BF16 or F32 (the model loads norm weights as F32)
  const W* k_norm;
  const int32_t* positions;  // [n, 3]
  const int32_t* slots;      // [n]
  CacheGeometry cache;
  float eps;
  int hq, hkv, hd;
};

constexpr int kPrepareWarps = 8;

template <typename W>
__global__ void __launch_bounds__(kPrepareWarps * 32)
    qkv_prepare_kernel(const PrepareParams<W> p, const __grid_constant__ MropeParams rope) {
  __shared__ float cos_s[128], sin_s[128];
  __shared__ float buf[kPrepareWarps][256];
  grid_dep_wait();
  grid_dep_launch();
  const int tok = blockIdx.x;
  const int half = p.hd / 2;
  // cos/sin of this token's M-RoPE angles, rounded to bf16 like the reference's cos/sin.
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float pos = static_cast<float>(p.positions[tok * 3 + rope.axis[j]]);
    const float f = pos * rope.inv_freq[j];
    cos_s[j] = bf16_round(cosf(f));
    sin_s[j] = bf16_round(sinf(f));
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t ld = static_cast<int64_t>(p.hq + 2 * p.hkv) * p.hd;
  bf16* row = p.qkv + tok * ld;
  const int32_t slot = p.slots[tok];
  const int32_t page = slot >= 0 ? slot / p.cache.page_size : 0;
  const int off = slot >= 0 ? slot % p.cache.page_size : 0;
  float* b = buf[warp];
  // Block (token, y) takes heads y*8+warp, stepping over the whole grid row: one head per warp.
  for (int hh = blockIdx.y * kPrepareWarps + warp; hh < p.hq + 2 * p.hkv; hh += kPrepareWarps * gridDim.y) {
    bf16* src = row + static_cast<int64_t>(hh) * p.hd;
    if (hh >= p.hq + p.hkv) {  // v: copy into the cache
      if (slot < 0) continue;
      char* dst = cache_row(p.cache, page, off, hh - p.hq - p.hkv, p.hd, true);
      for (int d = lane; d < p.hd; d += 32) store_kv(dst, d, __bfloat162float(src[d]), p.cache.esize);
      continue;
    }
    const bool is_q = hh < p.hq;
    const W* w = is_q ? p.q_norm : p.k_norm;
    float ss = 0.0f;
    for (int d = lane; d < p.hd; d += 32) {
      const float x = __bfloat162float(src[d]);
      b[d] = x;
      ss += x * x;
    }
    const float rstd = rsqrtf(warp_sum(ss) / static_cast<float>(p.hd) + p.eps);
    for (int d = lane; d < p.hd; d += 32) b[d] = bf16_round(static_cast<float>(w[d]) * bf16_round(b[d] * rstd));
    __syncwarp();
    char* kdst = !is_q && slot >= 0 ? cache_row(p.cache, page, off, hh - p.hq, p.hd, false) : nullptr;
    float out[8];  // head_dim <= 256: dims lane + 32 i
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int d = lane + 32 * i;
      if (d < p.hd) {
        const int j = d < half ? d : d - half;
        const float rot = d < half ? -b[d + half] : b[d - half];
        out[i] = bf16_round(b[d] * cos_s[j]) + bf16_round(rot * sin_s[j]);
      }
    }
    __syncwarp();  // every lane has read b before the next head overwrites it
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int d = lane + 32 * i;
      if (d >= p.hd) continue;
      if (is_q)
        src[d] = __float2bfloat16_rn(out[i]);  // q stays in qkv, rotated in place
      else if (kdst)
        store_kv(kdst, d, out[i], p.cache.esize);
    }
  }
}

// ---------------------------------------------------------------- prefill (flash, paged)
struct PagedParams {
  const bf16* qkv;
  bf16* out;
  const int32_t* query_start;
  const int32_t* context_len;
  const int32_t* page_table;
  CacheGeometry cache;
  int num_seqs, max_pages, hq, hkv;
};
template <int BM, bool kFp8Kv>
struct PagedPolicy {
  using Params = PagedParams;
  __device__ static bool locate(const Params& p, flash::Tile& t) {
    int idx = blockIdx.x;
    for (int s = 0; s < p.num_seqs; ++s) {
      const int q0 = p.query_start[s], qlen = p.query_start[s + 1] - q0;
      const int tiles = (qlen + BM - 1) / BM;
      if (idx < tiles) {
        const int ctx = p.context_len[s];
        t.head = blockIdx.y;
        t.qn = min(BM, qlen - idx * BM);
        const int pos0 = ctx - qlen + idx * BM;  // absolute position of the tile's first row
        t.causal_offset = pos0;
        t.kn = max(0, min(ctx, pos0 + t.qn));
        t.a = q0 + idx * BM;  // first qkv row of the tile
        t.b = s;
        return true;
      }
      idx -= tiles;
    }
    return false;
  }
  template <int HD>
  __device__ static const bf16* q_row(const Params& p, const flash::Tile& t, int i) {
    return p.qkv + (t.a + i) * static_cast<int64_t>(p.hq + 2 * p.hkv) * HD + t.head * HD;
  }
  using KvElem = std::conditional_t<kFp8Kv, uint8_t, bf16>;
  template <int HD>
  __device__ static const KvElem* kv_row(const Params& p, const flash::Tile& t, int j, bool v) {
    const int32_t page = p.page_table[t.b * p.max_pages + j / p.cache.page_size];
    return reinterpret_cast<const KvElem*>(
        cache_row(p.cache, page, j % p.cache.page_size, t.head / (p.hq / p.hkv), HD, v));
  }
  template <int HD>
  __device__ static bf16* o_row(const Params& p, const flash::Tile& t, int i) {
    return p.out + (t.a + i) * static_cast<int64_t>(p.hq) * HD + t.head * HD;
  }
};

// Adapts a policy with head_dim-templated accessors to the flash core's interface.
template <int HD, class Pol>
struct Bound {
  using Params = typename Pol::Params;
  static constexpr bool kFp8Kv = std::is_same_v<typename Pol::KvElem, uint8_t>;
  __device__ static bool locate(const Params& p, flash::Tile& t) { return Pol::locate(p, t); }
  __device__ static const bf16* q_row(const Params& p, const flash::Tile& t, int i) {
    return Pol::template q_row<HD>(p, t, i);
  }
  __device__ static auto k_row(const Params& p, const flash::Tile& t, int j) {
    return Pol::template kv_row<HD>(p, t, j, false);
  }
  __device__ static auto v_row(const Params& p, const flash::Tile& t, int j) {
    return Pol::template kv_row<HD>(p, t, j, true);
  }
  __device__ static bf16* o_row(const Params& p, const flash::Tile& t, int i) {
    return Pol::template o_row<HD>(p, t, i);
  }
};

constexpr int kPrefillWarps = 4;

template <bool kFp8Kv>
using Paged = PagedPolicy<16 * kPrefillWarps, kFp8Kv>;

template <int HD, bool kFp8Kv>
void run_prefill(const LaunchContext& ctx, const PagedParams& prm, int num_tokens, float scale) {
  using P = Bound<HD, Paged<kFp8Kv>>;
  constexpr size_t smem = flash::smem_bytes<HD, kPrefillWarps>();
  auto kernel = flash::flash_kernel<HD, kPrefillWarps, P>;
  const unsigned tiles = ceil_div(num_tokens, 16 * kPrefillWarps) + static_cast<unsigned>(prm.num_seqs);
  launch(ctx, "text_prefill_attention", kernel, dim3(tiles, prm.hq), dim3(kPrefillWarps * 32), smem, prm,
         scale * 1.4426950408889634f);
}

template <int HD, bool kFp8Kv>
void configure_prefill() {
  using P = Bound<HD, Paged<kFp8Kv>>;
  constexpr size_t smem = flash::smem_bytes<HD, kPrefillWarps>();
  QVL_CUDA_CHECK(cudaFuncSetAttribute(flash::flash_kernel<HD, kPrefillWarps, P>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
}

// ---------------------------------------------------------------- decode (split-K)
constexpr int kDecodeWarps = 4;
constexpr int kDecodeTile = 128;  // keys scored per round (shared-memory row of scores)
constexpr int kMaxGroup = 8;

struct DecodeParams {
  const bf16* qkv;
  bf16* out;
  float* partial;      // [num_seqs, hq, splits, hd + 2]
  uint32_t* counters;  // [num_seqs * hkv] arrivals of the current step's splits (zero between steps)
  const int32_t* query_start;
  const int32_t* context_len;
  const int32_t* page_table;
  CacheGeometry cache;
  int max_pages, hq, hkv, splits;
  float scale_log2;
};

// Keys per split for a context of `ctx` tokens: a multiple of 16, at least 64.
__device__ __forceinline__ int split_len(int ctx, int splits) {
  const int per = (ctx + splits - 1) / splits;
  return max(64, (per + 15) / 16 * 16);
}

template <int HD, bool kFp8Kv>
__global__ void __launch_bounds__(kDecodeWarps * 32) decode_kernel(const DecodeParams p) {
  constexpr int LPK = HD / 8;    // lanes per key in the score phase (16 bytes each)
  constexpr int KPW = 32 / LPK;  // keys per warp per step
  constexpr int DPL = HD / 32;   // output dims per lane in the PV phase
  __shared__ float sc[kMaxGroup][kDecodeTile];
  __shared__ float s_alpha[kMaxGroup], s_m[kMaxGroup], s_l[kMaxGroup];
  __shared__ float red[kDecodeWarps][kMaxGroup][HD];

  grid_dep_wait();
  grid_dep_launch();
  const int seq = blockIdx.x / p.hkv, kvh = blockIdx.x % p.hkv, split = blockIdx.y;
  const int group = p.hq / p.hkv;
  const int ctx = p.context_len[seq];
  const int len = split_len(ctx, p.splits);
  const int k_begin = split * len, k_end = min(ctx, k_begin + len);
  // An empty split returns (the merge never reads it), except split 0, which always reports
  // (an empty context yields m = -inf, l = 0 and a zero output).
  if (k_begin >= k_end && split != 0) return;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = p.query_start[seq];
  const int64_t ld = static_cast<int64_t>(p.hq + 2 * p.hkv) * HD;
  const bf16* qbase = p.qkv + row * ld + static_cast<int64_t>(kvh) * group * HD;

  // Score phase: lane (key slot kl = lane / LPK, part = lane % LPK) holds q[g][part*8 .. +8).
  const int kl = lane / LPK, part = lane % LPK;
  float q[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      unpack8(*reinterpret_cast<const uint4*>(qbase + g * HD + part * 8), q[g]);
    }
  }
  if (threadIdx.x < kMaxGroup) {
    s_m[threadIdx.x] = -INFINITY;
    s_l[threadIdx.x] = 0.0f;
  }
  float acc[kMaxGroup][DPL];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[g][e] = 0.0f;

  const int32_t* pt = p.page_table + static_cast<int64_t>(seq) * p.max_pages;
  for (int t0 = k_begin; t0 < k_end; t0 += kDecodeTile) {
    const int tn = min(kDecodeTile, k_end - t0);
    // 1. scores of this round's keys -> sc[g][key]. The loop bound is uniform across the warp
    //    (the shuffles need every lane); slots past tn compute on zeros and store nothing.
#pragma unroll 4
    for (int base = warp * KPW; base < tn; base += kDecodeWarps * KPW) {
      const int kk = base + kl;
      const bool valid = kk < tn;
      float kv[8];
      if (valid) {
        const int j = t0 + kk;
        const char* krow = cache_row(p.cache, pt[j / p.cache.page_size], j % p.cache.page_size, kvh, HD, false);
        load_kv8<kFp8Kv>(krow + part * 8 * (kFp8Kv ? 1 : 2), kv);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) kv[e] = 0.0f;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          float d = 0.0f;
#pragma unroll
          for (int e = 0; e < 8; ++e) d += q[g][e] * kv[e];
#pragma unroll
          for (int o = LPK / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
          if (valid && part == 0) sc[g][kk] = d * p.scale_log2;
        }
      }
    }
    __syncthreads();
    // 2. per head: new max, p = exp2(s - m), sum; warp w owns heads w, w + 4.
    for (int g = warp; g < group; g += kDecodeWarps) {
      float mx = -INFINITY;
      for (int kk = lane; kk < tn; kk += 32) mx = fmaxf(mx, sc[g][kk]);
      mx = warp_max(mx);
      const float m_old = s_m[g];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
      for (int kk = lane; kk < tn; kk += 32) {
        const float e = exp2f(sc[g][kk] - m_new);
        sc[g][kk] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // m_old = -inf on the first round: 0
        s_alpha[g] = alpha;
        s_l[g] = s_l[g] * alpha + sum;
        s_m[g] = m_new;
      }
    }
    __syncthreads();
    // 3. acc = acc * alpha + Σ p · V, warp w takes keys w, w + 4, ...; lane owns DPL dims.
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < group) {
        const float a = s_alpha[g];
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[g][e] *= a;
      }
    }
#pragma unroll 4
    for (int kk = warp; kk < tn; kk += kDecodeWarps) {
      const int j = t0 + kk;
      const char* vrow = cache_row(p.cache, pt[j / p.cache.page_size], j % p.cache.page_size, kvh, HD, true);
      float v[DPL];
      if constexpr (kFp8Kv) {
        uint32_t raw = 0;
        if constexpr (DPL == 4)
          raw = *reinterpret_cast<const uint32_t*>(vrow + lane * 4);
        else
          raw = *reinterpret_cast<const uint16_t*>(vrow + lane * 2);
#pragma unroll
        for (int e = 0; e < DPL; ++e) v[e] = fp8_e4m3_to_float_dev(static_cast<uint8_t>(raw >> (8 * e)));
      } else if constexpr (DPL == 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(vrow + lane * 8);
        const float2 a = __bfloat1622float2(*reinterpret_cast<const bf162*>(&raw.x));
        const float2 b = __bfloat1622float2(*reinterpret_cast<const bf162*>(&raw.y));
        v[0] = a.x;
        v[1] = a.y;
        v[DPL > 2 ? 2 : 0] = b.x;
        v[DPL > 3 ? 3 : 0] = b.y;
      } else {
        const float2 a = __bfloat1622float2(*reinterpret_cast<const bf162*>(vrow + lane * 4));
        v[0] = a.x;
        v[DPL > 1 ? 1 : 0] = a.y;
      }
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          const float pw = sc[g][kk];
#pragma unroll
          for (int e = 0; e < DPL; ++e) acc[g][e] += pw * v[e];
        }
      }
    }
    __syncthreads();  // sc is rewritten by the next round
  }

  // Reduce the warps' accumulators, then write the output (one split) or the partial.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
#pragma unroll
      for (int e = 0; e < DPL; ++e) red[warp][g][lane * DPL + e] = acc[g][e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < group * HD; i += kDecodeWarps * 32) {
    const int g = i / HD, d = i % HD;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) o += red[w][g][d];
    const int h = kvh * group + g;
    if (p.splits == 1) {
      const float l = s_l[g];
      p.out[static_cast<int64_t>(row) * p.hq * HD + h * HD + d] = __float2bfloat16_rn(l > 0.0f ? o / l : 0.0f);
    } else {
      float* part_out = p.partial + ((static_cast<int64_t>(seq) * p.hq + h) * p.splits + split) * (HD + 2);
      part_out[d] = o;
      if (d == 0) {
        part_out[HD] = s_m[g];
        part_out[HD + 1] = s_l[g];
      }
    }
  }
  if (p.splits == 1) return;

  // The last of this (sequence, kv head)'s active splits to arrive merges them (threadfence
  // reduction): partials are made visible device-wide before the arrival is counted, and the
  // merger reads them from L2 (ld.cg), never from a stale L1 line.
  __shared__ bool s_last;
  __threadfence();
  __syncthreads();
  const int active = max(1, min(p.splits, (ctx + len - 1) / len));
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(&p.counters[seq * p.hkv + kvh], 1u);
    s_last = arrived == static_cast<uint32_t>(active - 1);
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < group * HD; i += kDecodeWarps * 32) {
    const int g = i / HD, d = i % HD;
    const int h = kvh * group + g;
    const float* base = p.partial + (static_cast<int64_t>(seq) * p.hq + h) * p.splits * (HD + 2);
    float mmax = -INFINITY;
    for (int sp = 0; sp < active; ++sp) mmax = fmaxf(mmax, __ldcg(base + sp * (HD + 2) + HD));
    float total = 0.0f, o = 0.0f;
    for (int sp = 0; sp < active; ++sp) {
      const float m = __ldcg(base + sp * (HD + 2) + HD);
      if (m == -INFINITY) continue;
      const float f = exp2f(m - mmax);
      total += __ldcg(base + sp * (HD + 2) + HD + 1) * f;
      o += __ldcg(base + sp * (HD + 2) + d) * f;
    }
    p.out[static_cast<int64_t>(row) * p.hq * HD + h * HD + d] = __float2bfloat16_rn(total > 0.0f ? o / total : 0.0f);
  }
  if (threadIdx.x == 0) p.counters[seq * p.hkv + kvh] = 0;  // ready for the next step (and graph replay)
}

void check_batch(const TextBatch& b) {
  QVL_CHECK(b.query_start.dtype == DType::kI32 && b.query_start.numel() == b.num_seqs + 1)
      << "query_start " << b.query_start.describe() << " for " << b.num_seqs << " sequences";
  QVL_CHECK(b.context_len.dtype == DType::kI32 && b.context_len.numel() == b.num_seqs)
      << "context_len " << b.context_len.describe();
  QVL_CHECK(b.page_table.dtype == DType::kI32 && b.page_table.numel() == int64_t{b.num_seqs} * b.max_pages_per_seq)
      << "page_table " << b.page_table.describe() << " for " << b.num_seqs << " x " << b.max_pages_per_seq;
}

}  // namespace

// Generic fallbacks (attention_generic.cu) for head dims the fast kernels do not cover.
void launch_text_attention_generic(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale);

void configure_text_attention() {
  configure_prefill<64, false>();
  configure_prefill<128, false>();
  configure_prefill<64, true>();
  configure_prefill<128, true>();
}

void launch_text_qkv_prepare(const LaunchContext& ctx, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm,
                             float eps, const MropeParams& rope, const TextBatch& batch, const KvCacheView& cache,
                             int layer, const TextAttentionShape& shape) {
  QVL_CHECK(qkv.dtype == DType::kBF16) << qkv.describe();
  QVL_CHECK(q_norm.dtype == k_norm.dtype && (q_norm.dtype == DType::kBF16 || q_norm.dtype == DType::kF32))
      << "q_norm " << q_norm.describe() << ", k_norm " << k_norm.describe();
  QVL_CHECK_EQ(q_norm.numel(), shape.head_dim);
  QVL_CHECK_EQ(k_norm.numel(), shape.head_dim);
  QVL_CHECK(shape.head_dim % 2 == 0 && shape.head_dim <= 256) << "head_dim " << shape.head_dim;
  QVL_CHECK_EQ(rope.half, shape.head_dim / 2);
  QVL_CHECK_EQ(qkv.dim(0), batch.num_tokens);
  QVL_CHECK_EQ(qkv.row_numel(), int64_t{shape.num_q_heads + 2 * shape.num_kv_heads} * shape.head_dim);
  QVL_CHECK(batch.positions.dtype == DType::kI32 && batch.positions.numel() == int64_t{batch.num_tokens} * 3)
      << "positions " << batch.positions.describe();
  QVL_CHECK(batch.slots.dtype == DType::kI32 && batch.slots.numel() == batch.num_tokens)
      << "slots " << batch.slots.describe();
  QVL_CHECK_EQ(cache.num_kv_heads, shape.num_kv_heads);
  QVL_CHECK_EQ(cache.head_dim, shape.head_dim);
  auto go = [&](auto tag) {
    using W = decltype(tag);
    PrepareParams<W> p{qkv.as<bf16>(),
                       q_norm.as<W>(),
                       k_norm.as<W>(),
                       batch.positions.as<int32_t>(),
                       batch.slots.as<int32_t>(),
                       geometry(cache, layer),
                       eps,
                       shape.num_q_heads,
                       shape.num_kv_heads,
                       shape.head_dim};
    const unsigned head_groups = ceil_div(shape.num_q_heads + 2 * shape.num_kv_heads, kPrepareWarps);
    launch(ctx, "text_qkv_prepare", qkv_prepare_kernel<W>, dim3(batch.num_tokens, head_groups),
           dim3(kPrepareWarps * 32), 0, p, rope);
  };
  if (q_norm.dtype == DType::kBF16)
    go(bf16{});
  else
    go(float{});
}

void launch_text_prefill_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale) {
  check_batch(batch);
  QVL_CHECK(out.dtype == DType::kBF16 && qkv.dtype == DType::kBF16) << out.describe() << ", " << qkv.describe();
  QVL_CHECK_EQ(out.dim(0), batch.num_tokens);
  QVL_CHECK_EQ(out.row_numel(), int64_t{shape.num_q_heads} * shape.head_dim);
  QVL_CHECK_EQ(shape.num_q_heads % shape.num_kv_heads, 0);
  const int hd = shape.head_dim;
  if (hd != 64 && hd != 128) {
    launch_text_attention_generic(ctx, out, qkv, batch, cache, layer, shape, scale);
    return;
  }
  PagedParams prm{qkv.as<bf16>(),
                  out.as<bf16>(),
                  batch.query_start.as<int32_t>(),
                  batch.context_len.as<int32_t>(),
                  batch.page_table.as<int32_t>(),
                  geometry(cache, layer),
                  batch.num_seqs,
                  batch.max_pages_per_seq,
                  shape.num_q_heads,
                  shape.num_kv_heads};
  const bool fp8 = cache.dtype == DType::kF8E4M3;
  if (hd == 64)
    fp8 ? run_prefill<64, true>(ctx, prm, batch.num_tokens, scale)
        : run_prefill<64, false>(ctx, prm, batch.num_tokens, scale);
  else
    fp8 ? run_prefill<128, true>(ctx, prm, batch.num_tokens, scale)
        : run_prefill<128, false>(ctx, prm, batch.num_tokens, scale);
}

void launch_text_decode_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                  const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale,
                                  float* partial, size_t partial_bytes, uint32_t* counters) {
  check_batch(batch);
  QVL_CHECK_EQ(batch.num_tokens, batch.num_seqs) << "decode attention takes one row per sequence";
  QVL_CHECK(out.dtype == DType::kBF16 && qkv.dtype == DType::kBF16) << out.describe() << ", " << qkv.describe();
  QVL_CHECK_EQ(out.dim(0), batch.num_tokens);
  QVL_CHECK_EQ(out.row_numel(), int64_t{shape.num_q_heads} * shape.head_dim);
  QVL_CHECK_EQ(shape.num_q_heads % shape.num_kv_heads, 0);
  const int hd = shape.head_dim, group = shape.num_q_heads / shape.num_kv_heads;
  if ((hd != 64 && hd != 128) || group > kMaxGroup) {
    launch_text_attention_generic(ctx, out, qkv, batch, cache, layer, shape, scale);
    return;
  }
  int splits = kDecodeSplitBlocks / std::max(1, batch.num_seqs * shape.num_kv_heads);
  splits = std::clamp(splits, 1, kDecodeMaxSplits);
  if (splits > 1) {
    const size_t need = static_cast<size_t>(batch.num_seqs) * shape.num_q_heads * splits * (hd + 2) * sizeof(float);
    QVL_CHECK_LE(need, partial_bytes) << "decode attention scratch (raise CudaBackendOptions::max_gqa_group / "
                                         "max_head_dim)";
    QVL_CHECK_LE(batch.num_seqs * shape.num_kv_heads, kDecodeSplitBlocks);
  }
  DecodeParams p{qkv.as<bf16>(),
                 out.as<bf16>(),
                 partial,
                 counters,
                 batch.query_start.as<int32_t>(),
                 batch.context_len.as<int32_t>(),
                 batch.page_table.as<int32_t>(),
                 geometry(cache, layer),
                 batch.max_pages_per_seq,
                 shape.num_q_heads,
                 shape.num_kv_heads,
                 splits,
                 scale * 1.4426950408889634f};
  const dim3 grid(static_cast<unsigned>(batch.num_seqs * shape.num_kv_heads), static_cast<unsigned>(splits));
  const dim3 block(kDecodeWarps * 32);
  if (cache.dtype == DType::kF8E4M3) {
    if (hd == 64)
      launch(ctx, "text_decode_attention", decode_kernel<64, true>, grid, block, 0, p);
    else
      launch(ctx, "text_decode_attention", decode_kernel<128, true>, grid, block, 0, p);
  } else {
    if (hd == 64)
      launch(ctx, "text_decode_attention", decode_kernel<64, false>, grid, block, 0, p);
    else
      launch(ctx, "text_decode_attention", decode_kernel<128, false>, grid, block, 0, p);
  }
}

}  // namespace qvl::cuda
