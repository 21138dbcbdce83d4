#include "model/positions.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/vision_rope.h"

namespace qvl {
namespace {

std::string grid_string(const ImageGrid& g) {
  return std::to_string(g.t) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w);
}

// fp32 1 / base^(num/den), the way torch evaluates `1.0 / (base ** (arange(...) / dim))`:
// the exponent is an fp32 quotient, the power and the reciprocal are fp32.
float inverse_frequency(double base, int num, int den) {
  float exponent = static_cast<float>(num) / static_cast<float>(den);
  float power = static_cast<float>(std::pow(base, static_cast<double>(exponent)));
  return 1.0f / power;
}

// (row, col) in patch units of patch `within` (0 .. h·w−1) of one temporal slice, with patches
// in merge order (vision_utils.get_vision_interpolation_indices_and_weights).
struct PatchRowCol {
  int row, col;
};
PatchRowCol merge_order_row_col(int64_t within, int w, int merge) {
  int64_t blocks_w = w / merge;
  int64_t in_col = within % merge;
  int64_t in_row = (within / merge) % merge;
  int64_t block_col = (within / (merge * merge)) % blocks_w;
  int64_t block_row = within / (merge * merge * blocks_w);
  return {static_cast<int>(block_row * merge + in_row), static_cast<int>(block_col * merge + in_col)};
}

// Bilinear taps (align_corners=True, border clamp) along one axis, in fp32 exactly as
// _interpolation_axis_taps_weights: src = index·(side−1)/max(size−1, 1), weight = 1 − |src − tap|.
struct AxisTaps {
  int tap[2];
  float weight[2];
};
AxisTaps bilinear_axis(int index, int size, int side) {
  float src = static_cast<float>(index * (side - 1)) / static_cast<float>(std::max(size - 1, 1));
  float floor_src = std::floor(src);
  AxisTaps a{};
  for (int o = 0; o < 2; ++o) {
    int raw = static_cast<int>(floor_src) + o;
    a.tap[o] = std::clamp(raw, 0, side - 1);
    float distance = std::fabs((src - floor_src) - static_cast<float>(o));
    a.weight[o] = std::max(1.0f - distance, 0.0f);
  }
  return a;
}

}  // namespace

Status validate_grid(const ImageGrid& g, const VisionConfig& vision, int image_index) {
  int m = vision.spatial_merge_size;
  if (g.t < 1 || g.h < 1 || g.w < 1 || g.h % m != 0 || g.w % m != 0) {
    return invalid_argument("image " + std::to_string(image_index) + ": grid " + grid_string(g) +
                            " is not a positive t x h x w with h and w multiples of the merge size " +
                            std::to_string(m));
  }
  return Status::ok();
}

Result<PromptPositions> prompt_positions(std::span<const int32_t> ids, std::span<const ImageGrid> grids,
                                         const ModelConfig& config) {
  const int image_id = config.tokens.image_token_id;
  const int video_id = config.tokens.video_token_id;
  const int m = config.vision.spatial_merge_size;
  if (ids.empty()) return invalid_argument("prompt_positions: empty prompt (0 token ids)");

  PromptPositions out;
  out.positions.resize(ids.size() * 3);
  int64_t cur = 0, max_pos = -1;
  size_t next_image = 0;
  size_t i = 0;
  while (i < ids.size()) {
    if (ids[i] == video_id) {
      return unimplemented("token " + std::to_string(i) + " is a video pad (" + std::to_string(video_id) +
                           "): video input is not supported");
    }
    if (ids[i] != image_id) {  // one text token
      for (int a = 0; a < 3; ++a) out.positions[i * 3 + a] = static_cast<int32_t>(cur);
      max_pos = std::max(max_pos, cur);
      ++cur;
      ++i;
      continue;
    }
    // A run of image pads is one image (v5 groups contiguous mm_token_type_ids).
    size_t end = i;
    while (end < ids.size() && ids[end] == image_id) ++end;
    const int64_t run = static_cast<int64_t>(end - i);
    if (next_image >= grids.size()) {
      return invalid_argument("image pad run " + std::to_string(next_image) + " at token " + std::to_string(i) + " (" +
                              std::to_string(run) + " tokens) has no image: only " + std::to_string(grids.size()) +
                              " image grid(s) given");
    }
    const ImageGrid& g = grids[next_image];
    QVL_RETURN_IF_ERROR(validate_grid(g, config.vision, static_cast<int>(next_image)));
    if (g.t != 1) {
      return unimplemented("image " + std::to_string(next_image) + ": grid " + grid_string(g) +
                           " has t != 1 (video) which is not supported");
    }
    const int64_t gh = g.h / m, gw = g.w / m;
    if (run != gh * gw) {
      return invalid_argument("image " + std::to_string(next_image) + ": placeholder count " + std::to_string(run) +
                              " at token " + std::to_string(i) + " does not match " + std::to_string(gh * gw) +
                              " image tokens of grid " + grid_string(g));
    }
    for (int64_t k = 0; k < run; ++k) {
      int64_t r = k / gw, c = k % gw;
      int32_t* p = &out.positions[(i + k) * 3];
      p[0] = static_cast<int32_t>(cur);
      p[1] = static_cast<int32_t>(cur + r);
      p[2] = static_cast<int32_t>(cur + c);
      max_pos = std::max({max_pos, cur + r, cur + c});
    }
    cur += std::max(gh, gw);
    ++next_image;
    i = end;
  }
  if (next_image != grids.size()) {
    return invalid_argument("prompt has " + std::to_string(next_image) + " image pad run(s) but " +
                            std::to_string(grids.size()) + " image grid(s) were given");
  }
  out.rope_delta = max_pos + 1 - static_cast<int64_t>(ids.size());
  return out;
}

