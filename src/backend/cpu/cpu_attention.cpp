// CPU attention and rotary kernels: vision 2-D RoPE and segment attention, text q/k-norm +
// M-RoPE + paged KV store, and causal GQA attention over the paged cache. Plain two-pass
// softmax in fp32 (max-subtracted scores, then the weighted sum of V), one (query row, head
// group) per task.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"

namespace qvl::cpu {
namespace {

// Per-thread score buffer, grown on demand and kept (the oracle does not plan this memory).
float* score_buffer(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// x' = x·cos + rotate_half(x)·sin with rotate_half(x) = (−x[h:], x[:h]), h = n/2.
void rotate(float* x, const float* cos, const float* sin, int n) {
  const int h = n / 2;
  for (int d = 0; d < h; ++d) {
    float a = x[d], b = x[d + h];
    x[d] = a * cos[d] - b * sin[d];
    x[d + h] = b * cos[d + h] + a * sin[d + h];
  }
}

void rms_normalize(float* x, const float* w, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) x[i] = w[i] * (x[i] * r);
}

// Softmax of s[0..n) in place; returns nothing, s becomes probabilities.
void softmax(float* s, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, s[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - m);
    sum += s[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) s[i] *= inv;
}

void store_kv(const float* src, void* dst, DType dt, int64_t n) {
  if (dt == DType::kF32) {
    std::memcpy(dst, src, n * sizeof(float));
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
  }
}

void load_kv(const void* src, DType dt, int64_t n, float* dst) {
  if (dt == DType::kF32)
    std::memcpy(dst, src, n * sizeof(float));
  else
    to_f32(src, DType::kBF16, 0, n, dst);
}

}  // namespace

void vision_rope(int threads, Tensor qkv, const Tensor& rope, int nh, int dh) {
  check_f32(qkv, "vision_rope qkv");
  QVL_CHECK(rope.dtype == DType::kF32 && rope.numel() == qkv.dim(0) * 2 * dh) << "rope " << rope.describe();
  QVL_CHECK_EQ(qkv.row_numel(), 3LL * nh * dh);
  const int64_t N = qkv.dim(0), width = 3LL * nh * dh;
  float* base = qkv.as<float>();
  const float* table = rope.as<const float>();
#pragma omp parallel for schedule(static) num_threads(threads) if (N * width >= kParallelMinWork)
  for (int64_t i = 0; i < N; ++i) {
    const float* cos = table + i * 2 * dh;
    const float* sin = cos + dh;
    for (int part = 0; part < 2; ++part)  // q then k
      for (int h = 0; h < nh; ++h) rotate(base + i * width + (part * nh + h) * dh, cos, sin, dh);
  }
}

void vision_attention(int threads, Tensor out, const Tensor& qkv, const VisionSegments& seg, int nh, int dh,
                      float scale) {
  check_f32(qkv, "vision_attention qkv");
  check_f32(out, "vision_attention out");
  const int64_t N = qkv.dim(0), width = 3LL * nh * dh;
  QVL_CHECK_EQ(qkv.row_numel(), width);
  QVL_CHECK_EQ(out.numel(), N * nh * dh);
  const std::vector<int32_t>& cu = seg.host_cu_seqlens;
  QVL_CHECK(cu.size() >= 2 && cu.front() == 0 && cu.back() == N) << "cu_seqlens do not cover the " << N << " rows";
  const float* in = qkv.as<const float>();
  float* o = out.as<float>();

  // Tasks: (query row, head); the row's segment is found by binary search.
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads)
  for (int64_t task = 0; task < N * nh; ++task) {
    const int64_t i = task / nh;
    const int h = static_cast<int>(task % nh);
    const auto it = std::upper_bound(cu.begin(), cu.end(), static_cast<int32_t>(i));
    const int64_t begin = *(it - 1), end = *it, len = end - begin;
    float* s = score_buffer(len);
    const float* q = in + i * width + h * dh;
    for (int64_t j = 0; j < len; ++j) s[j] = dot(q, in + (begin + j) * width + (nh + h) * dh, dh) * scale;
    softmax(s, len);
    float* dst = o + i * nh * dh + h * dh;
    std::fill(dst, dst + dh, 0.0f);
    for (int64_t j = 0; j < len; ++j) {
      const float* v = in + (begin + j) * width + (2 * nh + h) * dh;
      for (int d = 0; d < dh; ++d) dst[d] += s[j] * v[d];
    }
  }
}

