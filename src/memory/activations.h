// Activation memory of the Qwen3-VL forward, as named terms: every buffer the vision encoder and
// the text decoder take from their Arena (core/arena.h), with its shape, in the order the forward
// allocates it. The planner adds these up for `qvl plan`, and the engine sizes its arenas with the
// same functions, so prediction and allocation cannot drift: if the forward allocates something
// these terms do not name, its Arena overflows and fails a check with the numbers.
//
// The layout these terms assume (model/ follows it; change both together):
// - Every buffer is one Arena::alloc, rounded up to Arena::kAlignment; a "stage" resets the arena
//   to where it began when it is done, so only the largest stage counts.
// - Vision forward (encode_images) over N patches in G attention segments (one per image, or per
//   temporal slice), T = N/4 merged tokens, k = deepstack taps, a = activation bytes:
//     outputs first, kept for the caller until the images' prefill is done:
//                    merged [T, O] + k × [T, O]
//     hidden x [N, D], rope table [N, 2, dh] f32, cu_seqlens i32 [G + 1]      — live to the end
//     then one stage at a time:
//       patch stage:   pixels f32 [N, C·T·P·P] as uploaded, the same in the activation dtype
//                      when that is not f32 (converted on the device) — or, for RGB input,
//                      u8 [N·P·P·3] as uploaded and the patchified [N, C·T·P·P] in the
//                      activation dtype (the larger of the two forms is planned) — then pos
//                      index i32 [N, 4], pos weight f32 [N, 4]
//       attention:     h [N, D], qkv [N, 3D], attn [N, D]       (proj adds into x)
//       mlp:           h [N, D], fc1 [N, F]                      (fc2 adds into x)
//       deepstack tap: ln [T, 4D], fc1 [T, 4D]                   (fc2 writes its output)
//       final merger:  ln [N, D], fc1 [T, 4D]                    (fc2 writes its output)
// - Decoder step (forward) over S rows (prefill chunks and decode rows together), R logits rows
//   (the logits [R, V] themselves are the caller's, in their own buffer; see runner_buffers):
//     hidden x [S, H]                                                         — live to the end
//     then one stage at a time:
//       attention:     h [S, H], qkv [S, (Hq + 2·Hkv)·dh], attn [S, Hq·dh]   (o adds into x)
//       mlp:           h [S, H], gate_up [S, 2I], act [S, I]                  (down adds into x)
//       deepstack:     rows i32 [S] (the batch rows of this step's image tokens; each
//                      VisualRows run scatters through a row range of it) after layers 0..k−1
//       final norm:    last [R, H] (gathered logits rows), normed [R, H]      (lm_head -> logits)
//   The step's inputs (token ids, logits rows, positions, slots and the other TextBatch tables)
//   live in their own fixed buffer (step_input_bytes): CUDA graphs need their addresses fixed.
// - The vision forward's uploads go through a host staging buffer (model.h HostStaging; pinned
//   memory on CUDA), laid out like an arena: pixels f32 [N, C·T·P·P] (or the smaller RGB
//   bytes), rope [N, 2, dh] f32,
//   cu_seqlens i32 [G + 1], pos index i32 [N, 4], pos weight f32 [N, 4].
// - A model runner allocates exactly runner_buffers(): the arena (one image's features, then
//   the larger of the vision scratch and the decoder step above them), the step inputs and the
//   logits on the device, and the vision upload staging in host memory; the memory plan counts
//   the same allocations (the staging by the device page tables that map it).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "model/config.h"

