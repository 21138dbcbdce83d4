// Text attention over the paged KV cache:
// - text_qkv_prepare: per token, RMSNorm of every q and k head (q_norm/k_norm), interleaved
//   M-RoPE, K and V stored at the token's slot; q rotated in place. Two kernels with identical
//   results: 16-byte vectors, 4 tokens per block (head dims 64 / 128) and one block per
//   (token, 8 heads) (any).
// - prefill (rows per sequence > 1): the flash core (flash.cuh) with K/V rows gathered from
//   pages by cp.async, causal: a row at absolute position p sees cache tokens [0, p]; on sm_90+
//   each query tile's keys are split over a cluster of 1, 2 or 4 blocks (prefill_split).
// - decode (one row per sequence): attention_decode.cu.
//
// Cache layout (backend.h KvCacheView): page p, layer l, K then V, each [page_size, Hkv, dh].
#include <algorithm>

#include "backend/cuda/attention_cache.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/flash.cuh"

namespace qvl::cuda {
namespace {

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

// Any head dim: one block per (token, group of 8 heads): the token's cos/sin in shared memory,
// one head per warp. (A warp-per-head variant that recomputes cos/sin per head measured 29 us
// against 19 us for an 802-token prefill of 2B; decode batches run this fused into the
// attention kernel.)
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

// Head dims 64 and 128 (every Qwen3-VL text model): 16-byte accesses. A group of G = HD/16
// lanes works one head: lane j holds dims [8j, 8j+8) and their rotary partners [HD/2 + 8j, ...),
// as two 16-byte vectors, so a warp works 32/G heads at once and every load and store is 16
// bytes (8 for an FP8 cache). A block of 8 warps takes kVecTokens tokens (their cos/sin, slots and
// the norm weights are read before the PDL wait: host-written or constant) and issues the loads of
// up to kVecBatch heads per group before working on them. (The one-block-per-token kernel this
// replaced, with 2-byte accesses and a serial chain per block, took 20.6 us for 802 tokens of 2B on
// an H100 under ncu.)
//
// The sum of squares is the one qkv_prepare_kernel computes, in its order: that kernel's lane l
// sums dims l, l+32, ... one after the other and then reduces over the 32 lanes by xor
// 16, 8, 4, 2, 1. Here the dims of "lane l" sit in lanes j = l/8 (and j + 4 at head dim 128) of
// the group, element l % 8; the partner values come over by shuffles, the xor-16 and xor-8
// steps are shuffles inside the group and xor 4, 2, 1 are register pairs. Every element then
// goes through the same roundings, so the two kernels write the same bits (GPU test), and so
// does the decode attention's fused prepare, which sums in the per-8-heads kernel's order too.
constexpr int kVecTokens = 4;
constexpr int kVecBatch = 4;

// 8 values as an FP8 cache stores them (store_kv: rounded to BF16 first), 8 bytes.
__device__ __forceinline__ uint2 pack8_fp8(const float (&f)[8]) {
  uint2 v;
  uint8_t* b = reinterpret_cast<uint8_t*>(&v);
#pragma unroll
  for (int e = 0; e < 8; ++e) b[e] = float_to_fp8_e4m3_dev(bf16_round(f[e]));
  return v;
}

template <typename W>
__device__ __forceinline__ void load8f(const W* w, int i, float (&f)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = static_cast<float>(w[i + e]);
}

// The reduction above for one head: lo/hi = the lane's squares' operands (dims 8j+e, HD/2+8j+e).
template <int HD>
__device__ __forceinline__ float group_sum_squares(const float (&lo)[8], const float (&hi)[8]) {
  float v[8];
  if constexpr (HD == 64) {  // lane j < 4: l = 8j + e; dims l and l + 32 both here
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      float p = 0.0f;
      p += lo[e] * lo[e];
      p += hi[e] * hi[e];
      v[e] = p;
    }
  } else {  // HD 128: l = 8(j % 4) + e; dims l, l+32 (lo of j, j+4), l+64, l+96 (hi of j, j+4)
    const int lane = threadIdx.x & 31;
    const bool upper = (lane & 4) != 0;  // j >= 4: the mirror of j - 4 (same sums)
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float olo = __shfl_xor_sync(0xffffffffu, lo[e], 4);
      const float ohi = __shfl_xor_sync(0xffffffffu, hi[e], 4);
      const float a = upper ? olo : lo[e], b = upper ? lo[e] : olo;  // x_l, x_{l+32}
      const float c = upper ? ohi : hi[e], d = upper ? hi[e] : ohi;  // x_{l+64}, x_{l+96}
      float p = 0.0f;
      p += a * a;
      p += b * b;
      p += c * c;
      p += d * d;
      v[e] = p;
    }
  }
  // xor 16 and 8 of "lane l" = lanes j^2 and j^1 of the group; xor 4, 2, 1 = elements e^4, e^2, e^1.
#pragma unroll
  for (int o = 2; o > 0; o >>= 1) {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] += __shfl_xor_sync(0xffffffffu, v[e], o);
  }
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) {
    float nv[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) nv[e] = v[e] + v[e ^ o];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = nv[e];
  }
  return v[0];
}