MropeSpec make_mrope_spec(const TextConfig& text) {
  const int half = text.head_dim / 2;
  MropeSpec spec;
  spec.inv_freq.resize(half);
  spec.axis.resize(half);
  for (int j = 0; j < half; ++j) {
    spec.inv_freq[j] = inverse_frequency(text.rope_theta, 2 * j, text.head_dim);
    uint8_t axis = 0;  // T
    if (j % 3 == 1 && j < 3 * text.mrope_section[1])
      axis = 1;  // H
    else if (j % 3 == 2 && j < 3 * text.mrope_section[2])
      axis = 2;  // W
    spec.axis[j] = axis;
  }
  return spec;
}

std::vector<float> vision_rope_inv_freq(const VisionConfig& vision) {
  const int spatial = vision.head_dim() / 2;
  std::vector<float> inv(spatial / 2);
  for (int k = 0; k < spatial / 2; ++k) inv[k] = inverse_frequency(vision.rope_theta, 2 * k, spatial);
  return inv;
}

VisionLayout vision_layout(const VisionConfig& vision, std::span<const ImageGrid> grids) {
  VisionLayout L;
  L.cu_seqlens.push_back(0);
  L.token_offsets.push_back(0);
  for (const ImageGrid& g : grids) {
    L.num_patches += g.num_patches();
    L.num_tokens += g.num_tokens(vision.spatial_merge_size);
    L.token_offsets.push_back(L.num_tokens);
    for (int t = 0; t < g.t; ++t) {
      L.cu_seqlens.push_back(L.cu_seqlens.back() + g.h * g.w);
      L.max_seqlen = std::max(L.max_seqlen, g.h * g.w);
    }
  }
  return L;
}

int64_t vision_angle_rows(std::span<const ImageGrid> grids) {
  int64_t rows = 0;
  for (const ImageGrid& g : grids) rows = std::max<int64_t>(rows, std::max(g.h, g.w));
  return rows;
}

void write_vision_factors(const VisionConfig& vision, std::span<const ImageGrid> grids, int32_t* interp_index,
                          float* interp_weight, int32_t* row_col, float* angles) {
  const int m = vision.spatial_merge_size;
  const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(vision.num_position_embeddings))));
  QVL_CHECK_EQ(side * side, vision.num_position_embeddings) << "position table is not square";
  const std::vector<float> inv = vision_rope_inv_freq(vision);
  const int q = static_cast<int>(inv.size());
  QVL_CHECK_EQ(4 * q, vision.head_dim()) << "vision head_dim";

  // The rotary angle of frequency e at position p is p·inv[e], for rows and columns alike.
  const int64_t positions = vision_angle_rows(grids);
  for (int64_t p = 0; p < positions; ++p) {
    for (int e = 0; e < q; ++e) {
      const float angle = static_cast<float>(p) * inv[e];
      angles[(p * 2 + 0) * q + e] = std::cos(angle);
      angles[(p * 2 + 1) * q + e] = std::sin(angle);
    }
  }

  int64_t n = 0;
  for (const ImageGrid& g : grids) {
    // Bilinear taps of every row and column of this grid.
    std::vector<AxisTaps> row_taps(g.h), col_taps(g.w);
    for (int r = 0; r < g.h; ++r) row_taps[r] = bilinear_axis(r, g.h, side);
    for (int c = 0; c < g.w; ++c) col_taps[c] = bilinear_axis(c, g.w, side);
    for (int t = 0; t < g.t; ++t) {
      for (int64_t within = 0; within < static_cast<int64_t>(g.h) * g.w; ++within, ++n) {
        auto [row, col] = merge_order_row_col(within, g.w, m);
        // Learned position table, bilinearly resampled from side x side to h x w.
        const AxisTaps &ar = row_taps[row], &ac = col_taps[col];
        for (int a = 0; a < 2; ++a) {
          for (int b = 0; b < 2; ++b) {
            interp_index[n * 4 + a * 2 + b] = ar.tap[a] * side + ac.tap[b];
            interp_weight[n * 4 + a * 2 + b] = ar.weight[a] * ac.weight[b];
          }
        }
        row_col[n * 2] = row;
        row_col[n * 2 + 1] = col;
      }
    }
  }
}

void write_vision_tables(const VisionConfig& vision, std::span<const ImageGrid> grids, int32_t* interp_index,
                         float* interp_weight, float* rope) {
  int64_t n = 0;
  for (const ImageGrid& g : grids) n += g.num_patches();
  const int q = vision.head_dim() / 4;
  const int64_t positions = vision_angle_rows(grids);
  std::vector<int32_t> row_col(static_cast<size_t>(n * 2));
  std::vector<float> angles(static_cast<size_t>(positions * 2 * q));
  write_vision_factors(vision, grids, interp_index, interp_weight, row_col.data(), angles.data());
  expand_vision_rope(rope, row_col.data(), angles.data(), n, positions, q);
}

}  // namespace qvl