namespace qvl {

// Bytes of one arena allocation of `elements` elements of `dtype` (rounded to Arena::kAlignment).
int64_t arena_bytes(int64_t elements, DType dtype);

struct VisionActivationTerms {
  int64_t num_patches = 0;  // N
  int64_t num_tokens = 0;   // T = N / merge_unit
  // Held by the caller after the forward (the image's merged embedding and deepstack features).
  int64_t merged_features = 0;     // [T, O]
  int64_t deepstack_features = 0;  // k × [T, O]
  // Live through the whole forward.
  int64_t hidden = 0;      // x [N, D]
  int64_t rope_table = 0;  // [N, 2, dh] f32
  int64_t cu_seqlens = 0;  // i32 [G + 1]
  // Stages (only one is live at a time). The patch stage is the larger of its two input forms.
  int64_t patch_stage = 0;
  int64_t patch_stage_pixels = 0;  // from f32 pixel values
  int64_t patch_stage_rgb = 0;     // from RGB bytes
  int64_t attention_stage = 0;
  int64_t mlp_stage = 0;
  int64_t deepstack_stage = 0;  // 0 without deepstack taps
  int64_t merger_stage = 0;
  // Host memory, not the arena: the upload staging buffer (pixels f32 and the tables).
  int64_t upload_staging = 0;

  int64_t features() const { return merged_features + deepstack_features; }
  int64_t largest_stage() const;
  // Arena bytes of the forward on top of the features: hidden + rope + cu_seqlens + largest stage.
  int64_t scratch() const { return hidden + rope_table + cu_seqlens + largest_stage(); }
  int64_t peak() const { return features() + scratch(); }
};

struct DecoderActivationTerms {
  int64_t step_tokens = 0;  // S
  int64_t logits_rows = 0;  // R
  int64_t logits = 0;       // [R, V] activation dtype: the caller's buffer, not the arena's
  int64_t hidden = 0;       // x [S, H]
  int64_t attention_stage = 0;
  int64_t mlp_stage = 0;
  int64_t deepstack_stage = 0;  // 0 without deepstack taps
  int64_t final_norm_stage = 0;

  int64_t largest_stage() const;
  // What forward() takes from the arena.
  int64_t peak() const { return hidden + largest_stage(); }
};

// The terms of one vision forward over `num_patches` patches (a multiple of merge_unit()) in
// `num_segments` attention segments (images × temporal slices).
VisionActivationTerms vision_activation_terms(const ModelConfig& config, int64_t num_patches, DType activation_dtype,
                                              int64_t num_segments = 1);
// The terms of one decoder step over `step_tokens` rows producing `logits_rows` logits rows.
DecoderActivationTerms decoder_activation_terms(const ModelConfig& config, int64_t step_tokens, int64_t logits_rows,
                                                DType activation_dtype);

// The step inputs buffer: token ids i32 [S], logits rows i32 [B], positions i32 [S, 3], slots
// i32 [S], query_start i32 [B + 1], context_len i32 [B], page_table i32 [B, P] for S step rows,
// B sequences (at most one logits row each) and P pages per sequence, then the outputs it
// holds: the greedy ids i32 [B] a device argmax writes and the candidate keys i64
// [B, kSampleCandidates] a device top-k writes (backend/top_k.h). Each part is one arena
// allocation.
int64_t step_input_bytes(int64_t step_tokens, int64_t max_seqs, int64_t max_pages_per_seq);

// The limits a runner is built for (engine/model_runner.h RunnerLimits carries the same four).
struct RunnerShape {
  int64_t max_step_tokens = 0;    // S
  int64_t max_seqs = 0;           // B, and the logits rows
  int64_t max_pages_per_seq = 0;  // P
  int64_t max_image_patches = 0;  // N of the largest image (0: no image is admitted)
};
// The buffers a runner allocates once (three on the device, one in host memory), in bytes as
// asked of the backend.
struct RunnerBuffers {
  VisionActivationTerms vision;
  DecoderActivationTerms decoder;
  int64_t arena = 0;           // vision.features() + max(vision.scratch(), decoder.peak())
  int64_t step_inputs = 0;     // step_input_bytes(S, B, P)
  int64_t logits = 0;          // [B, V] activation dtype
  int64_t upload_staging = 0;  // host memory: vision.upload_staging (0 when no image is admitted)
};
RunnerBuffers runner_buffers(const ModelConfig& config, const RunnerShape& shape, DType activation_dtype);

}  // namespace qvl
