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
#include "io/checkpoint.h"
#include "io/gen_model.h"
#include "memory/activations.h"
#include "model/bind.h"
#include "model/load.h"
#include "model/model.h"
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
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace qvl::test::gpu
