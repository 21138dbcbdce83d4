// Generic attention kernels for head dims the fast kernels do not cover (any even head_dim up
// to 256): one warp per (query row, head), keys visited one at a time with an online softmax
// in fp32. Slow (a warp reduction per key) but simple; real Qwen3-VL shapes never land here.
#include "backend/cuda/attention_cache.cuh"

namespace qvl::cuda {
namespace {

constexpr int kMaxPerLane = 8;  // head_dim <= 256

// Element d of a row of BF16 (esize 2) or FP8 E4M3 (esize 1) values.
__device__ __forceinline__ float elem(const void* row, int d, int esize) {
  return esize == 2 ? __bfloat162float(static_cast<const bf16*>(row)[d])
                    : fp8_e4m3_to_float_dev(static_cast<const uint8_t*>(row)[d]);
}

struct OnlineSoftmax {
  float m = -INFINITY, l = 0.0f;
  float acc[kMaxPerLane] = {};
  // Adds one key with score s (log2 domain) and value row v (lane-strided dims).
  __device__ void add(float s, const void* v, int hd, int lane, int esize = 2) {
    const float m_new = fmaxf(m, s);
    const float alpha = exp2f(m - m_new), p = exp2f(s - m_new);
    l = l * alpha + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) acc[i] = acc[i] * alpha + p * elem(v, d, esize);
    }
    m = m_new;
  }
  __device__ void store(bf16* out, int hd, int lane) const {
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) out[d] = __float2bfloat16_rn(l > 0.0f ? acc[i] / l : 0.0f);
    }
  }
};

__device__ __forceinline__ float dot_lanes(const float (&q)[kMaxPerLane], const void* k, int hd, int lane,
                                           int esize = 2) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) s += q[i] * elem(k, d, esize);
  }
  return warp_sum(s);
}

__global__ void vision_generic_kernel(bf16* out, const bf16* qkv, const int32_t* cu, int num_segments, int rows,
                                      int heads, int hd, float scale_log2) {
  grid_dep_wait();
  grid_dep_launch();
  const int lane = threadIdx.x & 31;
  const int64_t item = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (item >= static_cast<int64_t>(rows) * heads) return;
  const int r = static_cast<int>(item / heads), h = static_cast<int>(item % heads);
  int begin = 0, end = 0;
  for (int s = 0; s < num_segments; ++s)
    if (cu[s] <= r && r < cu[s + 1]) {
      begin = cu[s];
      end = cu[s + 1];
    }
  const int64_t ld = 3LL * heads * hd;
  float q[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < hd ? __bfloat162float(qkv[r * ld + h * hd + d]) : 0.0f;
  }
  OnlineSoftmax sm;
  for (int j = begin; j < end; ++j) {
    const float s = dot_lanes(q, qkv + j * ld + static_cast<int64_t>(heads + h) * hd, hd, lane) * scale_log2;
    sm.add(s, qkv + j * ld + static_cast<int64_t>(2 * heads + h) * hd, hd, lane);
  }
  sm.store(out + static_cast<int64_t>(r) * heads * hd + h * hd, hd, lane);
}

struct TextGenericParams {
  bf16* out;
  const bf16* qkv;
  const int32_t* query_start;
  const int32_t* context_len;
  const int32_t* page_table;
  CacheGeometry cache;
  int num_seqs, max_pages, rows, hq, hkv, hd;
  float scale_log2;
};

__global__ void text_generic_kernel(const TextGenericParams p) {
  grid_dep_wait();
  grid_dep_launch();
  const int lane = threadIdx.x & 31;
  const int64_t item = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  if (item >= static_cast<int64_t>(p.rows) * p.hq) return;
  const int r = static_cast<int>(item / p.hq), h = static_cast<int>(item % p.hq);
  int seq = -1;
  for (int s = 0; s < p.num_seqs; ++s)
    if (p.query_start[s] <= r && r < p.query_start[s + 1]) seq = s;
  bf16* out = p.out + static_cast<int64_t>(r) * p.hq * p.hd + h * p.hd;
  OnlineSoftmax sm;
  if (seq < 0) {
    sm.store(out, p.hd, lane);
    return;
  }
  const int qlen = p.query_start[seq + 1] - p.query_start[seq];
  const int pos = p.context_len[seq] - qlen + (r - p.query_start[seq]);
  const int kvh = h / (p.hq / p.hkv);
  const int64_t ld = static_cast<int64_t>(p.hq + 2 * p.hkv) * p.hd;
  float q[kMaxPerLane];
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int d = lane + 32 * i;
    q[i] = d < p.hd ? __bfloat162float(p.qkv[r * ld + h * p.hd + d]) : 0.0f;
  }
  const int32_t* pt = p.page_table + static_cast<int64_t>(seq) * p.max_pages;
  const CacheGeometry& c = p.cache;
  for (int j = 0; j <= pos; ++j) {
    const int32_t page = pt[j / c.page_size];
    const float s =
        dot_lanes(q, cache_row(c, page, j % c.page_size, kvh, p.hd, false), p.hd, lane, c.esize) * p.scale_log2;
    sm.add(s, cache_row(c, page, j % c.page_size, kvh, p.hd, true), p.hd, lane, c.esize);
  }
  sm.store(out, p.hd, lane);
}

}  // namespace

void launch_vision_attention_generic(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                                     int num_heads, int head_dim, float scale) {
  QVL_CHECK(head_dim <= 32 * kMaxPerLane) << "head_dim " << head_dim;
  const int rows = static_cast<int>(qkv.dim(0));
  const int64_t warps = static_cast<int64_t>(rows) * num_heads;
  launch(ctx, "vision_attention_generic", vision_generic_kernel, dim3(ceil_div(warps, 4)), dim3(128), 0, out.as<bf16>(),
         qkv.as<bf16>(), seg.cu_seqlens.as<int32_t>(), static_cast<int>(seg.host_cu_seqlens.size()) - 1, rows,
         num_heads, head_dim, scale * 1.4426950408889634f);
}

void launch_text_attention_generic(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale) {
  QVL_CHECK(shape.head_dim <= 32 * kMaxPerLane) << "head_dim " << shape.head_dim;
  TextGenericParams p{};
  p.out = out.as<bf16>();
  p.qkv = qkv.as<bf16>();
  p.query_start = batch.query_start.as<int32_t>();
  p.context_len = batch.context_len.as<int32_t>();
  p.page_table = batch.page_table.as<int32_t>();
  p.cache = geometry(cache, layer);  // checks the dtype and the layer
  p.num_seqs = batch.num_seqs;
  p.max_pages = batch.max_pages_per_seq;
  p.rows = batch.num_tokens;
  p.hq = shape.num_q_heads;
  p.hkv = shape.num_kv_heads;
  p.hd = shape.head_dim;
  p.scale_log2 = scale * 1.4426950408889634f;
  const int64_t warps = static_cast<int64_t>(p.rows) * p.hq;
  launch(ctx, "text_attention_generic", text_generic_kernel, dim3(ceil_div(warps, 4)), dim3(128), 0, p);
}

}  // namespace qvl::cuda
