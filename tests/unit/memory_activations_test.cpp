// Activation terms of the vision encoder and the decoder step, checked against the buffer list
// of memory/activations.h written out as arithmetic for Qwen3-VL-4B (spec §1.1: D 1024, F 4096,
// O 2560, 16 heads of 64, deepstack 3; H 2560, Hq 32, Hkv 8, dh 128, I 9728, V 151936).
#include <gtest/gtest.h>

#include "core/check.h"
#include "memory/activations.h"

namespace qvl {
namespace {

ModelConfig config_4b() {
  ModelConfig c;
  c.text.hidden_size = 2560;
  c.text.num_hidden_layers = 36;
  c.text.num_attention_heads = 32;
  c.text.num_key_value_heads = 8;
  c.text.head_dim = 128;
  c.text.intermediate_size = 9728;
  c.vision.out_hidden_size = 2560;
  return c;
}

TEST(Activations, ArenaBytesRoundToTheArenaAlignment) {
  EXPECT_EQ(arena_bytes(0, DType::kBF16), 0);
  EXPECT_EQ(arena_bytes(3, DType::kBF16), 256);          // 6 bytes -> one 256-byte slot
  EXPECT_EQ(arena_bytes(128, DType::kBF16), 256);        // exactly 256
  EXPECT_EQ(arena_bytes(129, DType::kF32), 768);         // 516 -> 3 × 256
  EXPECT_EQ(arena_bytes(151936, DType::kBF16), 303872);  // 1187 × 256, no padding
}

TEST(Activations, VisionOneMegapixelImage4B) {
  // 1024×1024 pixels -> 64×64 patches of 16 = 4096 patches, 1024 merged tokens.
  const int64_t n = 4096, t = 1024, d = 1024, f = 4096, o = 2560, dh = 64, b = 2;
  VisionActivationTerms v = vision_activation_terms(config_4b(), n, DType::kBF16);
  EXPECT_EQ(v.num_tokens, t);
  EXPECT_EQ(v.merged_features, t * o * b);  // 5,242,880
  EXPECT_EQ(v.deepstack_features, 3 * t * o * b);
  EXPECT_EQ(v.hidden, n * d * b);           // 8 MiB
  EXPECT_EQ(v.rope_table, n * 2 * dh * 4);  // f32 cos/sin
  EXPECT_EQ(v.cu_seqlens, 256);             // 2 × i32, one aligned slot
  // The tables' factors: bilinear taps i32 and weights f32 [N, 4], each patch's row and column
  // i32 [N, 2], and cos/sin f32 of the 16 rotary frequencies at every position up to the longest
  // side 4096 patches allow (2 x 2048: N / merge 2 = 2048 rows of 2 x 16).
  const int64_t tables = n * 4 * 4 + n * 4 * 4 + n * 2 * 4 + (n / 2) * 2 * 16 * 4;
  // Pixels as uploaded (f32), their bf16 cast and the tables; or RGB bytes (16 x 16 x 3 per
  // patch), the patchified bf16 and the tables: the larger, the pixels, is planned.
  EXPECT_EQ(v.patch_stage_pixels, n * 1536 * 4 + n * 1536 * b + tables);
  EXPECT_EQ(v.patch_stage_rgb, n * 768 + n * 1536 * b + tables);
  EXPECT_EQ(v.patch_stage, v.patch_stage_pixels);
  EXPECT_EQ(v.attention_stage, n * d * b + n * 3 * d * b + n * d * b);
  EXPECT_EQ(v.mlp_stage, n * d * b + n * f * b);
  EXPECT_EQ(v.deepstack_stage, 2 * t * 4 * d * b);
  EXPECT_EQ(v.merger_stage, n * d * b + t * 4 * d * b);
  // The attention and MLP stages tie at 5·N·D·2 = 41,943,040 bytes, the largest.
  EXPECT_EQ(v.largest_stage(), 41943040);
  EXPECT_EQ(v.scratch(), n * d * b + n * 2 * dh * 4 + 256 + 41943040);
  EXPECT_EQ(v.peak(), 4 * t * o * b + v.scratch());
  EXPECT_EQ(v.peak(), 73400576);  // 70 MiB + 256 B, the sum above evaluated
  // The host staging: cu_seqlens (one slot), the tables, pixels f32 (the rotary table itself is
  // expanded on the device).
  EXPECT_EQ(v.upload_staging, 256 + tables + n * 1536 * 4);
}

TEST(Activations, VisionF32ActivationsUploadWithoutACast) {
  // The CPU backend's activations are f32: the uploaded pixels are the Linear's input, while
  // RGB bytes are patchified into an f32 buffer of their own: now the RGB form is the larger.
  const int64_t n = 64;
  VisionActivationTerms v = vision_activation_terms(config_4b(), n, DType::kF32);
  const int64_t tables = n * 4 * 4 + n * 4 * 4 + n * 2 * 4 + (n / 2) * 2 * 16 * 4;  // as above, all 256-aligned
  EXPECT_EQ(v.patch_stage_pixels, n * 1536 * 4 + tables);
  EXPECT_EQ(v.patch_stage_rgb, n * 768 + n * 1536 * 4 + tables);
  EXPECT_EQ(v.patch_stage, v.patch_stage_rgb);
  EXPECT_EQ(v.upload_staging, vision_activation_terms(config_4b(), n, DType::kBF16).upload_staging);
}

TEST(Activations, VisionNoImage) {
  VisionActivationTerms v = vision_activation_terms(config_4b(), 0, DType::kBF16);
  EXPECT_EQ(v.peak(), 0);
}

TEST(Activations, VisionPatchesMustBeWholeMergeUnits) {
  EXPECT_THROW(vision_activation_terms(config_4b(), 4097, DType::kBF16), CheckFailure);
}

TEST(Activations, VisionGrowsWithTheImage) {
  int64_t last = 0;
  for (int64_t n = 4; n <= 65536; n *= 2) {
    int64_t p = vision_activation_terms(config_4b(), n, DType::kBF16).peak();
    EXPECT_GT(p, last) << n;
    last = p;
  }
}

TEST(Activations, DecoderPrefillChunk4B) {
  const int64_t s = 2048, h = 2560, qkv = (32 + 2 * 8) * 128, q = 32 * 128, i = 9728, v = 151936, b = 2;
  DecoderActivationTerms d = decoder_activation_terms(config_4b(), s, 1, DType::kBF16);
  EXPECT_EQ(d.logits, v * b);  // 303,872 = 1187 × 256: no padding
  EXPECT_EQ(d.hidden, s * h * b);
  EXPECT_EQ(d.deepstack_stage, s * 4);
  EXPECT_EQ(d.attention_stage, s * h * b + s * qkv * b + s * q * b);
  EXPECT_EQ(d.mlp_stage, s * h * b + s * 2 * i * b + s * i * b);
  EXPECT_EQ(d.final_norm_stage, h * b + h * b);
  EXPECT_EQ(d.largest_stage(), d.mlp_stage);
  // 10,485,760 + 130,023,424; the logits are the caller's buffer.
  EXPECT_EQ(d.peak(), 140509184);
}

TEST(Activations, DecoderRowsAreAligned) {
  // 3 rows, 2 logits rows in f32: every buffer rounds up to 256 bytes.
  const int64_t h = 2560, v = 151936;
  DecoderActivationTerms d = decoder_activation_terms(config_4b(), 3, 2, DType::kF32);
  EXPECT_EQ(d.logits, 2 * v * 4);
  EXPECT_EQ(d.deepstack_stage, 256);  // 12 bytes
  EXPECT_EQ(d.final_norm_stage, 2 * h * 4 * 2);
  // attention: norm 3·2560·4 = 30720, qkv 3·6144·4 = 73728, out 3·4096·4 = 49152 (all multiples of 256)
  EXPECT_EQ(d.attention_stage, 30720 + 73728 + 49152);
}

TEST(Activations, DecoderLogitsRowsAreBoundedByTheStep) {
  EXPECT_THROW(decoder_activation_terms(config_4b(), 4, 5, DType::kBF16), CheckFailure);
  EXPECT_THROW(decoder_activation_terms(config_4b(), 0, 0, DType::kBF16), CheckFailure);
}

TEST(Activations, StepInputs) {
  // 2048 rows, 4 sequences of 256 pages: ids 8192, logits rows 16 -> 256, positions 24576,
  // slots 8192, query_start 20 -> 256, context_len 16 -> 256, page_table 4 × 256 × 4 = 4096,
  // greedy ids 16 -> 256, candidate keys 4 × 64 × 8 = 2048.
  EXPECT_EQ(step_input_bytes(2048, 4, 256), 8192 + 256 + 24576 + 8192 + 256 + 256 + 4096 + 256 + 2048);
}

TEST(Activations, RunnerBuffers) {
  // 4B, 1-MP image, steps of 2048 rows from 4 sequences of up to 256 pages.
  RunnerBuffers b = runner_buffers(config_4b(), RunnerShape{2048, 4, 256, 4096}, DType::kBF16);
  // Features 20 MiB + max(vision scratch 52,429,056, decoder step 140,509,184) (the tests above).
  EXPECT_EQ(b.arena, 4 * 1024 * 2560 * 2 + 140509184);
  EXPECT_EQ(b.step_inputs, step_input_bytes(2048, 4, 256));
  EXPECT_EQ(b.logits, 4 * 151936 * 2);
  EXPECT_EQ(b.upload_staging, vision_activation_terms(config_4b(), 4096, DType::kBF16).upload_staging);
  // No image admitted: the arena is the decoder's alone, and there is nothing to stage.
  EXPECT_EQ(runner_buffers(config_4b(), RunnerShape{2048, 4, 256, 0}, DType::kBF16).arena, 140509184);
  EXPECT_EQ(runner_buffers(config_4b(), RunnerShape{2048, 4, 256, 0}, DType::kBF16).upload_staging, 0);
  EXPECT_THROW(runner_buffers(config_4b(), RunnerShape{2, 4, 256, 0}, DType::kBF16), CheckFailure);
}

TEST(Activations, VisionSegmentsSizeCuSeqlens) {
  // 70 segments -> 71 i32 = 284 bytes -> 512.
  VisionActivationTerms v = vision_activation_terms(config_4b(), 4096, DType::kBF16, 70);
  EXPECT_EQ(v.cu_seqlens, 512);
  EXPECT_THROW(vision_activation_terms(config_4b(), 8, DType::kBF16, 3), CheckFailure);
}

}  // namespace
}  // namespace qvl
