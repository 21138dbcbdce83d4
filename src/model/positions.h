// Host-side index math of Qwen3-VL: everything that depends only on token ids, image grids and
// the config, never on weights. The model uploads these tables; tests check them against the
// reference formulas (spec §5.2–5.4, §6.2–6.4, transformers 5.17 vision_utils.py and
// modeling_qwen3_vl.py get_rope_index).
//
// Conventions: an image grid (t, h, w) counts patches (16 px) before the 2×2 merge; patches of
// one image are in merge order (the row order of pixel_values: 2×2 blocks in raster order,
// inside a block (0,0),(0,1),(1,0),(1,1)), repeated for every temporal slice t. Text
// positions are (T, H, W) triples; for text T = H = W.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/image_grid.h"
#include "core/status.h"
#include "model/config.h"

namespace qvl {

// A grid the vision encoder accepts: positive, h and w multiples of the merge size.
Status validate_grid(const ImageGrid& grid, const VisionConfig& vision, int image_index);

// ---- text (M-RoPE) ----

// Prompt positions (get_rope_index): text runs advance by one per token on all axes; each run
// of image-pad tokens (one image) gets (cur, cur + r, cur + c) for merged row r and column c
// and advances cur by max(h/m, w/m). rope_delta = max position + 1 − L, so the token at
// absolute index n ≥ L (decode) sits at position n + rope_delta on every axis.
struct PromptPositions {
  std::vector<int32_t> positions;  // [L, 3] row-major: (T, H, W) of token i at 3i..3i+2
  int64_t rope_delta = 0;
};

// Errors (kInvalidArgument) name the image and the counts: a pad run whose length is not its
// grid's token count, more or fewer runs than grids, video pads (not supported).
Result<PromptPositions> prompt_positions(std::span<const int32_t> ids, std::span<const ImageGrid> grids,
                                         const ModelConfig& config);

// Position of the token at absolute index n >= prompt length (all three axes).
inline int64_t decode_position(int64_t n, int64_t rope_delta) {
  return n + rope_delta;
}

// inv_freq[j] = 1 / theta^(2j/head_dim) in fp32 and the interleaved axis map (spec §6.4):
// H if j % 3 == 1 and j < 3·section[1], W if j % 3 == 2 and j < 3·section[2], else T.
MropeSpec make_mrope_spec(const TextConfig& text);

// ---- vision ----

// Rotary inverse frequencies of the vision attention: head_dim/4 entries,
// inv[k] = 1 / theta^(2k / (head_dim/2)) (fp32, as Qwen3VLVisionRotaryEmbedding).
std::vector<float> vision_rope_inv_freq(const VisionConfig& vision);

// Everything the vision encoder needs besides pixels, for a list of images.
struct VisionLayout {
  int64_t num_patches = 0;
  int64_t num_tokens = 0;              // merged rows of the output
  std::vector<int64_t> token_offsets;  // first output row of image i; num_images + 1 entries
  std::vector<int32_t> cu_seqlens;     // attention segments: one per temporal slice of each image
  int max_seqlen = 0;
};

// Builds the layout (grids must have passed validate_grid). The per-patch tables come from
// write_vision_factors (what the encoder uploads) or write_vision_tables (the whole tables).
VisionLayout vision_layout(const VisionConfig& vision, std::span<const ImageGrid> grids);

// Writes the per-patch tables of `grids` (N patches in all) into caller memory:
// interp_index [N, 4], interp_weight [N, 4], rope [N, 2, head_dim]. The values are those of
// the reference formulas in fp32 (cos/sin of row·inv and col·inv, each angle evaluated once per
// position, which gives the same floats as evaluating it per patch): write_vision_factors, then
// core/vision_rope.h expand_vision_rope.
void write_vision_tables(const VisionConfig& vision, std::span<const ImageGrid> grids, int32_t* interp_index,
                         float* interp_weight, float* rope);

// What the encoder uploads in place of the rotary table (the device expands it:
// Backend::vision_rope_table): interp_index / interp_weight [N, 4] as above, row_col [N, 2]
// (each patch's row and column, in merge order) and angles [vision_angle_rows(grids), 2,
// head_dim / 4]: cos, then sin, of p·inv[e] for every position p < the longest grid side.
void write_vision_factors(const VisionConfig& vision, std::span<const ImageGrid> grids, int32_t* interp_index,
                          float* interp_weight, int32_t* row_col, float* angles);
// The positions write_vision_factors evaluates: the longest side (h or w) of any grid (at most
// VisionConfig::max_grid_side of their patches).
int64_t vision_angle_rows(std::span<const ImageGrid> grids);

}  // namespace qvl
