// Prediction and allocation cannot drift: the real Qwen3-VL forward (CPU backend, random tiny
// weights) runs in arenas of exactly the size memory/activations.h predicts, and its high-water
// mark lands exactly on the prediction (rounded to the arena alignment, because the last
// allocation of the peak is not padded). An allocation the terms do not name overflows the arena
// (a CheckFailure with the numbers); a term the forward no longer allocates leaves the high water
// short of the prediction. Both fail here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/arena.h"
#include "image/image.h"
#include "memory/activations.h"
#include "model/model.h"
#include "model/presets.h"
#include "random_model.h"

namespace qvl {
namespace {

int64_t aligned(size_t bytes) {
  const int64_t a = static_cast<int64_t>(Arena::kAlignment);
  return (static_cast<int64_t>(bytes) + a - 1) / a * a;
}

struct TinyModel {
  explicit TinyModel(const char* preset)
      : config(preset_config(preset).value()), backend(make_cpu_backend(2)), random(config, *backend, 3) {
    model = Qwen3VLModel::create(*backend, config, random.weights).value();
  }
  ModelConfig config;
  std::unique_ptr<Backend> backend;
  test::RandomModel random;
  std::unique_ptr<Qwen3VLModel> model;
};

std::vector<float> random_pixels(const ModelConfig& c, const ImageGrid& g, uint32_t seed) {
  std::vector<float> px(static_cast<size_t>(g.num_patches() * c.vision.patch_dim()));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  for (float& v : px) v = d(gen);
  return px;
}

std::vector<uint8_t> random_rgb(const ModelConfig& c, const ImageGrid& g, uint32_t seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(g.num_patches() * c.vision.patch_size * c.vision.patch_size * 3));
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(0, 255);
  for (uint8_t& v : rgb) v = static_cast<uint8_t>(d(gen));
  return rgb;
}

// The plan's peak had the patch stage been only `patch_stage` (one input form).
int64_t peak_with_patch_stage(VisionActivationTerms t, int64_t patch_stage) {
  t.patch_stage = patch_stage;
  return t.peak();
}

// Encodes `grids` in both input forms (RGB bytes, and the same images as f32 pixel values) in
// arenas of exactly the predicted peak: each form peaks exactly where the plan says for that
// form, the plan holds the larger, and the two forms give the same bits.
void check_vision(TinyModel& m, const std::vector<ImageGrid>& grids) {
  const VisionConfig& vc = m.config.vision;
  std::vector<std::vector<uint8_t>> rgb;
  std::vector<std::vector<float>> px;
  std::vector<ImageInput> rgb_images, px_images;
  int64_t patches = 0, segments = 0;
  for (const ImageGrid& g : grids) {
    rgb.push_back(random_rgb(m.config, g, 7));
    px.emplace_back(static_cast<size_t>(g.num_patches() * vc.patch_dim()));
    image::patchify_into(rgb.back().data(), g.h * vc.patch_size, g.w * vc.patch_size, vc.patch_size,
                         vc.spatial_merge_size, vc.temporal_patch_size, px.back().data());
    patches += g.num_patches();
    segments += g.t;
  }
  for (size_t i = 0; i < grids.size(); ++i) {
    rgb_images.push_back({nullptr, grids[i], rgb[i].data()});
    px_images.push_back({px[i].data(), grids[i]});
  }
  const VisionActivationTerms terms =
      vision_activation_terms(m.config, patches, m.backend->activation_dtype(), segments);
  ASSERT_EQ(terms.patch_stage, std::max(terms.patch_stage_pixels, terms.patch_stage_rgb));
  std::vector<uint8_t> first_embeds;
  for (const bool from_rgb : {true, false}) {
    SCOPED_TRACE(from_rgb ? "rgb bytes" : "pixel values");
    const std::vector<ImageInput>& images = from_rgb ? rgb_images : px_images;
    const int64_t want_peak = peak_with_patch_stage(terms, from_rgb ? terms.patch_stage_rgb : terms.patch_stage_pixels);
    DeviceBuffer buffer = m.backend->allocate(static_cast<size_t>(terms.peak()), "test arena").value();
    Arena arena(buffer.data(), buffer.size(), m.backend->device(), "vision arena");
    Result<VisionOutput> out = m.model->encode_images(images, arena);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(aligned(arena.high_water()), want_peak) << patches << " patches in " << segments << " segments";
    // What stays allocated for the caller is exactly the features.
    EXPECT_EQ(aligned(arena.used()), terms.features());
    // Both forms: the same bits.
    const auto* e = static_cast<const uint8_t*>(out->embeds.data);
    if (from_rgb)
      first_embeds.assign(e, e + out->embeds.nbytes());
    else
      EXPECT_TRUE(std::equal(first_embeds.begin(), first_embeds.end(), e)) << "rgb and pixel forms differ";

    // Through an upload staging buffer of exactly the predicted size: the same arena peak and the
    // same outputs bit for bit (only the way the bytes travel differs).
    DeviceBuffer staging = m.backend->allocate_host(static_cast<size_t>(terms.upload_staging), "staging").value();
    DeviceBuffer buffer2 = m.backend->allocate(static_cast<size_t>(terms.peak()), "test arena 2").value();
    Arena arena2(buffer2.data(), buffer2.size(), m.backend->device(), "vision arena 2");
    Result<VisionOutput> staged = m.model->encode_images(images, arena2, {staging.data(), staging.size()});
    ASSERT_TRUE(staged.is_ok()) << staged.status().to_string();
    EXPECT_EQ(aligned(arena2.high_water()), want_peak);
    ASSERT_EQ(staged->embeds.nbytes(), out->embeds.nbytes());
    EXPECT_EQ(std::memcmp(staged->embeds.data, out->embeds.data, out->embeds.nbytes()), 0);
    ASSERT_EQ(staged->deepstack.size(), out->deepstack.size());
    for (size_t j = 0; j < out->deepstack.size(); ++j)
      EXPECT_EQ(std::memcmp(staged->deepstack[j].data, out->deepstack[j].data, out->deepstack[j].nbytes()), 0) << j;
    // One allocation slot less does not hold the pixel values (the larger upload): the
    // prediction is the need, rounded.
    if (!from_rgb) {
      arena2.reset();
      EXPECT_THROW((void)m.model->encode_images(images, arena2, {staging.data(), staging.size() - Arena::kAlignment}),
                   CheckFailure);
    }
  }
}

TEST(ArenaMatchesTheForward, VisionEncoder) {
  for (const char* preset : {"tiny", "tiny-untied"}) {
    SCOPED_TRACE(preset);
    TinyModel m(preset);
    check_vision(m, {{1, 4, 6}});
    check_vision(m, {{1, 8, 8}, {1, 4, 4}});  // two segments
    check_vision(m, {{1, 2, 12}});            // merge-size high: as many rotary angle rows as N allows
  }
}

// Each image comes in exactly one form, and one call does not mix them: a clear error, not a
// guess.
TEST(EncodeImages, RefusesAmbiguousInputForms) {
  TinyModel m("tiny");
  const ImageGrid g{1, 4, 4};
  std::vector<uint8_t> rgb = random_rgb(m.config, g, 1);
  std::vector<float> px = random_pixels(m.config, g, 1);
  const VisionActivationTerms terms = vision_activation_terms(m.config, 2 * g.num_patches(), DType::kF32, 2);
  DeviceBuffer buffer = m.backend->allocate(static_cast<size_t>(terms.peak()), "arena").value();
  struct Case {
    std::vector<ImageInput> images;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{{px.data(), g, rgb.data()}}, "not both"},
      {{{nullptr, g, nullptr}}, "not neither"},
      {{{px.data(), g}, {nullptr, g, rgb.data()}}, "all be pixel values or all RGB bytes"},
      {{{nullptr, ImageGrid{2, 4, 4}, rgb.data()}}, "RGB bytes need grid t = 1"},
  };
  for (const Case& c : cases) {
    Arena arena(buffer.data(), buffer.size(), m.backend->device(), "arena");
    Result<VisionOutput> out = m.model->encode_images(c.images, arena);
    ASSERT_FALSE(out.is_ok()) << c.says;
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find(c.says), std::string::npos) << out.status().to_string();
  }
}

