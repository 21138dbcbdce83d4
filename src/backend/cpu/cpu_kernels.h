// Internal to the CPU backend: the compute kernels behind CpuBackend's ops, as free functions
// over tensor views, plus element conversion helpers. Activations are F32 (checked); weights
// and tables are read in their stored dtype (F32, BF16, F16, or FP8 E4M3 with block scales in
// Linears) and converted on the fly, a tile at a time, never as a whole fp32 copy.
//
// Threading: every kernel takes the thread count and parallelises with OpenMP over
// independent output rows or tiles, so results do not depend on the thread count.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/backend.h"
#include "core/check.h"
#include "core/dtype.h"

// Hot loops are compiled for AVX-512 and AVX2 as well as the baseline, and picked at load time
// (GCC function multi-versioning), so one binary is fast on any x86-64 host.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define QVL_CPU_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define QVL_CPU_MULTIVERSION
#endif

namespace qvl::cpu {

// Elementwise loops smaller than this run on the calling thread: a decode step has dozens of
// one-row ops, and waking the team for each costs more than the work.
inline constexpr int64_t kParallelMinWork = 1 << 15;

// Converts n elements of a float tensor of dtype `dt` (F32, BF16, F16) starting at element
// `offset` into dst.
void to_f32(const void* src, DType dt, int64_t offset, int64_t n, float* dst);
bool is_plain_float(DType dt);  // F32, BF16 or F16

inline void check_f32(const Tensor& t, const char* what) {
  QVL_CHECK(t.dtype == DType::kF32) << what << ": CPU activations are F32, got " << t.describe();
}

// out = act(x · Wᵀ + b) + residual, W stacked from w.parts (cpu_linear.cpp).
void linear(int threads, Tensor out, const Tensor& x, const LinearWeight& w, const Epilogue& ep);

// Attention and rotary kernels (cpu_attention.cpp); semantics as in backend.h.
void vision_rope(int threads, Tensor qkv, const Tensor& rope, int num_heads, int head_dim);
void vision_attention(int threads, Tensor out, const Tensor& qkv, const VisionSegments& seg, int num_heads,
                      int head_dim, float scale);
void text_qkv_prepare(int threads, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                      const MropeSpec& rope, const TextBatch& batch, const KvCacheView& cache, int layer,
                      const TextAttentionShape& shape);
void text_attention(int threads, Tensor out, const Tensor& qkv, const TextBatch& batch, const KvCacheView& cache,
                    int layer, const TextAttentionShape& shape, float scale);

// Byte address of token `slot` (page·page_size + offset) of layer `layer` in the paged cache;
// `value` selects V instead of K. Layout: backend.h KvCacheView. Unchecked: callers validate
// slots and page tables before their parallel loops (an exception must not leave an OpenMP
// region).
inline char* kv_address(const KvCacheView& c, int64_t slot, int layer, bool value) {
  int64_t page = slot / c.page_size, offset = slot % c.page_size;
  return static_cast<char*>(c.base) + page * c.page_bytes() + layer * c.layer_bytes() +
         (value ? c.token_bytes_per_layer() * c.page_size : 0) + offset * c.token_bytes_per_layer();
}

inline void check_slot(const KvCacheView& c, int64_t slot, const char* what) {
  QVL_CHECK(slot >= 0 && slot < c.num_pages * c.page_size)
      << what << ": KV slot " << slot << " is outside the cache (" << c.num_pages << " pages of " << c.page_size << ")";
}

}  // namespace qvl::cpu
