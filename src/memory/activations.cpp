#include "memory/activations.h"

#include <algorithm>

#include "backend/top_k.h"
#include "core/arena.h"
#include "core/check.h"

namespace qvl {

int64_t arena_bytes(int64_t elements, DType dtype) {
  QVL_CHECK_GE(elements, 0);
  const int64_t a = static_cast<int64_t>(Arena::kAlignment);
  return (elements * dtype_size(dtype) + a - 1) / a * a;
}

int64_t VisionActivationTerms::largest_stage() const {
  return std::max({patch_stage, attention_stage, mlp_stage, deepstack_stage, merger_stage});
}

int64_t DecoderActivationTerms::largest_stage() const {
  return std::max({attention_stage, mlp_stage, deepstack_stage, final_norm_stage});
}

VisionActivationTerms vision_activation_terms(const ModelConfig& config, int64_t num_patches, DType act,
                                              int64_t num_segments) {
  const VisionConfig& v = config.vision;
  const int64_t n = num_patches;
  const int64_t unit = v.merge_unit();
  QVL_CHECK_GE(n, 0);
  QVL_CHECK_EQ(n % unit, 0) << "patches must come in whole merge units";
  QVL_CHECK(n == 0 || (num_segments >= 1 && num_segments * unit <= n)) << num_segments << " segments of " << n;
  const int64_t d = v.hidden_size, f = v.intermediate_size, o = v.out_hidden_size;
  const int64_t t = n / unit;
  const int64_t k = static_cast<int64_t>(v.deepstack_visual_indexes.size());

  VisionActivationTerms s;
  s.num_patches = n;
  s.num_tokens = t;
  if (n == 0) return s;                                           // no image admitted: the encoder never runs
  s.merged_features = arena_bytes(t * o, act);                    // [T, O]
  s.deepstack_features = k * arena_bytes(t * o, act);             // k × [T, O]
  s.hidden = arena_bytes(n * d, act);                             // x [N, D]
  s.rope_table = arena_bytes(n * 2 * v.head_dim(), DType::kF32);  // cos/sin [N, 2, dh]
  s.cu_seqlens = arena_bytes(num_segments + 1, DType::kI32);      // segment bounds
  // The tables' factors (model/positions.h write_vision_factors), uploaded in place of the rotary
  // table, which the device expands from them; angle rows for the longest grid side N allows.
  const int64_t tables = arena_bytes(n * 4, DType::kI32)    // bilinear taps [N, 4]
                         + arena_bytes(n * 4, DType::kF32)  // tap weights [N, 4]
                         + arena_bytes(n * 2, DType::kI32)  // row, col [N, 2]
                         + arena_bytes(v.max_grid_side(n) * 2 * (v.head_dim() / 4), DType::kF32);  // angles [L, 2, q]
  // The input arrives in one of two forms (model.h ImageInput): the larger is planned.
  s.patch_stage_pixels = tables + arena_bytes(n * v.patch_dim(), DType::kF32)                // pixels as uploaded
                         + (act == DType::kF32 ? 0 : arena_bytes(n * v.patch_dim(), act));   // cast
  s.patch_stage_rgb = tables + arena_bytes(n * 3 * v.patch_size * v.patch_size, DType::kU8)  // RGB bytes as uploaded
                      + arena_bytes(n * v.patch_dim(), act);                                 // patchified
  s.patch_stage = std::max(s.patch_stage_pixels, s.patch_stage_rgb);
  s.attention_stage = arena_bytes(n * d, act)        // LayerNorm1 out [N, D]
                      + arena_bytes(n * 3 * d, act)  // qkv [N, 3D]
                      + arena_bytes(n * d, act);     // attention out [N, D]
  s.mlp_stage = arena_bytes(n * d, act)              // LayerNorm2 out [N, D]
                + arena_bytes(n * f, act);           // fc1 + gelu [N, F]
  if (k > 0)
    s.deepstack_stage = arena_bytes(t * unit * d, act)               // LayerNorm over 4D [T, 4D]
                        + arena_bytes(t * unit * d, act);            // fc1 + gelu [T, 4D]
  s.merger_stage = arena_bytes(n * d, act)                           // LayerNorm per patch [N, D]
                   + arena_bytes(t * unit * d, act);                 // fc1 + gelu [T, 4D]
  s.upload_staging = s.cu_seqlens + tables                           // as in the arena
                     + arena_bytes(n * v.patch_dim(), DType::kF32);  // pixels (RGB bytes take less)
  return s;
}

DecoderActivationTerms decoder_activation_terms(const ModelConfig& config, int64_t step_tokens, int64_t logits_rows,
                                                DType act) {
  const TextConfig& tc = config.text;
  const int64_t s = step_tokens, r = logits_rows;
  QVL_CHECK_GE(s, 1);
  QVL_CHECK(r >= 1 && r <= s) << "logits rows " << r << " for a step of " << s << " rows";
  const int64_t h = tc.hidden_size, i = tc.intermediate_size, v = tc.vocab_size;
  const int64_t qkv = static_cast<int64_t>(tc.q_dim()) + 2 * tc.kv_dim();

  DecoderActivationTerms d;
  d.step_tokens = s;
  d.logits_rows = r;
  d.logits = arena_bytes(r * v, act);                      // lm_head out [R, V] (the caller's)
  d.hidden = arena_bytes(s * h, act);                      // x [S, H]
  d.attention_stage = arena_bytes(s * h, act)              // input norm [S, H]
                      + arena_bytes(s * qkv, act)          // q|k|v [S, (Hq + 2Hkv)·dh]
                      + arena_bytes(s * tc.q_dim(), act);  // attention out [S, Hq·dh]
  d.mlp_stage = arena_bytes(s * h, act)                    // post-attention norm [S, H]
                + arena_bytes(s * 2 * i, act)              // gate|up [S, 2I]
                + arena_bytes(s * i, act);                 // silu(gate)·up [S, I]
  if (!config.vision.deepstack_visual_indexes.empty())
    d.deepstack_stage = arena_bytes(s, DType::kI32);  // batch rows of this step's image tokens
  d.final_norm_stage = arena_bytes(r * h, act)        // logits rows of x [R, H]
                       + arena_bytes(r * h, act);     // final norm [R, H]
  return d;
}

RunnerBuffers runner_buffers(const ModelConfig& config, const RunnerShape& shape, DType act) {
  QVL_CHECK(shape.max_seqs >= 1 && shape.max_seqs <= shape.max_step_tokens)
      << shape.max_seqs << " sequences in steps of " << shape.max_step_tokens << " rows";
  RunnerBuffers b;
  b.vision = vision_activation_terms(config, shape.max_image_patches, act);
  b.decoder = decoder_activation_terms(config, shape.max_step_tokens, shape.max_seqs, act);
  b.arena = b.vision.features() + std::max(b.vision.scratch(), b.decoder.peak());
  b.step_inputs = step_input_bytes(shape.max_step_tokens, shape.max_seqs, shape.max_pages_per_seq);
  b.logits = b.decoder.logits;
  b.upload_staging = b.vision.upload_staging;
  return b;
}

int64_t step_input_bytes(int64_t step_tokens, int64_t max_seqs, int64_t max_pages_per_seq) {
  return arena_bytes(step_tokens, DType::kI32)                      // token ids
         + arena_bytes(max_seqs, DType::kI32)                       // logits rows
         + arena_bytes(step_tokens * 3, DType::kI32)                // M-RoPE positions
         + arena_bytes(step_tokens, DType::kI32)                    // KV slots
         + arena_bytes(max_seqs + 1, DType::kI32)                   // query_start
         + arena_bytes(max_seqs, DType::kI32)                       // context_len
         + arena_bytes(max_seqs * max_pages_per_seq, DType::kI32)   // page_table
         + arena_bytes(max_seqs, DType::kI32)                       // greedy ids (device argmax)
         + arena_bytes(max_seqs * kSampleCandidates, DType::kI64);  // candidate keys (device top-k)
}

}  // namespace qvl
