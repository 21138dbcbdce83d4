// Host-side index math of the model (model/positions.h) against the reference formulas and the
// values the spec's probe read from transformers 5.17 (qwen3vl-spec.md §5.2, §5.3, §6.2, §6.4).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/positions.h"

namespace qvl {
namespace {

constexpr int kImg = 151655, kVs = 151652, kVe = 151653, kText = 100;

std::vector<int32_t> column(const PromptPositions& p, int axis) {
  std::vector<int32_t> c;
  for (size_t i = 0; i < p.positions.size() / 3; ++i) c.push_back(p.positions[i * 3 + axis]);
  return c;
}

TEST(PromptPositions, MatchesSpecProbe) {
  // Spec §6.2 probe (v5.17): ids [t,t,t,<vs>, 6×<img>, <ve>, t, t], grid (1,4,6).
  std::vector<int32_t> ids = {kText, kText, kText, kVs, kImg, kImg, kImg, kImg, kImg, kImg, kVe, kText, kText};
  ImageGrid g{1, 4, 6};
  auto r = prompt_positions(ids, std::span(&g, 1), ModelConfig{});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(column(*r, 0), (std::vector<int32_t>{0, 1, 2, 3, 4, 4, 4, 4, 4, 4, 7, 8, 9}));
  EXPECT_EQ(column(*r, 1), (std::vector<int32_t>{0, 1, 2, 3, 4, 4, 4, 5, 5, 5, 7, 8, 9}));
  EXPECT_EQ(column(*r, 2), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(r->rope_delta, -3);
}

TEST(PromptPositions, TextOnlyIsArangeWithZeroDelta) {
  std::vector<int32_t> ids(7, kText);
  auto r = prompt_positions(ids, {}, ModelConfig{});
  ASSERT_TRUE(r.is_ok());
  for (int i = 0; i < 7; ++i)
    for (int a = 0; a < 3; ++a) EXPECT_EQ(r->positions[i * 3 + a], i);
  EXPECT_EQ(r->rope_delta, 0);
}

TEST(PromptPositions, TwoImagesAdvanceByTheLongerSide) {
  // Image 0 grid (1,2,6): 1x3 merged -> advance 3; image 1 grid (1,4,2): 2x1 merged -> advance 2.
  std::vector<int32_t> ids = {kText, kVs, kImg, kImg, kImg, kVe, kVs, kImg, kImg, kVe, kText};
  ImageGrid grids[] = {{1, 2, 6}, {1, 4, 2}};
  auto r = prompt_positions(ids, grids, ModelConfig{});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  // cur: text 0 ->1, vs 1 ->2, image0 at 2 (T=2, H=2, W=2..4) -> cur 5, ve 5 ->6, vs 6 ->7,
  // image1 at 7 (T=7, H=7..8, W=7) -> cur 9, ve 9, text 10.
  EXPECT_EQ(column(*r, 0), (std::vector<int32_t>{0, 1, 2, 2, 2, 5, 6, 7, 7, 9, 10}));
  EXPECT_EQ(column(*r, 1), (std::vector<int32_t>{0, 1, 2, 2, 2, 5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(column(*r, 2), (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 7, 9, 10}));
  // max position 10, L = 11 -> delta 0; equivalently Σ (max(h',w') − h'·w') = (3−3) + (2−2).
  EXPECT_EQ(r->rope_delta, 0);
}

TEST(PromptPositions, DeltaIsSumOfMaxSideMinusTokens) {
  // One 4x4 merged image (grid 1,8,8): 16 tokens, advance 4 -> delta = 4 − 16 = −12.
  std::vector<int32_t> ids = {kText, kVs};
  ids.insert(ids.end(), 16, kImg);
  ids.push_back(kVe);
  ImageGrid g{1, 8, 8};
  auto r = prompt_positions(ids, std::span(&g, 1), ModelConfig{});
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->rope_delta, -12);
  EXPECT_EQ(decode_position(static_cast<int64_t>(ids.size()), r->rope_delta), 2 + 4 + 1);
}

TEST(PromptPositions, ErrorsNameImageAndCounts) {
  std::vector<int32_t> ids = {kVs, kImg, kImg, kImg, kVe};
  ImageGrid g{1, 4, 4};  // 4 tokens expected, 3 given
  auto r = prompt_positions(ids, std::span(&g, 1), ModelConfig{});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("placeholder count 3"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("does not match 4"), std::string::npos) << r.status().message();

  auto missing = prompt_positions(ids, {}, ModelConfig{});
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("only 0 image grid"), std::string::npos);

  ImageGrid two[] = {{1, 2, 6}, {1, 2, 2}};
  std::vector<int32_t> one_run = {kImg, kImg, kImg};
  auto extra = prompt_positions(one_run, two, ModelConfig{});
  ASSERT_FALSE(extra.is_ok());
  EXPECT_NE(extra.status().message().find("1 image pad run(s) but 2 image grid(s)"), std::string::npos);

  std::vector<int32_t> video = {kText, 151656};
  EXPECT_EQ(prompt_positions(video, {}, ModelConfig{}).status().code(), StatusCode::kUnimplemented);
  ImageGrid odd{1, 3, 4};
  std::vector<int32_t> pads(3, kImg);
  EXPECT_EQ(prompt_positions(pads, std::span(&odd, 1), ModelConfig{}).status().code(), StatusCode::kInvalidArgument);
}

TEST(Mrope, AxisMapAndInvFreqMatchProbe) {
  MropeSpec s = make_mrope_spec(TextConfig{});  // head_dim 128, theta 5e6, sections [24,20,20]
  ASSERT_EQ(s.inv_freq.size(), 64u);
  // Probe: axis map = "THW" x 20 + "TTTT".
  for (int j = 0; j < 64; ++j) {
    int expected = j < 60 ? j % 3 : 0;
    EXPECT_EQ(s.axis[j], expected) << j;
  }
  // Probe values of inv_freq (fp32).
  EXPECT_FLOAT_EQ(s.inv_freq[0], 1.0f);
  EXPECT_FLOAT_EQ(s.inv_freq[1], 0.78583002f);
  EXPECT_FLOAT_EQ(s.inv_freq[2], 0.61752874f);
  EXPECT_FLOAT_EQ(s.inv_freq[3], 0.48527262f);
  EXPECT_FLOAT_EQ(s.inv_freq[63], 2.5450797e-07f);
}

TEST(Mrope, TinySectionsCountPerAxis) {
  // Sections [4,2,2] over head_dim 16: T gets 4 of the 8 frequencies, H and W 2 each.
  TextConfig t;
  t.head_dim = 16;
  t.mrope_section = {4, 2, 2};
  MropeSpec s = make_mrope_spec(t);
  int count[3] = {0, 0, 0};
  for (uint8_t a : s.axis) count[a]++;
  EXPECT_EQ(count[0], 4);
  EXPECT_EQ(count[1], 2);
  EXPECT_EQ(count[2], 2);
  EXPECT_EQ(s.axis[1], 1);
  EXPECT_EQ(s.axis[2], 2);
  EXPECT_EQ(s.axis[6], 0);  // j = 6 >= 3·2: back to T although 6 % 3 == 0 anyway
  EXPECT_EQ(s.axis[7], 0);  // j = 7: 7 % 3 == 1 but 7 >= 3·2 -> T
}

// write_vision_tables for `grids` into vectors of their own.
struct Tables {
  std::vector<int32_t> idx;  // [N, 4]
  std::vector<float> wts;    // [N, 4]
  std::vector<float> rope;   // [N, 2, head_dim]
};
Tables tables_of(const VisionConfig& v, std::span<const ImageGrid> grids) {
  int64_t n = 0;
  for (const ImageGrid& g : grids) n += g.num_patches();
  Tables t{std::vector<int32_t>(n * 4), std::vector<float>(n * 4), std::vector<float>(n * 2 * v.head_dim())};
  write_vision_tables(v, grids, t.idx.data(), t.wts.data(), t.rope.data());
  return t;
}

// The spec §5.2 formula in double: yr = r(S−1)/(h−1), taps floor/floor+1 clamped, weights
// (1−dy)(1−dx), (1−dy)dx, dy(1−dx), dy·dx.
TEST(VisionLayout, InterpolationMatchesBilinearFormula) {
  VisionConfig v;
  v.num_position_embeddings = 64;  // 8 x 8
  ImageGrid grids[] = {{1, 4, 6}, {2, 10, 2}};
  VisionLayout L = vision_layout(v, grids);
  const Tables T = tables_of(v, grids);
  ASSERT_EQ(L.num_patches, 24 + 40);
  const int S = 8;
  int64_t n = 0;
  for (const ImageGrid& g : grids) {
    for (int t = 0; t < g.t; ++t) {
      // Merge order: 2x2 blocks in raster order, inside a block row-major.
      for (int hb = 0; hb < g.h / 2; ++hb)
        for (int wb = 0; wb < g.w / 2; ++wb)
          for (int hi = 0; hi < 2; ++hi)
            for (int wi = 0; wi < 2; ++wi, ++n) {
              int r = 2 * hb + hi, c = 2 * wb + wi;
              double yr = g.h == 1 ? 0 : r * (S - 1.0) / (g.h - 1), xc = g.w == 1 ? 0 : c * (S - 1.0) / (g.w - 1);
              int r0 = static_cast<int>(std::floor(yr)), c0 = static_cast<int>(std::floor(xc));
              int r1 = std::min(r0 + 1, S - 1), c1 = std::min(c0 + 1, S - 1);
              double dy = yr - r0, dx = xc - c0;
              int idx[4] = {r0 * S + c0, r0 * S + c1, r1 * S + c0, r1 * S + c1};
              double w[4] = {(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx};
              for (int k = 0; k < 4; ++k) {
                EXPECT_EQ(T.idx[n * 4 + k], idx[k]) << "patch " << n << " tap " << k;
                EXPECT_NEAR(T.wts[n * 4 + k], w[k], 1e-6) << "patch " << n << " tap " << k;
              }
            }
    }
  }
  // Segments: one per temporal slice.
  EXPECT_EQ(L.cu_seqlens, (std::vector<int32_t>{0, 24, 44, 64}));
  EXPECT_EQ(L.max_seqlen, 24);
  EXPECT_EQ(L.num_tokens, 6 + 10);
  EXPECT_EQ(L.token_offsets, (std::vector<int64_t>{0, 6, 16}));
}

// Spec §5.3: θ[d] = row·inv[e] if e < q else col·inv[e−q], e = d mod (dh/2), q = dh/4,
// inv[k] = 10000^(−2k/(dh/2)).
TEST(VisionLayout, RopeMatchesAxialFormula) {
  VisionConfig v;  // head_dim 64
  ImageGrid g{1, 4, 4};
  const Tables T = tables_of(v, std::span(&g, 1));
  const int dh = 64, q = 16;
  for (int n = 0; n < 16; ++n) {
    int block = n / 4, in = n % 4;
    int row = (block / 2) * 2 + in / 2, col = (block % 2) * 2 + in % 2;
    for (int d = 0; d < dh; ++d) {
      int e = d % (dh / 2);
      double inv = std::pow(10000.0, -2.0 * (e % q) / (dh / 2));
      double angle = (e < q ? row : col) * inv;
      EXPECT_NEAR(T.rope[(n * 2 + 0) * dh + d], std::cos(angle), 2e-6) << n << " " << d;
      EXPECT_NEAR(T.rope[(n * 2 + 1) * dh + d], std::sin(angle), 2e-6) << n << " " << d;
    }
  }
}

// The table is filled from cos/sin evaluated once per position: the same floats as evaluating
// cos(float(row) · inv[e]) per patch and per dimension (the direct form of spec §5.3), bit for
// bit, for several images.
TEST(VisionLayout, RopeTableEqualsThePerPatchEvaluation) {
  VisionConfig v;  // head_dim 64
  const ImageGrid grids[] = {{1, 48, 64}, {1, 6, 2}, {2, 4, 4}};
  const Tables T = tables_of(v, grids);
  const std::vector<float> inv = vision_rope_inv_freq(v);
  const int dh = v.head_dim(), q = dh / 4;
  int64_t n = 0;
  for (const ImageGrid& g : grids) {
    for (int t = 0; t < g.t; ++t) {
      for (int hb = 0; hb < g.h / 2; ++hb)
        for (int wb = 0; wb < g.w / 2; ++wb)
          for (int hi = 0; hi < 2; ++hi)
            for (int wi = 0; wi < 2; ++wi, ++n) {
              const int row = 2 * hb + hi, col = 2 * wb + wi;
              for (int d = 0; d < dh; ++d) {
                const int e = d % (dh / 2);
                const float angle = e < q ? static_cast<float>(row) * inv[e] : static_cast<float>(col) * inv[e - q];
                ASSERT_EQ(T.rope[(n * 2 + 0) * dh + d], std::cos(angle)) << "patch " << n << " dim " << d;
                ASSERT_EQ(T.rope[(n * 2 + 1) * dh + d], std::sin(angle)) << "patch " << n << " dim " << d;
              }
            }
    }
  }
  ASSERT_EQ(n * 2 * dh, static_cast<int64_t>(T.rope.size()));
}

TEST(VisionLayout, GridValidation) {
  VisionConfig v;
  EXPECT_TRUE(validate_grid({1, 4, 6}, v, 0).is_ok());
  Status s = validate_grid({1, 5, 6}, v, 2);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("image 2: grid 1x5x6"), std::string::npos) << s.message();
  EXPECT_FALSE(validate_grid({0, 4, 4}, v, 0).is_ok());
}

}  // namespace
}  // namespace qvl
