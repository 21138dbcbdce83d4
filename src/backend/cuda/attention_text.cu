// Text attention over the paged KV cache:
// - text_qkv_prepare: per token, RMSNorm of every q and k head (q_norm/k_norm), interleaved
//   M-RoPE, K and V stored at the token's slot; q rotated in place. Two kernels with identical
//   results: one block per token (head dims 64 / 128) and one per (token, 8 heads) (any).
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

// Head dims 64 and 128 (every Qwen3-VL text model): one block per token, 8 warps over all its
// heads. The token's host-written inputs (positions -> cos/sin, slot) and the norm weights are
// read before the PDL wait; each warp then issues the loads of up to kPrepareBatch heads at
// once and works on them from registers. Lane l holds dims d = l + 32 i (i < HD/32), so a
// rotary partner d ± HD/2 is in the same lane, and the sum of squares adds the same values in
// the same order as qkv_prepare_kernel: the two kernels write identical bits (GPU test).
// (qkv_prepare_kernel: 19.3 us for 802 tokens of 2B on an H100, with cos/sin computed by each
// of a token's 4 blocks and one dependent load chain per warp.)
constexpr int kPrepareBatch = 6;

template <typename W, int HD>
__global__ void __launch_bounds__(kPrepareWarps * 32)
    qkv_prepare_token_kernel(const PrepareParams<W> p, const __grid_constant__ MropeParams rope) {
  constexpr int kHalf = HD / 2, E = HD / 32;
  static_assert(kHalf % 32 == 0, "rotary partners must share a lane");
  __shared__ float cos_s[kHalf], sin_s[kHalf];
  const int tok = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // cos/sin of this token's M-RoPE angles, rounded to bf16 like the reference's cos/sin.
  for (int j = threadIdx.x; j < kHalf; j += blockDim.x) {
    const float pos = static_cast<float>(p.positions[tok * 3 + rope.axis[j]]);
    const float f = pos * rope.inv_freq[j];
    cos_s[j] = bf16_round(cosf(f));
    sin_s[j] = bf16_round(sinf(f));
  }
  const int32_t slot = p.slots[tok];
  float wq[E], wk[E];
#pragma unroll
  for (int i = 0; i < E; ++i) {
    wq[i] = static_cast<float>(p.q_norm[lane + 32 * i]);
    wk[i] = static_cast<float>(p.k_norm[lane + 32 * i]);
  }
  grid_dep_wait();
  grid_dep_launch();
  const int heads = p.hq + 2 * p.hkv;
  bf16* row = p.qkv + tok * static_cast<int64_t>(heads) * HD;
  const int32_t page = slot >= 0 ? slot / p.cache.page_size : 0;
  const int off = slot >= 0 ? slot % p.cache.page_size : 0;
  float x[kPrepareBatch][E];
  // Heads h0, h0 + 8, ... (kPrepareBatch of them) of warp w: h0 = w, w + 8·kPrepareBatch, ...
  auto load = [&](int h0) {
#pragma unroll
    for (int k = 0; k < kPrepareBatch; ++k) {
      const int hh = h0 + k * kPrepareWarps;
#pragma unroll
      for (int i = 0; i < E; ++i)
        x[k][i] = hh < heads ? __bfloat162float(row[static_cast<int64_t>(hh) * HD + lane + 32 * i]) : 0.0f;
    }
  };
  load(warp);
  __syncthreads();  // cos_s / sin_s
  for (int h0 = warp; h0 < heads; h0 += kPrepareWarps * kPrepareBatch) {
    if (h0 != warp) load(h0);
#pragma unroll
    for (int k = 0; k < kPrepareBatch; ++k) {
      const int hh = h0 + k * kPrepareWarps;
      if (hh >= heads) break;
      bf16* src = row + static_cast<int64_t>(hh) * HD;
      if (hh >= p.hq + p.hkv) {  // v: copy into the cache
        if (slot < 0) continue;
        char* dst = cache_row(p.cache, page, off, hh - p.hq - p.hkv, HD, true);
#pragma unroll
        for (int i = 0; i < E; ++i) store_kv(dst, lane + 32 * i, x[k][i], p.cache.esize);
        continue;
      }
      const bool is_q = hh < p.hq;
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < E; ++i) ss += x[k][i] * x[k][i];
      const float rstd = rsqrtf(warp_sum(ss) / static_cast<float>(p.hd) + p.eps);
      float b[E];
#pragma unroll
      for (int i = 0; i < E; ++i) b[i] = bf16_round((is_q ? wq[i] : wk[i]) * bf16_round(x[k][i] * rstd));
      char* kdst = !is_q && slot >= 0 ? cache_row(p.cache, page, off, hh - p.hq, HD, false) : nullptr;
#pragma unroll
      for (int i = 0; i < E; ++i) {
        const int d = lane + 32 * i;
        const int j = i < E / 2 ? d : d - kHalf;
        const float rot = i < E / 2 ? -b[i + E / 2] : b[i - E / 2];
        const float out = bf16_round(b[i] * cos_s[j]) + bf16_round(rot * sin_s[j]);
        if (is_q)
          src[d] = __float2bfloat16_rn(out);  // q stays in qkv, rotated in place
        else if (kdst)
          store_kv(kdst, d, out, p.cache.esize);
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
// of the 2 that shared memory allowed.
template <int HD, bool kFp8Kv, int SPLIT, bool QA>
constexpr auto prefill_kernel() {
  return flash::flash_kernel < HD, kPrefillWarps, Bound<HD, Paged<kFp8Kv>>, QA ? 3 : 1, SPLIT, 1, QA > ;
}

template <int HD, bool kFp8Kv, bool QA>
void run_prefill_qa(const LaunchContext& ctx, PagedParams prm, int num_tokens, int split, float scale) {
  constexpr size_t smem = flash::smem_bytes<HD, kPrefillWarps, 1, QA>();
  // One query tile per 64 rows of each sequence: at most num_tokens / 64 + one partial tile per
  // sequence (blocks past the last tile return).
  const unsigned tiles = ceil_div(num_tokens, 16 * kPrefillWarps) + static_cast<unsigned>(prm.num_seqs);
  prm.grid_tiles = static_cast<int>(tiles);
  const dim3 block(kPrefillWarps * 32);
  const float scale_log2 = scale * 1.4426950408889634f;
  const char* name = "text_prefill_attention";
  if (split == 4)
    launch_clustered(ctx, name, 4, prefill_kernel<HD, kFp8Kv, 4, QA>(), dim3(tiles * 4, prm.hq), block, smem, prm,
                     scale_log2);
  else if (split == 2)
    launch_clustered(ctx, name, 2, prefill_kernel<HD, kFp8Kv, 2, QA>(), dim3(tiles * 2, prm.hq), block, smem, prm,
                     scale_log2);
  else
    launch(ctx, name, prefill_kernel<HD, kFp8Kv, 1, QA>(), dim3(tiles, prm.hq), block, smem, prm, scale_log2);
}

template <int HD, bool kFp8Kv>
void run_prefill(const LaunchContext& ctx, const PagedParams& prm, int num_tokens, int split, float scale) {
  if (ctx.prefill_q_alias)
    run_prefill_qa<HD, kFp8Kv, true>(ctx, prm, num_tokens, split, scale);
  else
    run_prefill_qa<HD, kFp8Kv, false>(ctx, prm, num_tokens, split, scale);
}

template <int HD, bool kFp8Kv, bool QA>
void configure_prefill_qa() {
  constexpr int smem = static_cast<int>(flash::smem_bytes<HD, kPrefillWarps, 1, QA>());
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(prefill_kernel<HD, kFp8Kv, 1, QA>(), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(prefill_kernel<HD, kFp8Kv, 2, QA>(), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  QVL_CUDA_CHECK(
      cudaFuncSetAttribute(prefill_kernel<HD, kFp8Kv, 4, QA>(), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

template <int HD, bool kFp8Kv>
void configure_prefill() {
  configure_prefill_qa<HD, kFp8Kv, false>();
  configure_prefill_qa<HD, kFp8Kv, true>();
}

}  // namespace

// Generic fallbacks (attention_generic.cu) for head dims the fast kernels do not cover.
void launch_text_attention_generic(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale);

void configure_text_attention() {
  configure_decode_attention();
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
    const dim3 block(kPrepareWarps * 32);
    if (ctx.token_prepare && shape.head_dim == 128) {
      launch(ctx, "text_qkv_prepare", qkv_prepare_token_kernel<W, 128>, dim3(batch.num_tokens), block, 0, p, rope);
    } else if (ctx.token_prepare && shape.head_dim == 64) {
      launch(ctx, "text_qkv_prepare", qkv_prepare_token_kernel<W, 64>, dim3(batch.num_tokens), block, 0, p, rope);
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
