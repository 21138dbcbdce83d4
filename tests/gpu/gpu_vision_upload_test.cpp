// The vision encoder's host path on CUDA: pixels go up as F32 through a pinned staging buffer and
// are cast to BF16 on the device. Checks that the device cast is core/dtype.h float_to_bf16 bit
// for bit (round to nearest even, halfway cases, infinities, NaN, subnormals, odd lengths), that
// the encoder gives the same bits through the staging buffer as through pageable copies (and is
// close to the CPU oracle), and that on CUDA it peaks exactly at the arena the plan predicts.
#include <cstring>
#include <filesystem>
#include <limits>

#include "core/arena.h"
#include "gpu/gpu_util.h"
#include "image/image.h"
#include "io/checkpoint.h"
#include "io/gen_model.h"
#include "memory/activations.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
#include "model/positions.h"
#include "model/presets.h"
#include "support/test_support.h"

namespace qvl::test::gpu {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Random floats over many binades, with the values rounding cares about up front.
std::vector<float> convert_inputs(int64_t n) {
  std::vector<float> v = {
      from_bits(0x3f808000u),  // halfway, even below: stays 0x3f80
      from_bits(0x3f818000u),  // halfway, odd below: rounds up to 0x3f82
      from_bits(0x3f808001u),  // just over halfway
      from_bits(0x3f807fffu),  // just under halfway
      from_bits(0xbf818000u),  // negative halfway
      std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::max(),  // rounds to +inf
      from_bits(0x7f7f7fffu),             // largest that stays finite
      std::numeric_limits<float>::denorm_min(),
      from_bits(0x00018000u),  // subnormal halfway
      -0.0f,
      std::numeric_limits<float>::quiet_NaN(),
      from_bits(0x7f800001u),  // signalling NaN: made quiet
      from_bits(0xffc12345u),  // negative NaN with payload
  };
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  while (static_cast<int64_t>(v.size()) < n) v.push_back(std::ldexp(normal(rng()), exponent(rng())));
  v.resize(static_cast<size_t>(n));
  return v;
}

TEST(GpuOps, ConvertIsFloatToBf16BitForBit) {
  QVL_REQUIRE_CUDA();
  Backend& be = *cuda();
  for (int64_t n : {1, 7, 8, 9, 15, 4099, 3072 * 1536}) {
    SCOPED_TRACE(n);
    Scratch s;
    const std::vector<float> x = convert_inputs(n);
    Tensor xg = s.alloc(be, DType::kF32, {n});
    Tensor yg = s.alloc(be, DType::kBF16, {n});
    Tensor back = s.alloc(be, DType::kF32, {n});
    be.copy_to_device(xg, x.data());
    be.convert(yg, xg);
    be.convert(back, yg);
    std::vector<uint16_t> got(static_cast<size_t>(n));
    std::vector<float> got_back(static_cast<size_t>(n));
    be.copy_to_host(got.data(), yg);
    be.copy_to_host(got_back.data(), back);
    // The CPU backend's convert is the same function.
    std::vector<uint16_t> cpu_out(static_cast<size_t>(n));
    cpu().convert(Tensor(cpu_out.data(), DType::kBF16, {n}), Tensor(const_cast<float*>(x.data()), DType::kF32, {n}));
    int64_t bad = 0, bad_back = 0, bad_cpu = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = float_to_bf16(x[i]);
      bad += got[i] != want;
      bad_cpu += cpu_out[i] != want;
      uint32_t back_bits;
      std::memcpy(&back_bits, &got_back[i], 4);
      bad_back += back_bits != (uint32_t{want} << 16);  // BF16 -> F32 is exact
      if (got[i] != want && bad <= 5)
        ADD_FAILURE() << "element " << i << ": got 0x" << std::hex << got[i] << " want 0x" << want;
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(bad_back, 0);
    EXPECT_EQ(bad_cpu, 0);
  }
}

std::vector<uint8_t> random_bytes(int64_t n) {
  std::uniform_int_distribution<int> d(0, 255);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (uint8_t& x : v) x = static_cast<uint8_t>(d(rng()));
  return v;
}

// The device patchify (RGB bytes -> normalised patches in merge order) is the host's
// image::patchify_into bit for bit: F32 exactly, BF16 as float_to_bf16 of it. Grids and patch
// geometries beyond Qwen3-VL's (patch 14, no temporal copy, merge 1) exercise the index math.
TEST(GpuOps, PatchifyRgbIsTheHostPatchifyBitForBit) {
  QVL_REQUIRE_CUDA();
  Backend& be = *cuda();
  struct Geometry {
    int gh, gw, patch, merge, temporal;
  };
  for (const Geometry& g : {Geometry{2, 2, 16, 2, 2}, Geometry{6, 10, 16, 2, 2}, Geometry{48, 64, 16, 2, 2},
                            Geometry{4, 6, 14, 2, 2}, Geometry{3, 5, 16, 1, 1}}) {
    SCOPED_TRACE(testing::Message() << g.gh << "x" << g.gw << " patch " << g.patch << " merge " << g.merge
                                    << " temporal " << g.temporal);
    const int64_t rows = int64_t{g.gh} * g.gw, cols = 3LL * g.temporal * g.patch * g.patch;
    const std::vector<uint8_t> rgb = random_bytes(rows * g.patch * g.patch * 3);
    std::vector<float> want(static_cast<size_t>(rows * cols));
    image::patchify_into(rgb.data(), g.gh * g.patch, g.gw * g.patch, g.patch, g.merge, g.temporal, want.data());
    Scratch s;
    Tensor in = s.alloc(be, DType::kU8, {rows * g.patch * g.patch * 3});
    Tensor f32 = s.alloc(be, DType::kF32, {rows, cols});
    Tensor b16 = s.alloc(be, DType::kBF16, {rows, cols});
    be.copy_to_device(in, rgb.data());
    be.patchify_rgb(f32, in, g.gh, g.gw, g.patch, g.merge, g.temporal);
    be.patchify_rgb(b16, in, g.gh, g.gw, g.patch, g.merge, g.temporal);
    std::vector<float> got(want.size());
    std::vector<uint16_t> got16(want.size());
    be.copy_to_host(got.data(), f32);
    be.copy_to_host(got16.data(), b16);
    int64_t bad = 0, bad16 = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      bad += std::memcmp(&got[i], &want[i], 4) != 0;
      bad16 += got16[i] != float_to_bf16(want[i]);
      if (bad + bad16 > 0 && bad + bad16 <= 3 && (got16[i] != float_to_bf16(want[i]) || got[i] != want[i]))
        ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want[i];
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(bad16, 0);
  }
}

// The device's rotary table (Backend::vision_rope_table from write_vision_factors' row/col and
// angle rows) is the host's write_vision_tables bit for bit: one image, several with different
// sides, a temporal grid, Qwen3-VL's head dim 64 and two others (q = 4: head dim 16; q = 18:
// head dim 72, whose rows are not a multiple of 16 bytes), merge sizes 2 and 1. The angle rows go
// into a table taller than they need, as the encoder allocates it.
TEST(GpuOps, VisionRopeTableIsTheHostTableBitForBit) {
  QVL_REQUIRE_CUDA();
  Backend& be = *cuda();
  struct Case {
    int heads, hidden, merge;
    std::vector<ImageGrid> grids;
  };
  const std::vector<Case> cases = {
      {16, 1024, 2, {{1, 48, 64}}},
      {16, 1024, 2, {{1, 2, 2}, {1, 4, 6}, {1, 2, 30}, {1, 64, 48}}},
      {2, 32, 2, {{2, 4, 4}, {1, 6, 2}}},
      {3, 216, 1, {{1, 3, 5}, {1, 7, 1}}},
  };
  for (const Case& c : cases) {
    VisionConfig v;
    v.num_heads = c.heads;
    v.hidden_size = c.hidden;
    v.spatial_merge_size = c.merge;
    const int dh = v.head_dim(), q = dh / 4;
    int64_t n = 0;
    for (const ImageGrid& g : c.grids) n += g.num_patches();
    SCOPED_TRACE(testing::Message() << c.grids.size() << " grids, " << n << " patches, head dim " << dh);
    std::vector<int32_t> idx(n * 4), row_col(n * 2);
    std::vector<float> wts(n * 4), want(n * 2 * dh);
    write_vision_tables(v, c.grids, idx.data(), wts.data(), want.data());
    const int64_t rows = vision_angle_rows(c.grids), tall = v.max_grid_side(n);
    ASSERT_LE(rows, tall);
    std::vector<float> angles(static_cast<size_t>(rows * 2 * q));
    write_vision_factors(v, c.grids, idx.data(), wts.data(), row_col.data(), angles.data());
    Scratch s;
    Tensor rc = s.alloc(be, DType::kI32, {n, 2});
    Tensor ang = s.alloc(be, DType::kF32, {tall, 2, q});
    Tensor rope = s.alloc(be, DType::kF32, {n, 2, dh});
    be.copy_to_device(rc, row_col.data());
    be.copy_to_device(ang.rows(0, rows), angles.data());
    be.vision_rope_table(rope, rc, ang.rows(0, rows));
    std::vector<float> got(want.size());
    be.copy_to_host(got.data(), rope);
    int64_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], 4) == 0) continue;
      if (++bad <= 3) ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want[i];
    }
    EXPECT_EQ(bad, 0);
    // The CPU backend's op is the same expansion.
    std::vector<float> cpu_rope(want.size());
    cpu().vision_rope_table(Tensor(cpu_rope.data(), DType::kF32, {n, 2, dh}),
                            Tensor(row_col.data(), DType::kI32, {n, 2}),
                            Tensor(angles.data(), DType::kF32, {rows, 2, q}));
    EXPECT_EQ(std::memcmp(cpu_rope.data(), want.data(), want.size() * 4), 0);
  }
}