void text_qkv_prepare(int threads, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                      const MropeSpec& rope, const TextBatch& batch, const KvCacheView& cache, int layer,
                      const TextAttentionShape& shape) {
  check_f32(qkv, "text_qkv_prepare qkv");
  const int hq = shape.num_q_heads, hkv = shape.num_kv_heads, dh = shape.head_dim;
  const int64_t n = batch.num_tokens, width = static_cast<int64_t>(hq + 2 * hkv) * dh;
  QVL_CHECK_EQ(qkv.dim(0), n);
  QVL_CHECK_EQ(qkv.row_numel(), width);
  QVL_CHECK(static_cast<int>(rope.inv_freq.size()) == dh / 2 && rope.axis.size() == rope.inv_freq.size());
  QVL_CHECK(cache.num_kv_heads == hkv && cache.head_dim == dh && layer >= 0 && layer < cache.num_layers)
      << "KV cache shape vs attention shape";
  QVL_CHECK(cache.dtype == DType::kF32 || cache.dtype == DType::kBF16)
      << "CPU KV cache dtype " << dtype_name(cache.dtype);
  QVL_CHECK_LE(dh, 256) << "head_dim";
  for (int64_t i = 0; i < n; ++i) check_slot(cache, batch.slots.as<const int32_t>()[i], "text_qkv_prepare");
  std::vector<float> qn(dh), kn(dh);
  to_f32(q_norm.data, q_norm.dtype, 0, dh, qn.data());
  to_f32(k_norm.data, k_norm.dtype, 0, dh, kn.data());
  const int32_t* pos = batch.positions.as<const int32_t>();
  const int32_t* slots = batch.slots.as<const int32_t>();
  float* base = qkv.as<float>();
  const int64_t kv_row = static_cast<int64_t>(hkv) * dh;

#pragma omp parallel for schedule(static) num_threads(threads) if (n * width >= kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    // cos/sin of the interleaved M-RoPE angles, duplicated over both halves of head_dim.
    float cs[2 * 256];
    float* cos = cs;
    float* sin = cs + dh;
    for (int j = 0; j < dh / 2; ++j) {
      const float angle = static_cast<float>(pos[i * 3 + rope.axis[j]]) * rope.inv_freq[j];
      cos[j] = cos[j + dh / 2] = std::cos(angle);
      sin[j] = sin[j + dh / 2] = std::sin(angle);
    }
    float* row = base + i * width;
    for (int h = 0; h < hq; ++h) {
      rms_normalize(row + h * dh, qn.data(), dh, eps);
      rotate(row + h * dh, cos, sin, dh);
    }
    float* k = row + static_cast<int64_t>(hq) * dh;
    for (int h = 0; h < hkv; ++h) {
      rms_normalize(k + h * dh, kn.data(), dh, eps);
      rotate(k + h * dh, cos, sin, dh);
    }
    store_kv(k, kv_address(cache, slots[i], layer, false), cache.dtype, kv_row);
    store_kv(k + kv_row, kv_address(cache, slots[i], layer, true), cache.dtype, kv_row);
  }
}