template <typename W, int HD>
__global__ void __launch_bounds__(kPrepareWarps * 32)
    qkv_prepare_vec_kernel(const PrepareParams<W> p, const __grid_constant__ MropeParams rope, int num_tokens) {
  constexpr int HALF = HD / 2, G = HD / 16, GPW = 32 / G, GROUPS = kPrepareWarps * GPW;
  static_assert(HD == 64 || HD == 128, "head dims 64 and 128");
  __shared__ float cos_s[kVecTokens][HALF], sin_s[kVecTokens][HALF];
  __shared__ int32_t slot_s[kVecTokens];
  const int tok0 = blockIdx.x * kVecTokens;
  for (int i = threadIdx.x; i < kVecTokens * HALF; i += blockDim.x) {
    const int t = i / HALF, j = i % HALF, tok = min(tok0 + t, num_tokens - 1);
    const float f = static_cast<float>(p.positions[tok * 3 + rope.axis[j]]) * rope.inv_freq[j];
    cos_s[t][j] = bf16_round(cosf(f));
    sin_s[t][j] = bf16_round(sinf(f));
  }
  if (threadIdx.x < kVecTokens)
    slot_s[threadIdx.x] = tok0 + threadIdx.x < num_tokens ? p.slots[tok0 + threadIdx.x] : -1;
  const int lane = threadIdx.x & 31, j = lane % G;
  const int group = (threadIdx.x >> 5) * GPW + lane / G;
  float wq_lo[8], wq_hi[8], wk_lo[8], wk_hi[8];
  load8f(p.q_norm, 8 * j, wq_lo);
  load8f(p.q_norm, HALF + 8 * j, wq_hi);
  load8f(p.k_norm, 8 * j, wk_lo);
  load8f(p.k_norm, HALF + 8 * j, wk_hi);
  grid_dep_wait();
  grid_dep_launch();
  __syncthreads();  // cos_s, sin_s, slot_s
  const int heads = p.hq + 2 * p.hkv, tasks = kVecTokens * heads;
  const int64_t ld = static_cast<int64_t>(heads) * HD;
  // Every lane of a warp runs the same iterations (the shuffles need them all); tasks past the
  // end, or of tokens past the last, compute on zeros and store nothing.
  for (int base = 0; base < tasks; base += GROUPS * kVecBatch) {
    uint4 raw_lo[kVecBatch], raw_hi[kVecBatch];
#pragma unroll
    for (int k = 0; k < kVecBatch; ++k) {
      const int task = base + k * GROUPS + group, t = task / heads, hh = task % heads;
      const bool ok = task < tasks && tok0 + t < num_tokens;
      const bf16* src = p.qkv + (tok0 + t) * ld + hh * HD;
      raw_lo[k] = ok ? *reinterpret_cast<const uint4*>(src + 8 * j) : make_uint4(0, 0, 0, 0);
      raw_hi[k] = ok ? *reinterpret_cast<const uint4*>(src + HALF + 8 * j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kVecBatch; ++k) {
      const int task = base + k * GROUPS + group, t = task / heads, hh = task % heads;
      const bool ok = task < tasks && tok0 + t < num_tokens;
      float lo[8], hi[8];
      unpack8(raw_lo[k], lo);
      unpack8(raw_hi[k], hi);
      const float total = group_sum_squares<HD>(lo, hi);  // every lane: the shuffles
      if (!ok) continue;
      const int32_t slot = slot_s[t];
      const int32_t page = slot >= 0 ? slot / p.cache.page_size : 0;
      const int off = slot >= 0 ? slot % p.cache.page_size : 0;
      bf16* src = p.qkv + (tok0 + t) * ld + hh * HD;
      if (hh >= p.hq + p.hkv) {  // v: into the cache as it is
        if (slot < 0) continue;
        char* dst = cache_row(p.cache, page, off, hh - p.hq - p.hkv, HD, true);
        if (p.cache.esize == 2) {
          *reinterpret_cast<uint4*>(dst + 16 * j) = raw_lo[k];
          *reinterpret_cast<uint4*>(dst + 2 * HALF + 16 * j) = raw_hi[k];
        } else {
          *reinterpret_cast<uint2*>(dst + 8 * j) = pack8_fp8(lo);
          *reinterpret_cast<uint2*>(dst + HALF + 8 * j) = pack8_fp8(hi);
        }
        continue;
      }
      const bool is_q = hh < p.hq;
      const float rstd = rsqrtf(total / static_cast<float>(HD) + p.eps);
      float out_lo[8], out_hi[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float bl = bf16_round((is_q ? wq_lo[e] : wk_lo[e]) * bf16_round(lo[e] * rstd));
        const float bh = bf16_round((is_q ? wq_hi[e] : wk_hi[e]) * bf16_round(hi[e] * rstd));
        const float c = cos_s[t][8 * j + e], sn = sin_s[t][8 * j + e];
        out_lo[e] = bf16_round(bl * c) + bf16_round(-bh * sn);
        out_hi[e] = bf16_round(bh * c) + bf16_round(bl * sn);
      }
      if (is_q) {  // q stays in qkv, rotated in place
        *reinterpret_cast<uint4*>(src + 8 * j) = pack8(out_lo);
        *reinterpret_cast<uint4*>(src + HALF + 8 * j) = pack8(out_hi);
        continue;
      }
      if (slot < 0) continue;
      char* dst = cache_row(p.cache, page, off, hh - p.hq, HD, false);
      if (p.cache.esize == 2) {
        *reinterpret_cast<uint4*>(dst + 16 * j) = pack8(out_lo);
        *reinterpret_cast<uint4*>(dst + 2 * HALF + 16 * j) = pack8(out_hi);
      } else {
        *reinterpret_cast<uint2*>(dst + 8 * j) = pack8_fp8(out_lo);
        *reinterpret_cast<uint2*>(dst + HALF + 8 * j) = pack8_fp8(out_hi);
      }
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
  int grid_tiles = 0;  // query tiles the grid covers (an upper bound: blocks past the last return)
};
template <int BM, bool kFp8Kv>
struct PagedPolicy {
  using Params = PagedParams;
  // Tiles are taken last first: a sequence's later query tiles see the most keys, so the
  // heaviest blocks start in the first wave and the light ones fill the tail.
  __device__ static bool locate(const Params& p, int idx, flash::Tile& t) {
    idx = p.grid_tiles - 1 - idx;
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
  __device__ static const KvElem* k_row(const Params& p, const flash::Tile& t, int j) {
    int off;
    const int32_t page = p.page_table[t.b * p.max_pages + page_index(p.cache, j, off)];
    return reinterpret_cast<const KvElem*>(cache_row(p.cache, page, off, t.head / (p.hq / p.hkv), HD, false));
  }
  // V of a token sits v_offset bytes after its K, in the same page.
  __device__ static int64_t kv_delta(const Params& p, const flash::Tile&) {
    return p.cache.v_offset / static_cast<int64_t>(sizeof(KvElem));
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
  __device__ static bool locate(const Params& p, int idx, flash::Tile& t) { return Pol::locate(p, idx, t); }
  __device__ static const bf16* q_row(const Params& p, const flash::Tile& t, int i) {
    return Pol::template q_row<HD>(p, t, i);
  }
  __device__ static auto k_row(const Params& p, const flash::Tile& t, int j) {
    return Pol::template k_row<HD>(p, t, j);
  }
  __device__ static int64_t kv_delta(const Params& p, const flash::Tile& t) { return Pol::kv_delta(p, t); }
  __device__ static bf16* o_row(const Params& p, const flash::Tile& t, int i) {
    return Pol::template o_row<HD>(p, t, i);
  }
};

constexpr int kPrefillWarps = 4;

template <bool kFp8Kv>
using Paged = PagedPolicy<16 * kPrefillWarps, kFp8Kv>;

// Key split of a causal query tile over a cluster (sm_90+, flash.cuh): the longest key range
// (max_context) in tiles of 64, shared so that no block scans more than
// LaunchContext::prefill_key_tiles (8) of them where a split of at most 4 allows. Every query
// tile of the launch gets the same split; a block whose causal share is empty only joins the
// merge. 802 tokens (13 tiles) on an H100, prefill ms with the bound at 2 / 4 / 8 / 16 (split
// 4 / 4 / 2 / 1): 6.45 / 6.46 / 6.35 / 6.81 (e4161b2, two runs each): a split of 2 balances the
// last query tile's serial scan against each block's fixed cost (Q load, merge, cluster wait).
int prefill_split(const LaunchContext& ctx, int max_context) {
  if (!ctx.clusters) return 1;
  const int tiles = static_cast<int>(ceil_div(std::max(max_context, 1), 64));
  const int most = std::max(ctx.prefill_key_tiles, 1);
  return tiles <= most ? 1 : tiles <= 2 * most ? 2 : 4;
}

// QA (LaunchContext::prefill_q_alias): Q shares a K stage (flash.cuh), 3 blocks per SM instead
// of the 2 that shared memory allowed. SMALL (LaunchContext::prefill_small_tiles): key tiles of 32,
// with Q through the two K stages (a BF16 cache) or in the K/V stage (FP8): 35.3 KB at head dim
// 128 (the cluster split's partial; the tiles take 34.8 / 33.8) where QA's 64-key layout takes
// 69.6 / 66.8, so that a 100 KB multiprocessor (sm_86 / 89 / 120) holds two blocks of 4 warps, not one.
template <int HD, bool kFp8Kv, int SPLIT, bool QA, bool SMALL>
constexpr auto prefill_kernel() {
  using Policy = Bound<HD, Paged<kFp8Kv>>;
  if constexpr (SMALL)
    return flash::flash_kernel<HD, kPrefillWarps, Policy, 2, SPLIT, 1, false, !kFp8Kv, 32>;
  else
    return flash::flash_kernel < HD, kPrefillWarps, Policy, QA ? 3 : 1, SPLIT, 1, QA > ;
}
template <int HD, bool kFp8Kv, bool QA, bool SMALL>
constexpr size_t prefill_smem() {
  if constexpr (SMALL)
    return flash::smem_bytes<HD, kPrefillWarps, 1, false, kFp8Kv, !kFp8Kv, 32>();
  else
    return flash::smem_bytes<HD, kPrefillWarps, 1, QA, kFp8Kv>();
}

template <int HD, bool kFp8Kv, bool QA, bool SMALL>
void run_prefill_qa(const LaunchContext& ctx, PagedParams prm, int num_tokens, int split, float scale) {
  constexpr size_t smem = prefill_smem<HD, kFp8Kv, QA, SMALL>();
  // One query tile per 64 rows of each sequence: at most num_tokens / 64 + one partial tile per
  // sequence (blocks past the last tile return).
  const unsigned tiles = ceil_div(num_tokens, 16 * kPrefillWarps) + static_cast<unsigned>(prm.num_seqs);
  prm.grid_tiles = static_cast<int>(tiles);
  const dim3 block(kPrefillWarps * 32);
  const float scale_log2 = scale * 1.4426950408889634f;
  const char* name = "text_prefill_attention";
  if (split == 4)
    launch_clustered(ctx, name, 4, prefill_kernel<HD, kFp8Kv, 4, QA, SMALL>(), dim3(tiles * 4, prm.hq), block, smem,
                     prm, scale_log2);
  else if (split == 2)
    launch_clustered(ctx, name, 2, prefill_kernel<HD, kFp8Kv, 2, QA, SMALL>(), dim3(tiles * 2, prm.hq), block, smem,
                     prm, scale_log2);
  else
    launch(ctx, name, prefill_kernel<HD, kFp8Kv, 1, QA, SMALL>(), dim3(tiles, prm.hq), block, smem, prm, scale_log2);
}

template <int HD, bool kFp8Kv>
void run_prefill(const LaunchContext& ctx, const PagedParams& prm, int num_tokens, int split, float scale) {
  // By default the small tiles where a multiprocessor holds one block of the 64-key layout (Q in
  // a K stage) but two of theirs.
  const bool small =
      take_compact_layout(ctx.prefill_small_tiles, ctx.smem_per_sm, prefill_smem<HD, kFp8Kv, true, false>(),
                          prefill_smem<HD, kFp8Kv, false, true>());
  if (small)
    run_prefill_qa<HD, kFp8Kv, false, true>(ctx, prm, num_tokens, split, scale);
  else if (ctx.prefill_q_alias)
    run_prefill_qa<HD, kFp8Kv, true, false>(ctx, prm, num_tokens, split, scale);
  else
    run_prefill_qa<HD, kFp8Kv, false, false>(ctx, prm, num_tokens, split, scale);
}

template <int HD, bool kFp8Kv, bool QA, bool SMALL>
void configure_prefill_qa() {
  constexpr int smem = static_cast<int>(prefill_smem<HD, kFp8Kv, QA, SMALL>());
  QVL_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<HD, kFp8Kv, 1, QA, SMALL>(),
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  QVL_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<HD, kFp8Kv, 2, QA, SMALL>(),
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  QVL_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<HD, kFp8Kv, 4, QA, SMALL>(),
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

template <int HD, bool kFp8Kv>
void configure_prefill() {
  configure_prefill_qa<HD, kFp8Kv, false, false>();
  configure_prefill_qa<HD, kFp8Kv, true, false>();
  configure_prefill_qa<HD, kFp8Kv, false, true>();
}

}  // namespace

// Generic fallbacks (attention_generic.cu) for head dims the fast kernels do not cover.
void launch_text_attention_generic(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale);

int configure_text_attention(bool clusters, bool non_portable_clusters) {
  const int decode_cluster = configure_decode_attention(clusters, non_portable_clusters);
  configure_prefill<64, false>();
  configure_prefill<128, false>();
  configure_prefill<64, true>();
  configure_prefill<128, true>();
  return decode_cluster;
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
    const dim3 block(kPrepareWarps * 32);
    const dim3 vec_grid(ceil_div(batch.num_tokens, kVecTokens));
    if (ctx.token_prepare && shape.head_dim == 128) {
      launch(ctx, "text_qkv_prepare", qkv_prepare_vec_kernel<W, 128>, vec_grid, block, 0, p, rope, batch.num_tokens);
    } else if (ctx.token_prepare && shape.head_dim == 64) {
      launch(ctx, "text_qkv_prepare", qkv_prepare_vec_kernel<W, 64>, vec_grid, block, 0, p, rope, batch.num_tokens);
    } else {
      const unsigned head_groups = ceil_div(shape.num_q_heads + 2 * shape.num_kv_heads, kPrepareWarps);
      launch(ctx, "text_qkv_prepare", qkv_prepare_kernel<W>, dim3(batch.num_tokens, head_groups), block, 0, p, rope);
    }
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
  if (launch_text_prefill_attention_wgmma(ctx, out, qkv, batch, cache, layer, shape, scale)) return;
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
  // max_context bounds every context_len; a batch that leaves it 0 bounds it by its page table.
  const int bound = batch.max_context > 0 ? batch.max_context : batch.max_pages_per_seq * cache.page_size;
  const int split = prefill_split(ctx, bound);
  if (hd == 64)
    fp8 ? run_prefill<64, true>(ctx, prm, batch.num_tokens, split, scale)
        : run_prefill<64, false>(ctx, prm, batch.num_tokens, split, scale);
  else
    fp8 ? run_prefill<128, true>(ctx, prm, batch.num_tokens, split, scale)
        : run_prefill<128, false>(ctx, prm, batch.num_tokens, split, scale);
}

}  // namespace qvl::cuda