std::vector<float> random_pixels(int64_t n) {
  // Not BF16-representable: the cast on the device has work to do.
  std::uniform_real_distribution<float> d(-1.8f, 2.2f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng());
  return v;
}

std::vector<uint8_t> bytes_of(Backend& be, const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  be.copy_to_host(b.data(), t);
  return b;
}

TEST(GpuModel, VisionThroughStagingIsBitIdenticalAndPlanned) {
  QVL_REQUIRE_CUDA();
  Backend& be = *cuda();
  for (const char* preset : {"tiny", "tiny-untied"}) {
    SCOPED_TRACE(preset);
    const ModelConfig cfg = preset_config(preset).value();
    // Weights as the production path loads them (model/load.h: every tensor on the backend).
    const std::string dir = scratch_dir(std::string("gpu_vision_upload_") + preset);
    GenModelOptions gen;
    gen.seed = 5;
    gen.max_shard_bytes = kTinyMaxShardBytes;
    ASSERT_TRUE(generate_model(cfg, gen, dir).is_ok());
    Checkpoint ckpt = Checkpoint::open(dir).value();
    const ModelWeights host = bind_host_weights(ckpt, cfg).value();
    auto cm = Qwen3VLModel::create(cpu(), cfg, load_weights(cpu(), host).value());
    auto gm = Qwen3VLModel::create(be, cfg, load_weights(be, host).value());
    ASSERT_TRUE(cm.is_ok() && gm.is_ok());
    const int64_t P = cfg.vision.patch_dim();
    const std::vector<ImageGrid> grids = {{1, 8, 12}, {1, 4, 6}};
    std::vector<std::vector<float>> px;
    std::vector<ImageInput> images;
    int64_t patches = 0;
    for (const ImageGrid& g : grids) {
      px.push_back(random_pixels(g.num_patches() * P));
      patches += g.num_patches();
    }
    for (size_t i = 0; i < grids.size(); ++i) images.push_back({px[i].data(), grids[i]});
    const VisionActivationTerms terms = vision_activation_terms(cfg, patches, DType::kBF16, 2);

    // Pageable uploads, in an arena of exactly the planned peak (BF16: pixels f32 + the cast).
    DeviceBuffer a1 = be.allocate(static_cast<size_t>(terms.peak()), "arena 1").value();
    Arena arena1(a1.data(), a1.size(), be.device(), "arena 1");
    auto plain = (*gm)->encode_images(images, arena1);
    ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
    const int64_t a = static_cast<int64_t>(Arena::kAlignment);
    EXPECT_EQ((static_cast<int64_t>(arena1.high_water()) + a - 1) / a * a, terms.peak());

    // Through pinned staging of exactly the planned size: the same bits.
    DeviceBuffer staging = be.allocate_host(static_cast<size_t>(terms.upload_staging), "staging").value();
    DeviceBuffer a2 = be.allocate(static_cast<size_t>(terms.peak()), "arena 2").value();
    Arena arena2(a2.data(), a2.size(), be.device(), "arena 2");
    for (int round = 0; round < 2; ++round) {  // the second reuses the staging buffer
      arena2.reset();
      auto staged = (*gm)->encode_images(images, arena2, {staging.data(), staging.size()});
      ASSERT_TRUE(staged.is_ok()) << staged.status().to_string();
      EXPECT_TRUE(bytes_of(be, staged->embeds) == bytes_of(be, plain->embeds)) << "round " << round;
      ASSERT_EQ(staged->deepstack.size(), plain->deepstack.size());
      for (size_t j = 0; j < plain->deepstack.size(); ++j)
        EXPECT_TRUE(bytes_of(be, staged->deepstack[j]) == bytes_of(be, plain->deepstack[j])) << j;
    }

    // And close to the CPU oracle, which keeps the pixels in f32.
    DeviceBuffer ca =
        cpu()
            .allocate(static_cast<size_t>(vision_activation_terms(cfg, patches, DType::kF32, 2).peak()), "cpu arena")
            .value();
    Arena carena(ca.data(), ca.size(), cpu().device(), "cpu arena");
    auto ref = (*cm)->encode_images(images, carena);
    ASSERT_TRUE(ref.is_ok());
    EXPECT_TRUE(compare("vision encoder (staged uploads)", std::string(preset) + " 2 images",
                        download(be, plain->embeds), download(cpu(), ref->embeds), tol::kGpuModelLogits));

    // RGB bytes (the server's form) on the device: the same bits as their f32 pixel values, and
    // the arena peaks exactly where the plan's RGB patch stage says.
    std::vector<std::vector<uint8_t>> rgb;
    std::vector<std::vector<float>> rgb_px;
    std::vector<ImageInput> rgb_images, rgb_px_images;
    const VisionConfig& vc = cfg.vision;
    for (const ImageGrid& g : grids) {
      rgb.push_back(random_bytes(g.num_patches() * vc.patch_size * vc.patch_size * 3));
      rgb_px.emplace_back(static_cast<size_t>(g.num_patches() * P));
      image::patchify_into(rgb.back().data(), g.h * vc.patch_size, g.w * vc.patch_size, vc.patch_size,
                           vc.spatial_merge_size, vc.temporal_patch_size, rgb_px.back().data());
    }
    for (size_t i = 0; i < grids.size(); ++i) {
      rgb_images.push_back({nullptr, grids[i], rgb[i].data()});
      rgb_px_images.push_back({rgb_px[i].data(), grids[i]});
    }
    arena2.reset();
    auto from_px = (*gm)->encode_images(rgb_px_images, arena2, {staging.data(), staging.size()});
    ASSERT_TRUE(from_px.is_ok()) << from_px.status().to_string();
    const std::vector<uint8_t> px_bits = bytes_of(be, from_px->embeds);
    DeviceBuffer a3 = be.allocate(static_cast<size_t>(terms.peak()), "arena 3").value();
    Arena arena3(a3.data(), a3.size(), be.device(), "arena 3");
    auto from_rgb = (*gm)->encode_images(rgb_images, arena3, {staging.data(), staging.size()});
    ASSERT_TRUE(from_rgb.is_ok()) << from_rgb.status().to_string();
    EXPECT_TRUE(bytes_of(be, from_rgb->embeds) == px_bits);
    VisionActivationTerms rgb_terms = terms;
    rgb_terms.patch_stage = terms.patch_stage_rgb;
    EXPECT_EQ((static_cast<int64_t>(arena3.high_water()) + a - 1) / a * a, rgb_terms.peak());
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace qvl::test::gpu
