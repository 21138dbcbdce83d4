// Internal to the CUDA backend: the kernel launchers, as plain C++ declarations so that the
// backend class (cuda_backend.cpp) is ordinary C++ and only the .cu files see device code.
// Each launcher checks the shapes it relies on (QVL_CHECK), launches on ctx.stream, and checks
// the launch. Tensors are device tensors; activations are BF16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/backend.h"

namespace qvl::cuda {

// Launch settings shared by every kernel launch of one backend.
struct LaunchContext {
  cudaStream_t stream = nullptr;
  bool pdl = false;  // programmatic dependent launch (sm_90+ and enabled)
  int num_sms = 1;
};

// ---- elementwise.cu ----
void launch_embedding(const LaunchContext& ctx, Tensor out, const Tensor& table, const Tensor& ids);
void launch_scatter_rows(const LaunchContext& ctx, Tensor x, const Tensor& rows, const Tensor& src, bool accumulate);
void launch_gather_rows(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& rows);
void launch_silu_mul(const LaunchContext& ctx, Tensor out, const Tensor& gate_up);
void launch_add_interpolated(const LaunchContext& ctx, Tensor x, const Tensor& table, const Tensor& idx,
                             const Tensor& w);
void launch_vision_rope(const LaunchContext& ctx, Tensor qkv, const Tensor& rope, int num_heads, int head_dim);
// In place on out [n, N]: out = bf16(act(out)); then, with a residual, out = bf16(residual + out).
void launch_epilogue(const LaunchContext& ctx, Tensor out, Activation act, const Tensor& residual);
// dst rows [0, r1 - r0) = bf16(float(w8[r0 + i, k]) * scale[(r0 + i) / rows_per_scale, k / block]).
void launch_dequant_fp8(const LaunchContext& ctx, void* dst_bf16, const Tensor& w8, const Tensor& scale,
                        int rows_per_scale, int block, int64_t r0, int64_t r1);

// ---- norm.cu ----
void launch_rms_norm(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, float eps);
void launch_layer_norm(const LaunchContext& ctx, Tensor out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       float eps);

// ---- skinny.cu: out = epilogue(x · Wᵀ) for x with at most kSkinnyMaxRows rows ----
// `w` is a device LinearWeight with one merged part (BF16, or F8E4M3 with F32 scales whose
// first dimension is ceil(out / block) or out: rows_per_scale = block or 1).
//
// An optional prologue computes x itself from the op that produced it (the backend defers
// RMSNorm and SiLU·mul into the Linear that consumes them, saving a launch and a round trip
// of x): every block recomputes the rows it needs in registers, and the blocks together also
// write x (so x holds exactly what the unfused op would have written).
struct SkinnyPrologue {
  enum Kind { kNone, kRmsNorm, kSiluMul } kind = kNone;
  Tensor src;     // RMSNorm: the input [n, K]; SiLU·mul: gate_up [n, 2K]
  Tensor weight;  // RMSNorm weight [K] (F32 or BF16)
  float eps = 0;
};
inline constexpr int kFusedPrologueMaxRows = 8;
void launch_skinny_linear(const LaunchContext& ctx, Tensor out, const Tensor& x, const LinearWeight& w,
                          const Epilogue& ep, const SkinnyPrologue& pro = {});

// Sets the kernels' shared-memory limits; call once per device before the first launch.
void configure_vision_attention();
void configure_text_attention();

// ---- attention_vision.cu ----
void launch_vision_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const VisionSegments& seg,
                             int num_heads, int head_dim, float scale);

// ---- attention_text.cu ----
struct MropeParams {
  float inv_freq[128];
  uint8_t axis[128];
  int half = 0;  // head_dim / 2
};
void launch_text_qkv_prepare(const LaunchContext& ctx, Tensor qkv, const Tensor& q_norm, const Tensor& k_norm,
                             float eps, const MropeParams& rope, const TextBatch& batch, const KvCacheView& cache,
                             int layer, const TextAttentionShape& shape);
void launch_text_prefill_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                   const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale);
// Split-K over the cache: `partial` holds the splits' fp32 partials, `counters` (zero, and left
// zero) one arrival counter per (sequence, kv head); the last split to finish merges.
void launch_text_decode_attention(const LaunchContext& ctx, Tensor out, const Tensor& qkv, const TextBatch& batch,
                                  const KvCacheView& cache, int layer, const TextAttentionShape& shape, float scale,
                                  float* partial, size_t partial_bytes, uint32_t* counters);

}  // namespace qvl::cuda
