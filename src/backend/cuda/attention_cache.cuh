// Internal to the CUDA backend's text attention (attention_text.cu, attention_decode.cu,
// attention_generic.cu): where a token's K or V row of one layer lives in the paged cache
// (backend.h KvCacheView: page p, layer l, K then V, each [page_size, Hkv, dh]), and the batch
// checks the kernels rely on.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace qvl::cuda {

struct CacheGeometry {
  char* base = nullptr;
  int64_t page_bytes = 0;
  int64_t layer_offset = 0;  // layer * layer_bytes
  int64_t v_offset = 0;      // page_size * token_bytes
  int64_t token_bytes = 0;   // Hkv * dh * element size
  int page_size = 16;
  int page_shift = -1;  // log2(page_size) when it is a power of two (no division per lookup)
  int esize = 2;        // 2: BF16 cache, 1: FP8 E4M3 cache (saturated, no scale)
};

inline CacheGeometry geometry(const KvCacheView& cache, int layer) {
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
  QVL_CHECK_GT(cache.page_size, 0);
  if ((cache.page_size & (cache.page_size - 1)) == 0) {
    g.page_shift = 0;
    while ((1 << g.page_shift) < cache.page_size) ++g.page_shift;
  }
  g.esize = dtype_size(cache.dtype);
  return g;
}

// First byte of head `kvh` of token (page, off) of this layer's K (or V).
__device__ __forceinline__ char* cache_row(const CacheGeometry& c, int32_t page, int off, int kvh, int hd, bool v) {
  return c.base + page * c.page_bytes + c.layer_offset + (v ? c.v_offset : 0) + off * c.token_bytes +
         static_cast<int64_t>(kvh) * hd * c.esize;
}

// Token j of a sequence: its page's index in the sequence's page table; `off` = its offset there.
__device__ __forceinline__ int page_index(const CacheGeometry& c, int j, int& off) {
  if (c.page_shift >= 0) {
    off = j & (c.page_size - 1);
    return j >> c.page_shift;
  }
  off = j % c.page_size;
  return j / c.page_size;
}

// Element d of a cache row (BF16, or FP8 rounded from BF16 as an engine casting its bf16 K/V would).
__device__ __forceinline__ void store_kv(char* row, int d, float v, int esize) {
  if (esize == 2) {
    reinterpret_cast<bf16*>(row)[d] = __float2bfloat16_rn(v);
  } else {
    reinterpret_cast<uint8_t*>(row)[d] = float_to_fp8_e4m3_dev(bf16_round(v));
  }
}

inline void check_batch(const TextBatch& b) {
  QVL_CHECK(b.query_start.dtype == DType::kI32 && b.query_start.numel() == b.num_seqs + 1)
      << "query_start " << b.query_start.describe() << " for " << b.num_seqs << " sequences";
  QVL_CHECK(b.context_len.dtype == DType::kI32 && b.context_len.numel() == b.num_seqs)
      << "context_len " << b.context_len.describe();
  QVL_CHECK(b.page_table.dtype == DType::kI32 && b.page_table.numel() == int64_t{b.num_seqs} * b.max_pages_per_seq)
      << "page_table " << b.page_table.describe() << " for " << b.num_seqs << " x " << b.max_pages_per_seq;
}

}  // namespace qvl::cuda
