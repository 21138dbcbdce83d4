// Activation memory of the Qwen3-VL forward, as named terms: every buffer the vision encoder and
// the text decoder take from their Arena (core/arena.h), with its shape, in the order the forward
// allocates it. The planner adds these up for `qvl plan`, and the engine sizes its arenas with the
// same functions, so prediction and allocation cannot drift: if the forward allocates something
// these terms do not name, its Arena overflows and fails a check with the numbers.
//
// The layout these terms assume (model/ follows it; change both together):
// - Every buffer is one Arena::alloc, rounded up to Arena::kAlignment.
// - Vision forward over N patches (one image: the engine encodes one image per forward), T = N/4
//   merged tokens, k = deepstack taps, a = activation bytes:
//     features  (the caller's, held until the image's prefill is done): merged [T, O] + k × [T, O]
//     hidden x [N, D], rope table [N, 2, dh] f32, cu_seqlens i32 [2]          — live to the end
//     then, one stage at a time (each stage resets the arena to its start when done):
//       patch stage:   pixels [N, C·T·P·P], pos index i32 [N, 4], pos weight f32 [N, 4]
//       attention:     h [N, D], qkv [N, 3D], attn [N, D]       (proj adds into x)
//       mlp:           h [N, D], fc1 [N, F]                      (fc2 adds into x)
//       deepstack tap: ln [T, 4D], fc1 [T, 4D]                   (fc2 writes features)
//       final merger:  ln [N, D], fc1 [T, 4D]                    (fc2 writes features)
// - Decoder step over S tokens (prefill chunk rows and decode rows together), R logits rows:
//     hidden x [S, H]                                                         — live to the end
//     then one stage at a time:
//       attention:     h [S, H], qkv [S, (Hq + 2·Hkv)·dh], attn [S, Hq·dh]   (o adds into x)
//       mlp:           h [S, H], gate_up [S, 2I], act [S, I]                  (down adds into x)
//       deepstack:     rows i32 [S]                          (scatter_rows from the held features)
//       logits:        rows i32 [R], last [R, H], normed [R, H], logits [R, V] (activation dtype),
//                      plus logits f32 [R, V] when the activation dtype is not f32 (the sampler's)
//   The step's inputs (token ids, positions, slots, the TextBatch tensors) live in their own
//   fixed buffer (step_input_bytes) because CUDA graphs need their addresses fixed.
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
  int64_t cu_seqlens = 0;  // i32 [2]
  // Stages (only one is live at a time).
  int64_t patch_stage = 0;
  int64_t attention_stage = 0;
  int64_t mlp_stage = 0;
  int64_t deepstack_stage = 0;  // 0 without deepstack taps
  int64_t merger_stage = 0;

  int64_t features() const { return merged_features + deepstack_features; }
  int64_t largest_stage() const;
  // Arena bytes of the forward on top of the features: hidden + rope + cu_seqlens + largest stage.
  int64_t scratch() const { return hidden + rope_table + cu_seqlens + largest_stage(); }
  int64_t peak() const { return features() + scratch(); }
};

struct DecoderActivationTerms {
  int64_t step_tokens = 0;  // S
  int64_t logits_rows = 0;  // R
  int64_t hidden = 0;       // x [S, H]
  int64_t attention_stage = 0;
  int64_t mlp_stage = 0;
  int64_t deepstack_stage = 0;  // 0 without deepstack taps
  int64_t logits_stage = 0;

  int64_t largest_stage() const;
  int64_t peak() const { return hidden + largest_stage(); }
};

// The terms of one vision forward over `num_patches` patches (a multiple of merge_unit()).
VisionActivationTerms vision_activation_terms(const ModelConfig& config, int64_t num_patches,
                                              DType activation_dtype);
// The terms of one decoder step over `step_tokens` rows producing `logits_rows` logits rows.
DecoderActivationTerms decoder_activation_terms(const ModelConfig& config, int64_t step_tokens,
                                                int64_t logits_rows, DType activation_dtype);

// The step inputs buffer: token ids i32 [S], positions i32 [S, 3], slots i32 [S], query_start
// i32 [B + 1], context_len i32 [B], page_table i32 [B, P] for S step rows, B sequences and P pages
// per sequence. Each part is one arena allocation.
int64_t step_input_bytes(int64_t step_tokens, int64_t max_seqs, int64_t max_pages_per_seq);

}  // namespace qvl