void text_attention(int threads, Tensor out, const Tensor& qkv, const TextBatch& batch, const KvCacheView& cache,
                    int layer, const TextAttentionShape& shape, float scale) {
  check_f32(qkv, "text_attention qkv");
  check_f32(out, "text_attention out");
  const int hq = shape.num_q_heads, hkv = shape.num_kv_heads, dh = shape.head_dim, group = hq / hkv;
  const int64_t n = batch.num_tokens, width = static_cast<int64_t>(hq + 2 * hkv) * dh;
  QVL_CHECK_EQ(hq % hkv, 0);
  QVL_CHECK_EQ(out.numel(), n * hq * dh);
  const int32_t* qs = batch.query_start.as<const int32_t>();
  const int32_t* ctx = batch.context_len.as<const int32_t>();
  const int32_t* pages = batch.page_table.as<const int32_t>();
  QVL_CHECK_EQ(qs[batch.num_seqs], n) << "query_start does not end at num_tokens";
  // Row -> sequence map (rows of a sequence are contiguous).
  std::vector<int32_t> seq_of(n);
  for (int s = 0; s < batch.num_seqs; ++s) {
    QVL_CHECK(qs[s] <= qs[s + 1] && ctx[s] >= qs[s + 1] - qs[s]) << "sequence " << s << " rows/context";
    for (int32_t r = qs[s]; r < qs[s + 1]; ++r) seq_of[r] = s;
    const int64_t used_pages = (ctx[s] + cache.page_size - 1) / cache.page_size;
    QVL_CHECK_LE(used_pages, batch.max_pages_per_seq) << "sequence " << s << " context " << ctx[s];
    for (int64_t pg = 0; pg < used_pages; ++pg) {
      check_slot(cache, static_cast<int64_t>(pages[s * batch.max_pages_per_seq + pg]) * cache.page_size,
                 "text_attention page table");
    }
  }
  const float* in = qkv.as<const float>();
  float* o = out.as<float>();

  // Work ~ rows × kv heads × context; a short decode step stays on the calling thread.
  const int64_t work = n * hkv * (batch.max_context + 1) * (group + 1) * dh;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (work >= kParallelMinWork)
  for (int64_t task = 0; task < n * hkv; ++task) {
    const int64_t i = task / hkv;
    const int g = static_cast<int>(task % hkv);
    const int s = seq_of[i];
    // Absolute index of this row; it sees cache tokens [0, p].
    const int64_t p = ctx[s] - (qs[s + 1] - qs[s]) + (i - qs[s]);
    const int64_t len = p + 1;
    float* scores = score_buffer(static_cast<size_t>(len) * group + 2 * dh);
    float* kbuf = scores + len * group;
    float* vbuf = kbuf + dh;
    auto slot_of = [&](int64_t t) {
      int32_t page = pages[static_cast<int64_t>(s) * batch.max_pages_per_seq + t / cache.page_size];
      return static_cast<int64_t>(page) * cache.page_size + t % cache.page_size;
    };
    for (int64_t t = 0; t < len; ++t) {
      const char* kaddr = kv_address(cache, slot_of(t), layer, false) + g * dh * dtype_size(cache.dtype);
      load_kv(kaddr, cache.dtype, dh, kbuf);
      for (int h = 0; h < group; ++h) {
        scores[h * len + t] = dot(in + i * width + (g * group + h) * dh, kbuf, dh) * scale;
      }
    }
    for (int h = 0; h < group; ++h) softmax(scores + h * len, len);
    float* dst = o + i * hq * dh + static_cast<int64_t>(g) * group * dh;
    std::fill(dst, dst + group * dh, 0.0f);
    for (int64_t t = 0; t < len; ++t) {
      const char* vaddr = kv_address(cache, slot_of(t), layer, true) + g * dh * dtype_size(cache.dtype);
      load_kv(vaddr, cache.dtype, dh, vbuf);
      for (int h = 0; h < group; ++h) {
        const float w = scores[h * len + t];
        for (int d = 0; d < dh; ++d) dst[h * dh + d] += w * vbuf[d];
      }
    }
  }
}

}  // namespace qvl::cpu