// One decoder step of `rows` rows (image rows [img_begin, img_begin + img_rows) taken from a
// vision pass) in an arena of exactly the predicted peak.
void check_decoder_step(TinyModel& m, int64_t rows, int64_t logits_rows, bool with_image) {
  SCOPED_TRACE(testing::Message() << rows << " rows, " << logits_rows << " logits rows, image " << with_image);
  Backend& be = *m.backend;
  const ModelConfig& c = m.config;
  const DType act = be.activation_dtype();

  // The image features live in their own arena here (the runner keeps them below the step).
  const ImageGrid grid{1, 4, 4};  // 4 merged tokens
  std::vector<float> px = random_pixels(c, grid, 9);
  ImageInput image{px.data(), grid};
  const VisionActivationTerms vt = vision_activation_terms(c, grid.num_patches(), act);
  DeviceBuffer vbuf = be.allocate(static_cast<size_t>(vt.peak()), "features").value();
  Arena varena(vbuf.data(), vbuf.size(), be.device(), "features");
  VisionOutput vis = m.model->encode_images(std::span<const ImageInput>(&image, 1), varena).value();

  // KV cache of 4 pages of 16 tokens, identity page table.
  KvCacheView cache;
  cache.dtype = act;
  cache.page_size = 16;
  cache.num_pages = 4;
  cache.num_layers = c.text.num_hidden_layers;
  cache.num_kv_heads = c.text.num_key_value_heads;
  cache.head_dim = c.text.head_dim;
  DeviceBuffer kv = be.allocate(cache.page_bytes() * cache.num_pages, "kv").value();
  cache.base = kv.data();

  // Step inputs and logits in their own buffers, as the runners keep them.
  DeviceBuffer ibuf = be.allocate(static_cast<size_t>(step_input_bytes(rows, 1, cache.num_pages)), "inputs").value();
  Arena inputs(ibuf.data(), ibuf.size(), be.device(), "inputs");
  auto upload = [&](std::initializer_list<int64_t> dims, const std::vector<int32_t>& host) {
    Tensor t = inputs.alloc(DType::kI32, dims);
    be.copy_to_device(t, host.data());
    return t;
  };
  std::vector<int32_t> ids(rows, 872), positions, slots, page_table{0, 1, 2, 3}, logit_rows;
  const int64_t img_begin = 1, img_rows = with_image ? vis.embeds.dim(0) : 0;
  for (int64_t i = img_begin; i < img_begin + img_rows; ++i) ids[i] = c.tokens.image_token_id;
  for (int64_t i = 0; i < rows; ++i) {
    positions.insert(positions.end(), {static_cast<int32_t>(i), static_cast<int32_t>(i), static_cast<int32_t>(i)});
    slots.push_back(static_cast<int32_t>(i));
  }
  for (int64_t i = rows - logits_rows; i < rows; ++i) logit_rows.push_back(static_cast<int32_t>(i));
  TextBatch batch;
  batch.num_seqs = 1;
  batch.num_tokens = static_cast<int>(rows);
  batch.max_pages_per_seq = static_cast<int>(cache.num_pages);
  batch.max_context = static_cast<int>(rows);
  TextStepInputs in;
  in.token_ids = upload({rows}, ids);
  batch.positions = upload({rows, 3}, positions);
  batch.slots = upload({rows}, slots);
  batch.query_start = upload({2}, {0, static_cast<int32_t>(rows)});
  batch.context_len = upload({1}, {static_cast<int32_t>(rows)});
  batch.page_table = upload({1, cache.num_pages}, page_table);
  in.logits_rows = upload({logits_rows}, logit_rows);
  if (with_image) {
    VisionOutput::Slice s = vis.rows(0, img_rows);
    in.visual.push_back({static_cast<int32_t>(img_begin), s.embeds, s.deepstack});
  }
  const DecoderActivationTerms terms = decoder_activation_terms(c, rows, logits_rows, act);
  DeviceBuffer lbuf = be.allocate(static_cast<size_t>(terms.logits), "logits").value();
  Tensor logits(lbuf.data(), act, {logits_rows, c.text.vocab_size}, be.device());

  DeviceBuffer abuf = be.allocate(static_cast<size_t>(terms.peak()), "step arena").value();
  Arena arena(abuf.data(), abuf.size(), be.device(), "decoder arena");
  m.model->forward(batch, in, cache, logits, arena);
  EXPECT_EQ(aligned(arena.high_water()), terms.peak());
  EXPECT_EQ(arena.used(), 0u);  // everything released
}

TEST(ArenaMatchesTheForward, DecoderStep) {
  for (const char* preset : {"tiny", "tiny-untied"}) {
    SCOPED_TRACE(preset);
    TinyModel m(preset);
    check_decoder_step(m, 12, 1, true);   // prefill chunk with image rows (deepstack adds)
    check_decoder_step(m, 12, 3, false);  // text only, three logits rows
    check_decoder_step(m, 1, 1, false);   // a decode step
  }
}

}  // namespace
}  // namespace qvl
